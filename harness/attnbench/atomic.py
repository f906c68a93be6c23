"""Files written whole or not at all: through a temporary file beside the target and a rename.

A kill or a full disk mid-write leaves the old file (or none), never half of one, and no temporary file behind;
an OSError names the file that was being written (a bare `write()` failing with ENOSPC names none).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Callable


def naming(error: OSError, path: Path, instead_of: Path | None = None) -> OSError:
    """`error` with `path` as its file name where it names none (a failed `write()` to an open file) or names
    `instead_of` (the temporary file the user never asked for)."""
    if error.filename is not None and error.filename != (str(instead_of) if instead_of else None):
        return error
    return OSError(error.errno, error.strerror or str(error), str(path))


def write_atomic(path: Path, write: Callable[[Path], None]) -> None:
    """`write(temporary)` writes the whole content to the path it is given; it then replaces `path`."""
    # beside the target (a rename never crosses file systems), hidden, and short enough that any legal target name
    # gives a legal temporary name
    temporary = path.with_name(f".{path.name[:200]}.{os.getpid()}.tmp")
    try:
        write(temporary)
        os.chmod(temporary, 0o666 & ~_umask())  # as an ordinary new file (some writers make theirs 0600)
        os.replace(temporary, path)
    except OSError as error:  # named by the file the user asked for, never the temporary one
        raise naming(error, path, instead_of=temporary) from None
    finally:
        temporary.unlink(missing_ok=True)


def _umask() -> int:
    """The process's file-creation mask (reading it means setting it: set straight back)."""
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def write_text_atomic(path: Path, text: str) -> None:
    write_atomic(path, lambda temporary: temporary.write_text(text))
