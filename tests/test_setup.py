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


def test_package_requirement_is_a_range_and_dev_installs_pin_torch():
    pyproject = (ROOT / "pyproject.toml").read_text()
    assert '"torch>=2.6"' in pyproject
    for command in _readme_commands()[:2]:
        assert "torch==2.13.0" in command


def test_numpy_is_a_dependency_so_torch_imports_without_a_warning():
    """torch warns "Failed to initialize NumPy" at import when numpy is missing, and
    `import fxpass` imports torch before any command could filter it: depend on numpy."""
    deps = re.search(
        r"^dependencies = \[(.*?)\]", (ROOT / "pyproject.toml").read_text(), re.S | re.M
    )
    assert deps is not None and re.search(r'^\s*"numpy>=', deps.group(1), re.M)
