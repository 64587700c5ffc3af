"""The import-linter contract that keeps private names inside their package
(tools/private_imports.py), run on a small package with planted violations."""

from __future__ import annotations

import sys
import textwrap
from pathlib import Path

import grimp
import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from tools.private_imports import PrivateImportsContract, owner, private_imports  # noqa: E402

FILES = {
    "__init__.py": "from ._root import VERSION\n",  # the container's own private module: fine
    "_root.py": "VERSION = 1\n",
    "a/__init__.py": "",
    "a/_impl.py": "def helper():\n    return 1\n",
    "a/mod.py": """
        from ._impl import helper  # within one package: fine


        def public():
            return helper()


        def _secret():
            return 2
    """,
    "b/__init__.py": "",
    "b/_own.py": "X = 1\n",
    "b/user.py": """
        import planted.a.mod  # a public module: fine

        from .. import _root  # the container's private module, from another package
        from ..a._impl import helper  # a private module of another package
        from ..a.mod import (
            public,
            _secret,  # a private name, on a later line of the statement
        )
        from ._own import X  # within one package: fine


        def late():
            from ..a.mod import _secret as s  # inside a function counts too

            return s
    """,
}


@pytest.fixture(scope="module")
def planted(tmp_path_factory) -> tuple[grimp.ImportGraph, Path]:
    base = tmp_path_factory.mktemp("planted")
    for rel, text in FILES.items():
        path = base / "planted" / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text))
    sys.path.insert(0, str(base))
    try:
        yield grimp.build_graph("planted", cache_dir=None), base / "planted"
    finally:
        sys.path.remove(str(base))


def test_every_planted_violation_is_found_and_nothing_else(planted):
    graph, root = planted
    found = {
        (f["importer"], f["imported"], f["line_number"])
        for f in private_imports(graph, "planted", root)
    }
    assert found == {
        ("planted.b.user", "planted._root", 4),
        ("planted.b.user", "planted.a._impl", 5),
        ("planted.b.user", "planted.a.mod:_secret", 6),
        ("planted.b.user", "planted.a.mod:_secret", 14),
    }


def test_the_contract_breaks_on_them_and_names_the_line(planted):
    graph, _ = planted
    contract = PrivateImportsContract("private", {}, {"containers": ["planted"]})
    check = contract.check(graph, verbose=False)
    assert not check.kept
    lines = {f["line_contents"].strip() for f in check.metadata["found"]}
    assert "from ..a._impl import helper  # a private module of another package" in lines


def test_packages_of_a_container():
    assert owner("fxpass.core.pass_registry", "fxpass") == "fxpass.core"
    assert owner("fxpass.interpret", "fxpass") == "fxpass.interpret"
    assert owner("fxpass._supported_torch", "fxpass") == "fxpass"
    assert owner("fxpass", "fxpass") == "fxpass"
