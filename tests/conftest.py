from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

# The suite starts hundreds of Python processes (CLI runs, gloo ranks, benchmarks' smoke
# runs) and each xdist worker rewrites every test module's asserts: where the environment
# says not to write bytecode (PYTHONDONTWRITEBYTECODE, as on our CI machines) each of them
# compiled fxpass and the tests from source again (~0.5 s a process, ~9 s of collection a
# worker). The caches go to __pycache__ (gitignored) and are checked against the sources'
# times and sizes as always.
sys.dont_write_bytecode = False
os.environ.pop("PYTHONDONTWRITEBYTECODE", None)

# tests/ for the shared _models, _hf, ...; tests/cli for cli_targets, the graphs and strict
# rules that the CLI tests name on the command line and the rewrite tests import.
sys.path.insert(0, str(Path(__file__).resolve().parent / "cli"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

# Every pipeline run in the tests checks the analyses its passes declare preserved: computed
# again after each pass that changed the graph and compared (fxpass.core.analysis_manager).
os.environ.setdefault("FXPASS_VERIFY_ANALYSES", "1")
# ... and lints the whole graph after every pass that changed it, and the input
# (fxpass.core.run: verify_each="full"; users get the checks over the nodes a pass changed).
os.environ.setdefault("FXPASS_VERIFY_EACH", "full")

import _models  # noqa: E402 (after the bytecode setting above)

#: fixtures that cost minutes to build (gloo worlds, the vLLM environment and its runs, a
#: fresh venv): every test using one runs on the same xdist worker, so it is built once per
#: session instead of once per worker (pyproject's ``--dist loadgroup``); the other worker
#: goes on with the rest of the suite meanwhile.
SHARED_FIXTURE_GROUPS = {
    "world2": "gloo-world2",
    "world4": "gloo-world4",
    "vllm_runs": "vllm",
    "engine_runs": "vllm",
    "torch_only_python": "torch-only-venv",
    "pattern_runs": "executorch-patterns",  # three ExecuTorch lowerings in fresh processes
}


@pytest.hookimpl(tryfirst=True)  # before xdist's own hook reads the groups
def pytest_collection_modifyitems(items) -> None:
    for item in items:
        groups = {SHARED_FIXTURE_GROUPS[f] for f in item.fixturenames if f in SHARED_FIXTURE_GROUPS}
        params = getattr(item, "callspec", None)
        for value in params.params.values() if params else ():
            if isinstance(value, str) and value in SHARED_FIXTURE_GROUPS:  # getfixturevalue
                groups.add(SHARED_FIXTURE_GROUPS[value])
        if len(groups) > 1:
            raise pytest.UsageError(f"{item.nodeid} uses fixtures of two xdist groups: {groups}")
        if groups:
            item.add_marker(pytest.mark.xdist_group(groups.pop()))


def pytest_runtest_setup(item) -> None:
    """On an xdist worker under ``--dist loadgroup``, xdist appends ``@group`` to the id of
    every test in a group, and the scheduler sends one group to one worker by that suffix.
    Where it is missing (a hook order, or a pytest/xdist pair that drops it), every group is
    silently split over the workers and each builds the minutes-long fixtures again: such a
    test fails before its fixtures are built."""
    grouped = getattr(item.config.option, "loadgroup", False)
    if grouped and "@" not in item.nodeid and item.get_closest_marker("xdist_group"):
        pytest.fail(
            f"{item.nodeid} is marked xdist_group but xdist did not group it; check the "
            "pytest and pytest-xdist versions pyproject's test extra allows",
            pytrace=False,
        )


ARTIFACTS = Path(
    os.environ.get("FXPASS_TEST_ARTIFACTS", Path(__file__).parent.parent / "test-artifacts")
)


@pytest.fixture
def llama_ep() -> torch.export.ExportedProgram:
    """A fresh core-ATen ExportedProgram of the 2-layer tiny decoder (asserts kept)."""
    return _models.exported()


@pytest.fixture
def llama_gm() -> torch.fx.GraphModule:
    """A fresh GraphModule of the exported core-ATen 2-layer decoder (asserts kept)."""
    return _models.exported_gm()


@pytest.fixture
def llama_model() -> torch.nn.Module:
    return _models.decoder()


@pytest.fixture(scope="session")
def artifacts_dir() -> Path:
    """Where tests keep files worth looking at after a run (screenshots, reports)."""
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    return ARTIFACTS


@pytest.fixture(scope="session")
def torch_only_python(tmp_path_factory) -> Path:
    """The Python of a fresh virtual environment holding this torch and its dependencies
    only (no fxpass, no numpy, no transformers): a consumer without fxpass. pip installs from
    its local cache and wheels, a minute at most."""
    venv = tmp_path_factory.mktemp("torch-only") / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    python = venv / "bin" / "python"
    version = torch.__version__.split("+")[0]
    proc = subprocess.run(
        [sys.executable, "-m", "pip", "--python", str(python), "install", "-q",
         "--disable-pip-version-check", f"torch=={version}"],
        capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    assert proc.returncode == 0, f"cannot install torch=={version}: {proc.stderr[-2000:]}"
    return python
