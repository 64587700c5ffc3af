"""docs/architecture.md's promises that a linter does not check: module size, and that the
layer list names every package (lint-imports checks the imports themselves)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "src" / "fxpass"
LIMIT = 600


def test_no_module_is_over_the_limit():
    long = {
        str(p.relative_to(PACKAGE)): n
        for p in PACKAGE.rglob("*.py")
        if (n := len(p.read_text().splitlines())) > LIMIT
    }
    assert not long, f"modules over {LIMIT} lines (split along a real seam): {long}"


def test_the_layer_list_names_every_package_and_the_doc_shows_it():
    pyproject = (ROOT / "pyproject.toml").read_text()
    layers = re.search(r"^layers = \[(.*?)\]", pyproject, re.S | re.M)
    assert layers is not None
    named = set(re.findall(r"\w+", " ".join(re.findall(r'"([^"]+)"', layers.group(1)))))
    packages = {p.name for p in PACKAGE.iterdir() if (p / "__init__.py").exists()}
    assert packages <= named, f"packages missing from the layers: {packages - named}"
    doc = (ROOT / "docs" / "architecture.md").read_text()
    assert all(re.search(rf"^  .*\b{name}\b", doc, re.M) for name in packages)


def test_test_modules_have_unique_basenames():
    # The tests directories are not packages: pytest imports each test file by its basename,
    # and two files with one basename fail collection ("import file mismatch") depending on
    # which worker collects them first.
    seen: dict[str, Path] = {}
    for path in sorted((ROOT / "tests").rglob("test_*.py")):
        other = seen.setdefault(path.name, path)
        assert other == path, f"{path.relative_to(ROOT)} and {other.relative_to(ROOT)}"


#: torch's private attributes that fxpass reads or writes only through fxutil (fx_internals.py,
#: ops.py):
#: a torch upgrade that renames one changes one file.
PRIVATE_TORCH = {"_schema", "_out_spec", "_in_spec", "_modules", "_buffers", "_parameters",
                 "_codegen"}  # fmt: skip


def _private_torch_uses(source: str) -> list[tuple[int, str]]:
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Attribute) and node.attr in PRIVATE_TORCH:
            found.append((node.lineno, node.attr))
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id in ("getattr", "setattr", "hasattr")
            and len(node.args) >= 2
            and isinstance(node.args[1], ast.Constant)
            and node.args[1].value in PRIVATE_TORCH
        ):
            found.append((node.lineno, node.args[1].value))
    return found


def test_private_torch_attributes_are_read_only_in_fxutil():
    outside = {
        f"{p.relative_to(PACKAGE)}:{line}": attr
        for p in sorted(PACKAGE.rglob("*.py"))
        if "fxutil" not in p.relative_to(PACKAGE).parts
        for line, attr in _private_torch_uses(p.read_text())
    }
    assert not outside, (
        f"use the helpers in fxutil/fx_internals.py or fxutil/ops.py instead: {outside}"
    )


def test_the_walk_sees_each_form_of_access():
    planted = "op._schema.name\ngetattr(gm, '_out_spec', None)\ng._codegen = c\nm._modules\n"
    assert sorted(_private_torch_uses(planted)) == [
        (1, "_schema"), (2, "_out_spec"), (3, "_codegen"), (4, "_modules")
    ]  # fmt: skip


def test_module_basenames_are_unique():
    # A module named like another (rewrite/interpret.py beside interpret.py, a distributed
    # rewrite.py beside the rewrite package) reads as the other in tracebacks and imports.
    seen: dict[str, Path] = {}
    for path in sorted((ROOT / "src" / "fxpass").rglob("*.py")):
        if path.name == "__init__.py":
            continue
        other = seen.setdefault(path.name, path)
        assert other == path, f"{path.relative_to(ROOT)} and {other.relative_to(ROOT)}"


# ----- no private attribute of another package is read ----------------------------------------
# The import contract (tools/private_imports.py) keeps private *names* in their package; this
# extends it to attributes: code in one package (a top-level subpackage of fxpass, or a module
# directly in it) does not read ``obj._name`` when ``_name`` is an attribute another package
# defines (stores on an object, or declares in a class body or ``__slots__``) and its own does
# not. Dunder names are not private. The exceptions, in one place, each with why:
ALLOWED_PRIVATE_READS = {
    # torch's own names that an fxpass class happens to define too: ``torch._ops`` (the op
    # classes' module), and an OpOverload's ``_name`` (its qualified name, read where Edge ops
    # are mapped to ATen; fxpass's Editor has a ``_name`` of its own)
    ("*", "_ops"): "torch._ops",
    ("fxutil", "_name"): "OpOverload._name",
}


def _package(path: Path) -> str:
    rel = path.relative_to(PACKAGE).parts
    return rel[0] if len(rel) > 1 else rel[0].removesuffix(".py")


def _private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def _attributes_defined(tree: ast.AST) -> set[str]:
    """The attribute names a module gives objects: stores, class bodies, ``__slots__``."""
    out: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and isinstance(node.ctx, (ast.Store, ast.Del)):
            out.add(node.attr)
        elif isinstance(node, ast.ClassDef):
            for item in node.body:
                if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                    out.add(item.name)
                elif isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name):
                    out.add(item.target.id)
                elif isinstance(item, ast.Assign):
                    names = {t.id for t in item.targets if isinstance(t, ast.Name)}
                    out |= names
                    if "__slots__" in names:
                        out |= {
                            c.value
                            for c in ast.walk(item.value)
                            if isinstance(c, ast.Constant) and isinstance(c.value, str)
                        }
        elif _named_attribute(node, ("setattr",)):
            out.add(node.args[1].value)
    return out


def _named_attribute(node: ast.AST, functions: tuple[str, ...]) -> bool:
    return (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Name)
        and node.func.id in functions
        and len(node.args) >= 2
        and isinstance(node.args[1], ast.Constant)
        and isinstance(node.args[1].value, str)
    )


def _private_reads(tree: ast.AST) -> list[tuple[int, str]]:
    """``obj._name`` and ``getattr(obj, "_name")`` reads of private attributes."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Load):
            if _private(node.attr):
                found.append((node.lineno, node.attr))
        elif _named_attribute(node, ("getattr", "hasattr")) and _private(node.args[1].value):
            found.append((node.lineno, node.args[1].value))
    return found


