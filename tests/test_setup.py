"""The set-up contract: the README's commands are what CI runs."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _readme_commands() -> list[str]:
    return re.findall(r"^```bash\n(.*?)\n```", (ROOT / "README.md").read_text(), re.S | re.M)


def test_readme_opens_with_the_demo_and_the_test_commands():
    demo, test = _readme_commands()[:2]
    assert "pip install torch==2.13.0" in demo and demo.endswith("fxpass demo")
    assert "pip install torch==2.13.0" in test and "pytest" in test
    assert "ruff check" in test and "ruff format --check" in test
    assert "lint-imports" in test  # the layers of docs/architecture.md, enforced


def test_ci_runs_the_readme_test_command():
    test = _readme_commands()[1]
    assert test in (ROOT / ".ci" / "run").read_text().splitlines()


def test_package_requirement_is_the_tested_range_and_dev_installs_pin_its_oldest_end():
    from fxpass._supported_torch import NEWEST, OLDEST

    pyproject = (ROOT / "pyproject.toml").read_text()
    oldest, after = f"{OLDEST[0]}.{OLDEST[1]}", f"{NEWEST[0]}.{NEWEST[1] + 1}"
    assert f'"torch>={oldest},<{after}"' in pyproject
    for command in _readme_commands()[:2]:
        assert f"torch=={oldest}.0" in command
    job = (ROOT / ".ci" / "torch-range").read_text()  # the newest end has its own job
    assert f'version="${{1:-{NEWEST[0]}.{NEWEST[1]}.' in job


def test_numpy_is_a_dependency_so_torch_imports_without_a_warning():
    """torch warns "Failed to initialize NumPy" at import when numpy is missing, and
    `import fxpass` imports torch before any command could filter it: depend on numpy."""
    deps = re.search(
        r"^dependencies = \[(.*?)\]", (ROOT / "pyproject.toml").read_text(), re.S | re.M
    )
    assert deps is not None and re.search(r'^\s*"numpy>=', deps.group(1), re.M)


def test_install_lines_in_the_docs_name_what_exists():
    """fxpass is not on a package index: every ``pip install`` line installs from the checkout
    (``-e .``, ``-e '.[extra]'`` with an extra pyproject.toml declares) or a built wheel."""
    pyproject = (ROOT / "pyproject.toml").read_text()
    extras = set(re.findall(r"^(\w+) = \[", pyproject.split("[project.optional-dependencies]")[1]
                            .split("\n[")[0], re.M))  # fmt: skip
    docs = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    for path in docs:
        for line in re.findall(r"pip install[^\n`]*", path.read_text()):
            assert "'fxpass[" not in line and not re.search(r"install fxpass\b", line), (
                f"{path.name}: {line!r} installs fxpass from an index it is not on"
            )
            for extra in re.findall(r"'\.\[(\w+)\]'", line):
                assert extra in extras, f"{path.name}: {line!r}: no extra {extra!r}"


def test_a_built_wheel_installs_beside_torch_and_plugs_into_it(torch_only_python, tmp_path):
    """On a machine with torch only: the wheel (with its torch plug-in module) and the
    dependencies its metadata names install, the command runs, and a fused program loads
    with plain torch.export.load before anything imports fxpass."""
    import subprocess
    import sys
    import zipfile

    import torch

    import fxpass as fp

    dist = tmp_path / "dist"
    build = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation",
         "-w", str(dist), str(ROOT)],
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert build.returncode == 0, build.stderr[-2000:]
    (wheel,) = dist.glob("fxpass-*.whl")
    with zipfile.ZipFile(wheel) as zf:
        names = zf.namelist()
        meta = zf.read(next(n for n in names if n.endswith("dist-info/METADATA"))).decode()
        entry_points = zf.read(next(n for n in names if n.endswith("entry_points.txt"))).decode()
    assert "fxpass_autoload.py" in names and "fxpass/py.typed" in names
    assert "[torch.backends]" in entry_points and "fxpass_autoload:install" in entry_points
    assert "Provides-Extra: executorch" in meta
    needs = re.findall(r"^Requires-Dist: ([^;\n]+)$", meta, re.M)  # no extra: always needed
    site = tmp_path / "site"
    others = [n.replace(" ", "") for n in needs if not n.startswith("torch")]
    pip = [sys.executable, "-m", "pip", "--python", str(torch_only_python), "install", "-q"]
    for what in (["--no-deps", str(wheel)], others):  # torch is there: the rest with theirs
        install = subprocess.run([*pip, "--target", str(site), *what], capture_output=True,
                                 text=True, timeout=600)  # fmt: skip
        assert install.returncode == 0, install.stderr[-2000:]
    program = tmp_path / "fused.pt2"
    ep = torch.export.export(torch.nn.RMSNorm(8, eps=1e-6), (torch.randn(2, 8),))
    fused = fp.apply(ep.run_decompositions(), "fuse_rmsnorm").program
    assert any("fxpass" in str(n.target) for n in fused.graph.nodes)
    torch.export.save(fused, program)
    env = {"PYTHONPATH": str(site), "PATH": "/usr/bin:/bin"}
    check = (
        "import sys, torch\n"
        "ep = torch.export.load(sys.argv[1])\n"
        "print(ep.module()(torch.ones(2, 8)).shape, 'fxpass' in sys.modules)\n"
    )
    run = subprocess.run([str(torch_only_python), "-c", check, str(program)], env=env,
                         capture_output=True, text=True, timeout=240)  # fmt: skip
    assert run.returncode == 0, run.stderr[-2000:]
    assert run.stdout.strip() == "torch.Size([2, 8]) True"
    version = subprocess.run([str(torch_only_python), "-m", "fxpass", "--version"], env=env,
                             capture_output=True, text=True, timeout=240)  # fmt: skip
    assert version.returncode == 0 and fp.__version__ in version.stdout, version.stderr
