"""Running the fxpass command as a user does, and files to run it on."""

from __future__ import annotations

import io
import os
import struct
import subprocess
import sys
import zipfile
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

HERE = Path(__file__).resolve().parent
VERIFY = HERE.parent / "verify"


@dataclass
class Result:
    code: int
    out: str
    err: str


def fxpass(*args: str, cwd: Path, env: dict[str, str] | None = None, timeout: int = 240) -> Result:
    """``fxpass ARGS`` in ``cwd`` as the installed console script runs it (the current folder
    is not on the import path by itself), output piped (not a terminal)."""
    full_env = {k: v for k, v in os.environ.items() if k not in ("FORCE_COLOR", "NO_COLOR")}
    full_env.update(env or {})
    paths = [str(HERE), str(VERIFY), full_env.get("PYTHONPATH", "")]
    full_env["PYTHONPATH"] = os.pathsep.join(p for p in paths if p)
    proc = subprocess.run(
        [sys.executable, str(HERE / "fxpass_script.py"), *args],
        cwd=cwd,
        env=full_env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    result = Result(proc.returncode, proc.stdout, proc.stderr)
    if "FORCE_COLOR" not in full_env:  # piped output: never colour, on stdout or stderr
        assert "\x1b[" not in result.out + result.err, result
    return result


def in_process(args: list[str], capsys, monkeypatch) -> Result:
    """``fxpass ARGS`` run in this process (fast; the output is captured; sys.path restored)."""
    from fxpass.cli import main

    monkeypatch.setattr(sys, "path", list(sys.path))
    with pytest.raises(SystemExit) as exit_:
        main(args)
    captured = capsys.readouterr()
    return Result(exit_.value.code, captured.out, captured.err)


def one_line_error(result: Result) -> str:
    """The error line; asserts it is the only line on stderr and there is no traceback."""
    lines = [ln for ln in result.err.splitlines() if ln.strip()]
    assert "Traceback" not in result.err, result.err
    assert len(lines) == 1, result.err
    assert lines[0].startswith("error: "), result.err
    return lines[0]


class Evil:
    """Unpickling this runs code: it touches a file named in the constructor."""

    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def poisoned_copy(src: Path, dst: Path, marker: Path) -> Path:
    """``src`` (.pt2) with its stored sample inputs replaced by a code-running pickle."""
    buf = io.BytesIO()
    torch.save(Evil(str(marker)), buf)
    with zipfile.ZipFile(src) as zin, zipfile.ZipFile(dst, "w", zipfile.ZIP_STORED) as zout:
        for item in zin.infolist():
            data = zin.read(item.filename)
            if item.filename.endswith("sample_inputs/model.pt"):
                data = buf.getvalue()
            zout.writestr(item, data)
    return dst


def flip_bytes(src: Path, dst: Path, member_suffix: str, n: int) -> str:
    """``src`` with ``n`` bytes flipped inside the data of the member ending with
    ``member_suffix`` (its checksum left as it was, as a bad disk or download leaves it)."""
    raw = bytearray(src.read_bytes())
    with zipfile.ZipFile(src) as zf:
        info = next(i for i in zf.infolist() if i.filename.endswith(member_suffix))
    name_len, extra_len = struct.unpack(
        "<HH", raw[info.header_offset + 26 : info.header_offset + 30]
    )
    start = info.header_offset + 30 + name_len + extra_len
    for i in range(start, start + min(n, info.file_size)):
        raw[i] ^= 0xFF
    dst.write_bytes(bytes(raw))
    return info.filename