def _foreign_private_reads(files: dict[str, tuple[str, str]]) -> dict[str, str]:
    """``{"path:line": "_name (defined in pkg)"}`` for ``files`` (path -> (package, source))."""
    defined: dict[str, set[str]] = {}
    reads = []
    for path, (package, source) in files.items():
        tree = ast.parse(source)
        defined.setdefault(package, set()).update(_attributes_defined(tree))
        reads += [(path, package, line, attr) for line, attr in _private_reads(tree)]
    out = {}
    for path, package, line, attr in reads:
        if (
            attr in defined[package]
            or {("*", attr), (package, attr)} & ALLOWED_PRIVATE_READS.keys()
        ):
            continue
        owners = sorted(p for p, names in defined.items() if attr in names)
        if owners:
            out[f"{path}:{line}"] = f"{attr} (defined in {', '.join(owners)})"
    return out


def test_no_private_attribute_of_another_package_is_read():
    files = {
        str(p.relative_to(PACKAGE)): (_package(p), p.read_text())
        for p in sorted(PACKAGE.rglob("*.py"))
    }
    foreign = _foreign_private_reads(files)
    assert not foreign, (
        "make what another package needs public (a property, a method) instead of reading "
        f"its private attribute: {foreign}"
    )


def test_the_attribute_check_finds_a_foreign_read_and_allows_its_own():
    files = {
        "a/x.py": ("a", "class A:\n    __slots__ = ('_slot',)\n    def _m(self): ...\n"),
        "a/y.py": (
            "a",
            "def f(o):\n    o._own = o._ops = 1\n    return o._own, o._m(), o._torchs\n",
        ),
        "b/z.py": (
            "b",
            "def g(o):\n    o._m\n    getattr(o, '_slot')\n    o._own\n    o.__dict__\n",
        ),
        "c.py": ("c", "def h(o):\n    o._ops\n"),  # allowed: torch's
    }
    assert _foreign_private_reads(files) == {
        "b/z.py:2": "_m (defined in a)",
        "b/z.py:3": "_slot (defined in a)",
        "b/z.py:4": "_own (defined in a)",
    }
