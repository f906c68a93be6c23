"""Files written whole or not at all: through a temporary file beside the target and a rename.

A kill or a full disk mid-write leaves the old file (or none), never half of one, and no temporary file behind;
an OSError names the file that was being written (a bare `write()` failing with ENOSPC names none).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Callable


def naming(error: OSError, path: Path) -> OSError:
    """`error` with `path` as its file name where it names none (a failed `write()` to an open file)."""
    if error.filename is not None:
        return error
    return OSError(error.errno, error.strerror or str(error), str(path))


def write_atomic(path: Path, write: Callable[[Path], None]) -> None:
    """`write(temporary)` writes the whole content to the path it is given; it then replaces `path`."""
    temporary = path.with_name(path.name + ".tmp")
    try:
        write(temporary)
        os.replace(temporary, path)
    except OSError as error:
        raise naming(error, path) from None
    finally:
        temporary.unlink(missing_ok=True)


def write_text_atomic(path: Path, text: str) -> None:
    write_atomic(path, lambda temporary: temporary.write_text(text))
