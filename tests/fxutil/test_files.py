"""One atomic file write: the whole new file or the old one, and never a temporary file left
behind."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

from fxpass.fxutil.files import write_atomic

SRC = Path(__file__).resolve().parents[2] / "src" / "fxpass"


def test_text_bytes_and_a_writer_function_each_write_the_whole_file(tmp_path):
    assert write_atomic(tmp_path / "a.txt", "héllo\n") == tmp_path / "a.txt"
    assert (tmp_path / "a.txt").read_text(encoding="utf-8") == "héllo\n"
    write_atomic(tmp_path / "b.bin", b"\x00\x01")
    assert (tmp_path / "b.bin").read_bytes() == b"\x00\x01"
    seen = []
    write_atomic(tmp_path / "c.pt2", lambda tmp: seen.append(tmp) or Path(tmp).write_text("x"))
    assert seen[0].endswith(".pt2") and Path(seen[0]).parent == tmp_path  # torch.export.save
    assert (tmp_path / "c.pt2").read_text() == "x"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.txt", "b.bin", "c.pt2"]


@pytest.mark.parametrize("failure", [ValueError("disk full"), KeyboardInterrupt()])
def test_a_failed_write_leaves_the_old_file_and_no_temporary_file(tmp_path, failure):
    target = tmp_path / "report.json"
    target.write_text("old")

    def write(tmp: str) -> None:
        Path(tmp).write_text("half of the new")
        raise failure

    with pytest.raises(type(failure)):
        write_atomic(target, write)
    assert target.read_text() == "old"
    assert [p.name for p in tmp_path.iterdir()] == ["report.json"]


def test_a_rename_that_fails_leaves_no_temporary_file(tmp_path):
    (tmp_path / "taken").mkdir()
    with pytest.raises(OSError):
        write_atomic(tmp_path / "taken", "text")  # a folder is in the way
    assert [p.name for p in tmp_path.iterdir()] == ["taken"]


def test_the_file_gets_the_permissions_of_a_new_file(tmp_path):
    old = os.umask(0o027)
    try:
        write_atomic(tmp_path / "a.txt", "x")
    finally:
        os.umask(old)
    assert (tmp_path / "a.txt").stat().st_mode & 0o777 == 0o640  # not mkstemp's 0o600


def test_no_other_module_writes_files_by_renaming_its_own_temporary_file():
    pattern = re.compile(r"os\.replace\(|mkstemp\(|NamedTemporaryFile\(")
    others = [
        str(p.relative_to(SRC))
        for p in SRC.rglob("*.py")
        if p.name != "files.py" and pattern.search(p.read_text())
    ]
    assert not others, f"write files with fxpass.fxutil.files.write_atomic: {others}"
