"""Hostile and malformed .pt2 archives: loading never runs their code, and every fault is one
Pt2Error line naming the member.

Each hostile case plants a payload that would write a marker file if anything evaluated,
unpickled or dlopen'ed it; the test proves the marker never appears (also after building and
calling ``ep.module()``, where torch runs a program's guards) and that the load is refused.
The archives are real ``torch.export.save`` files with dynamic shapes, rewritten member by
member."""

from __future__ import annotations

import collections
import io
import json
import pickle
import shutil
import subprocess
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from torch.export import Dim

from fxpass.targets._pt2_grammar import ExpressionError, guard_expression, sympy_expression
from fxpass.targets.pt2 import Pt2Error, load


class Derived(torch.nn.Module):
    """A named dim with a range and a derived dim (2*d + 1)."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(4, 4)

    def forward(self, x, y):
        return self.lin(x).sum() + y.sum(), torch.cat([x[:, 0], y[:, 0]])


class Arithmetic(torch.nn.Module):
    """Sizes through //, %, ceil-division, max, pow, data-dependent sizes, float sizes, guards."""

    def forward(self, x, y):
        n = x.shape[0]
        r = x.new_zeros(n // 2 + 1, n % 3 + 1, -(-n // 4)).sum() + x.new_zeros(max(n, 5)).sum()
        r2 = x.reshape(-1)[: n * 3 // 2].sum()
        u = y.sum().item()
        torch._check(u >= 0)
        return (
            r + r2 + y.nonzero().shape[0] * 2.0 + x.shape[0] / 3,
            torch.zeros(u),
            x.new_ones(n**2).sum(),
            x.new_ones(y.shape[0] - x.shape[0]),
        )


@pytest.fixture(scope="session")
def saved(tmp_path_factory) -> dict[str, Path]:
    """derived.pt2 (named and derived dims) and arithmetic.pt2 (every kind of expression)."""
    folder = tmp_path_factory.mktemp("hostile")
    torch.manual_seed(0)
    d = Dim("d", min=3, max=100)
    derived = torch.export.export(
        Derived(),
        (torch.randn(6, 4), torch.randn(13, 4)),
        dynamic_shapes={"x": {0: d}, "y": {0: 2 * d + 1}},
    )
    arithmetic = torch.export.export(
        Arithmetic(),
        (torch.randn(6, 4), torch.ones(13, dtype=torch.int64)),
        dynamic_shapes={"x": {0: Dim.AUTO}, "y": {0: Dim.AUTO}},
        strict=False,
    )
    paths = {"derived": folder / "derived.pt2", "arithmetic": folder / "arithmetic.pt2"}
    torch.export.save(derived, paths["derived"])
    torch.export.save(arithmetic, paths["arithmetic"])
    return paths


@pytest.fixture
def marker(tmp_path: Path) -> Path:
    return tmp_path / "ran"


def touch(marker: Path) -> str:
    return f"__import__('pathlib').Path({str(marker)!r}).touch()"


class Touch:
    """Unpickling this writes the marker."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> Any:
        return (exec, (touch(self.marker),))


def members(path: Path) -> dict[str, bytes]:
    with zipfile.ZipFile(path) as zf:
        return {info.filename: zf.read(info) for info in zf.infolist()}


def write(path: Path, items: list[tuple[str, bytes]]) -> Path:
    with zipfile.ZipFile(path, "w") as zf:
        for name, body in items:
            zf.writestr(name, body)
    return path


def rewrite(
    src: Path,
    dst: Path,
    edit: Callable[[str, bytes], bytes | None] = lambda _n, b: b,
    add: dict[str, bytes] | None = None,
) -> Path:
    """``src`` with each member through ``edit`` (the name without the archive's folder;
    None drops it) and the members ``add`` appended."""
    old = members(src)
    folder = next(iter(old)).split("/", 1)[0]
    items = []
    for name, body in old.items():
        new = edit(name.split("/", 1)[1], body)
        if new is not None:
            items.append((name, new))
    items += [(f"{folder}/{name}", body) for name, body in (add or {}).items()]
    return write(dst, items)


def edit_json(member: str, change: Callable[[Any], Any]) -> Callable[[str, bytes], bytes]:
    def edit(name: str, body: bytes) -> bytes:
        if name != member:
            return body
        tree = json.loads(body)
        return json.dumps(change(tree) or tree).encode()

    return edit


def refused(path: Path, marker: Path, member: str | None = None) -> Pt2Error:
    """Loading ``path`` raises one Pt2Error line (naming ``member``) and writes no marker."""
    with pytest.raises(Pt2Error) as err:
        load(path)
    assert not marker.exists(), f"loading {path.name} ran its payload"
    text = str(err.value)
    assert "\n" not in text and len(text) < 1000, text
    if member is not None:
        assert err.value.member is not None and err.value.member.endswith(member), text
        assert member in text, text
    return err.value


# ----- the grammar on real exports -------------------------------------------------------------
def expressions(path: Path) -> tuple[list[str], list[str], list[str]]:
    """Every expr_str, range-constraint key and guard in the programs of ``path``."""
    found: tuple[list[str], list[str], list[str]] = ([], [], [])
    for name, body in members(path).items():
        if "/models/" not in name:
            continue
        program = json.loads(body)
        stack = [program]
        while stack:
            node = stack.pop()
            if isinstance(node, dict):
                if "expr_str" in node:
                    found[0].append(node["expr_str"])
                stack.extend(node.values())
            elif isinstance(node, list):
                stack.extend(node)
        found[1].extend(program["range_constraints"])
        found[2].extend(program["guards_code"])
    return found


def test_real_exports_with_dynamic_shapes_pass_the_grammar_and_load(saved):
    kinds = set()
    for path in saved.values():
        exprs, ranges, guards = expressions(path)
        for text in exprs + ranges:
            sympy_expression(text)
        for text in guards:
            guard_expression(text)
        kinds |= {name for text in exprs for name in ("FloorDiv", "Mod", "Max", "IntTrueDiv")}
        ep = load(path)
        assert ep.range_constraints
    exprs, ranges, guards = expressions(saved["derived"])
    assert "2*s77 + 1" in ranges or any("+ 1" in r for r in ranges), ranges  # the derived dim
    exprs, ranges, guards = expressions(saved["arithmetic"])
    for name in ("FloorDiv", "Mod", "Max", "IntTrueDiv", "ToFloat", "GreaterThan", "Pow"):
        assert any(name in text for text in exprs), name
    assert guards and any("//" in g for g in guards), guards


@pytest.mark.parametrize(
    "text",
    [
        "__import__('os').system('true')",
        "(lambda: 1)()",
        "s0.__class__",
        "Symbol('s0').func.__globals__",
        "Symbol('__import__')",
        "getattr(s0, 'x')",
        "[s0 for s0 in (1,)]",
        "f'{s0}'",
        "s0 # comment",
        "Integer(2)**Integer(100000000)",
        "Symbol('s0', foo=True)",
        "Float('1', precision=__import__('os'))",
        "Max(s0, open('x'))",
        "9" * 500,
        "\u0455" + "0",  # a Cyrillic letter that looks like s
    ],
)
def test_the_sympy_grammar_refuses(text):
    with pytest.raises(ExpressionError):
        sympy_expression(text)


@pytest.mark.parametrize(
    "text",
    [
        "__import__('os').system('true') == 0",
        "L['x'].__class__",
        "L['x'].size()[0] == L['x'].item()",
        "math.floor(x=1)",
        "torch.load('f')",
        "open('f')",
        "L['a\"b'].size()[0] == 1",
        "L['x'].size(__import__('os'))[0] == 1",
        "(lambda: 1)() == 1",
    ],
)
def test_the_guard_grammar_refuses(text):
    with pytest.raises(ExpressionError):
        guard_expression(text)


# ----- hostile expressions ---------------------------------------------------------------------
PAYLOADS = {
    "call": lambda m: touch(m),
    "import": lambda m: f"__import__('os').system('touch {m}')",
    "lambda": lambda m: f"(lambda: {touch(m)})()",
    "attribute": lambda m: (
        f"Symbol('s77').func.__init__.__globals__['__builtins__']['exec']({touch(m)!r})"
    ),
    "inside": lambda m: f"Add(Symbol('s77', positive=True, integer=True), {touch(m)} or 1)",
}


def _first(tree: Any, kind: str) -> dict[str, Any]:
    """The first SymExpr holder of ``kind`` in the program's graph."""
    graph = tree["graph_module"]["graph"]
    if kind == "size":
        return next(
            s["as_expr"]
            for v in graph["tensor_values"].values()
            for s in v["sizes"]
            if "as_expr" in s
        )
    if kind == "stride":
        return next(
            s["as_expr"]
            for v in graph["tensor_values"].values()
            for s in v["strides"]
            if "as_expr" in s
        )
    table = {"sym_int": "sym_int_values", "sym_float": "sym_float_values"}[kind]
    return next(iter(graph[table].values()))["as_expr"]


@pytest.mark.parametrize("payload", sorted(PAYLOADS))
@pytest.mark.parametrize("kind", ["size", "stride", "sym_int", "sym_float"])
def test_a_symbolic_expression_that_runs_code_is_refused(saved, tmp_path, marker, payload, kind):
    text = PAYLOADS[payload](marker)

    def change(tree):
        _first(tree, kind)["expr_str"] = text

    bad = rewrite(saved["arithmetic"], tmp_path / "bad.pt2", edit_json("models/model.json", change))
    err = refused(bad, marker, "models/model.json")
    assert err.unsafe and "symbolic expression" in str(err)


@pytest.mark.parametrize("payload", sorted(PAYLOADS))
def test_a_range_constraint_that_runs_code_is_refused(saved, tmp_path, marker, payload):
    def change(tree):
        tree["range_constraints"][PAYLOADS[payload](marker)] = {"min_val": 2, "max_val": 9}

    bad = rewrite(saved["derived"], tmp_path / "bad.pt2", edit_json("models/model.json", change))
    assert refused(bad, marker, "models/model.json").unsafe


def test_a_range_bound_that_is_not_a_number_is_refused(saved, tmp_path, marker):
    def change(tree):
        next(iter(tree["range_constraints"].values()))["min_val"] = touch(marker)

    bad = rewrite(saved["derived"], tmp_path / "bad.pt2", edit_json("models/model.json", change))
    assert "min_val" in str(refused(bad, marker, "models/model.json"))


@pytest.mark.parametrize("payload", sorted(PAYLOADS))
def test_a_guard_that_runs_code_is_refused(saved, tmp_path, marker, payload):
    """Before: the guard was pasted into the function ``ep.module()`` builds, and ran on the
    first call."""

    def change(tree):
        tree["guards_code"].append(f"({PAYLOADS[payload](marker)}) or 1 == 1")

    bad = rewrite(saved["derived"], tmp_path / "bad.pt2", edit_json("models/model.json", change))
    assert refused(bad, marker, "models/model.json").unsafe


def test_the_programs_that_load_run_their_guards_harmlessly(saved, marker):
    ep = load(saved["arithmetic"])
    ep.module()(*ep.example_inputs[0])
    assert not marker.exists()


# ----- native code -----------------------------------------------------------------------------
@pytest.fixture(scope="session")
def constructor_library(tmp_path_factory) -> tuple[bytes, Path]:
    """A shared library whose constructor writes a marker file when it is loaded."""
    compiler = shutil.which("gcc") or shutil.which("cc")
    if compiler is None:
        pytest.skip("no C compiler (gcc or cc) to build the hostile shared library")
    folder = tmp_path_factory.mktemp("native")
    marker = folder / "constructor-ran"
    (folder / "boom.c").write_text(
        "#include <stdio.h>\n"
        "__attribute__((constructor)) static void boom(void) {\n"
        f'  FILE *f = fopen("{marker}", "w"); if (f) fclose(f);\n'
        "}\n"
    )
    subprocess.run(
        [compiler, "-shared", "-fPIC", "-o", str(folder / "boom.so"), str(folder / "boom.c")],
        check=True,
        capture_output=True,
    )
    return (folder / "boom.so").read_bytes(), marker


def test_an_aotinductor_library_is_never_loaded(saved, tmp_path, constructor_library):
    """Before: torch extracted model.wrapper.so and dlopen'ed it (its constructor ran) before
    the load failed."""
    library, marker = constructor_library
    marker.unlink(missing_ok=True)
    meta = json.dumps({"AOTI_DEVICE_KEY": "cpu"}).encode()
    bad = rewrite(
        saved["derived"],
        tmp_path / "aoti.pt2",
        add={
            "data/aotinductor/model/model.wrapper.so": library,
            "data/aotinductor/model/model.wrapper_metadata.json": meta,
            "data/aotinductor/model/model.wrapper.cpp": b"",
        },
    )
    err = refused(bad, marker, "data/aotinductor/model/model.wrapper.so")
    assert err.unsafe and "AOTInductor package" in str(err)
    assert "torch._inductor.aoti_load_package" in str(err)


@pytest.mark.parametrize("name", ["extra/helper.so", "data/weights/kernel.cubin", "x.dylib"])
def test_a_native_library_anywhere_is_refused(saved, tmp_path, name, constructor_library):
    library, marker = constructor_library
    marker.unlink(missing_ok=True)
    bad = rewrite(saved["derived"], tmp_path / "native.pt2", add={name: library})
    assert refused(bad, marker, name).unsafe


# ----- pickles ---------------------------------------------------------------------------------
def _torch_saved(obj: Any) -> bytes:
    buffer = io.BytesIO()
    torch.save(obj, buffer)
    return buffer.getvalue()


def _with_constant(path_name: str, body: bytes) -> tuple[Callable, dict[str, bytes]]:
    entry = {"path_name": path_name, "is_param": False, "use_pickle": True, "tensor_meta": None}
    edit = edit_json(
        "data/constants/model_constants_config.json",
        lambda tree: tree["config"].__setitem__("hostile", entry),
    )
    return edit, {f"data/constants/{path_name}": body}


@pytest.mark.parametrize(
    "where", ["sample_inputs", "sample_inputs_zip", "weight", "tensor", "opaque", "custom"]
)
def test_a_pickle_that_runs_code_is_refused(saved, tmp_path, marker, where):
    payload = pickle.dumps(Touch(marker))
    add: dict[str, bytes] = {}
    if where.startswith("sample_inputs"):
        body = _torch_saved(((Touch(marker),), {})) if where.endswith("zip") else payload
        member = "data/sample_inputs/model.pt"

        def edit(name, old):
            return body if name == member else old
    elif where == "weight":
        member = "data/weights/weight_0"

        def edit(name, old):
            if name == "data/weights/model_weights_config.json":
                tree = json.loads(old)
                tree["config"]["lin.weight"]["use_pickle"] = True
                return json.dumps(tree).encode()
            return _torch_saved({"w": Touch(marker)}) if name == member else old
    else:
        path_name = {"tensor": "tensor_0", "opaque": "opaque_obj_0", "custom": "custom_obj_0"}
        member = f"data/constants/{path_name[where]}"
        edit, add = _with_constant(path_name[where], payload)
    bad = rewrite(saved["derived"], tmp_path / "pickle.pt2", edit, add)
    err = refused(bad, marker, member)
    assert err.unsafe and "pickled Python objects" in str(err)


# ----- malformed archives: one Pt2Error line naming the member ---------------------------------
def _deep(depth: int) -> bytes:
    return ("[" * depth + "]" * depth).encode()


def _set(path: list, value: Any) -> Callable[[Any], None]:
    def change(tree):
        node = tree
        for key in path[:-1]:
            node = node[key]
        node[path[-1]] = value

    return change


MALFORMED: dict[str, tuple[Callable[[str, bytes], bytes | None], str]] = {
    "program not JSON": (
        lambda n, b: b[:-5] if n == "models/model.json" else b,
        "models/model.json",
    ),
    "program not UTF-8": (
        lambda n, b: b.replace(b'"graph"', b'"gr\xff\xfeh"') if n == "models/model.json" else b,
        "models/model.json",
    ),
    "program 10,000 deep": (
        lambda n, b: _deep(10_000) if n == "models/model.json" else b,
        "models/model.json",
    ),
    "a field 10,000 deep": (
        lambda n, b: (
            b.replace(b'"guards_code": [', b'"guards_code": [' + _deep(10_000) + b",")
            if n == "models/model.json"
            else b
        ),
        "models/model.json",
    ),
    "program a list": (lambda n, b: b"[]" if n == "models/model.json" else b, "models/model.json"),
    "nodes a string": (
        edit_json("models/model.json", _set(["graph_module", "graph", "nodes"], "x")),
        "models/model.json",
    ),
    "a node an int": (
        edit_json("models/model.json", _set(["graph_module", "graph", "nodes", 0], 7)),
        "models/model.json",
    ),
    "signature missing": (
        edit_json("models/model.json", lambda t: t["graph_module"].pop("signature")),
        "models/model.json",
    ),
    "range constraints a list": (
        edit_json("models/model.json", _set(["range_constraints"], [1])),
        "models/model.json",
    ),
    "expression a number": (
        edit_json(
            "models/model.json",
            lambda t: _first(t, "size").__setitem__("expr_str", 7),
        ),
        "models/model.json",
    ),
    "weights config not JSON": (
        lambda n, b: b"{" if n == "data/weights/model_weights_config.json" else b,
        "data/weights/model_weights_config.json",
    ),
    "weight entry a string": (
        edit_json("data/weights/model_weights_config.json", _set(["config", "lin.weight"], "x")),
        "data/weights/model_weights_config.json",
    ),
    "weight dtype unknown": (
        edit_json(
            "data/weights/model_weights_config.json",
            _set(["config", "lin.weight", "tensor_meta", "dtype"], 999),
        ),
        "data/weights/model_weights_config.json",
    ),
    "weights config dropped": (
        lambda n, b: None if n == "data/weights/model_weights_config.json" else b,
        "data/weights/model_weights_config.json",
    ),
    "sample inputs dropped": (
        lambda n, b: None if n == "data/sample_inputs/model.pt" else b,
        "data/sample_inputs/model.pt",
    ),
    "sample inputs garbage": (
        lambda n, b: b"not a pickle" if n == "data/sample_inputs/model.pt" else b,
        "data/sample_inputs/model.pt",
    ),
    "archive_version dropped": (
        lambda n, b: None if n == "archive_version" else b,
        "archive_version",
    ),
    "archive_version wrong": (
        lambda n, b: b"9" if n == "archive_version" else b,
        "archive_version",
    ),
    "extra file not UTF-8": (lambda n, b: b, "extra/notes.txt"),
}


@pytest.mark.parametrize("case", sorted(MALFORMED))
def test_a_malformed_archive_is_one_pt2error_naming_the_member(saved, tmp_path, marker, case):
    edit, member = MALFORMED[case]
    add = {"extra/notes.txt": b"\xff\xfe\xfd"} if case == "extra file not UTF-8" else None
    bad = rewrite(saved["derived"], tmp_path / "bad.pt2", edit, add)
    refused(bad, marker, member)


def test_a_duplicate_member_is_refused(saved, tmp_path, marker):
    items = list(members(saved["derived"]).items())
    name, body = next((n, b) for n, b in items if n.endswith("models/model.json"))
    with pytest.warns(UserWarning, match="Duplicate name"):
        bad = write(tmp_path / "dup.pt2", [*items, (name, body.replace(b"s77", b"s78"))])
    assert "appears 2 times" in str(refused(bad, marker, "models/model.json"))


@pytest.mark.parametrize("keep", [0.1, 0.5, 0.99])
def test_a_truncated_archive_is_refused(saved, tmp_path, marker, keep):
    data = saved["derived"].read_bytes()
    bad = tmp_path / "cut.pt2"
    bad.write_bytes(data[: int(len(data) * keep)])
    refused(bad, marker)


def test_a_member_outside_the_archive_folder_is_refused(saved, tmp_path, marker):
    bad = rewrite(saved["derived"], tmp_path / "out.pt2")
    with zipfile.ZipFile(bad, "a") as zf:
        zf.writestr("elsewhere/models/model.json", b"{}")
    refused(bad, marker, "elsewhere/models/model.json")


def test_not_a_zip_file(tmp_path, marker):
    bad = tmp_path / "text.pt2"
    bad.write_text("hello")
    assert "not a zip file" in str(refused(bad, marker))


# ----- names and constant inputs that torch writes into Python source --------------------------
class Modal(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(3, 3)

    def forward(self, x, mode: str, k: int):
        return self.lin(x) * k if mode == "a" else x


@pytest.fixture(scope="session")
def modal(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("modal") / "modal.pt2"
    torch.export.save(torch.export.export(Modal(), (torch.randn(2, 3), "a", 3)), path)
    return path


def _constant_input(kind: str, value: Callable[[Path], Any]) -> Callable[[Any, Path], None]:
    def change(tree, marker):
        for entry in tree["graph_module"]["graph"]["inputs"]:
            if kind in entry:
                entry[kind] = value(marker)

    return change


NAMES = {
    # Before: the string became the guard ``L['mode'] == '...'`` that ``ep.module()`` pastes
    # into Python, and the first call ran it.
    "string input": _constant_input("as_string", lambda m: f"a' == '' or {touch(m)} or '"),
    "int input a string": _constant_input("as_int", lambda m: f"' or {touch(m)} or '"),
    "argument name": lambda t, m: t["graph_module"]["module_call_graph"][0][
        "signature"
    ].__setitem__("forward_arg_names", [f"x={touch(m)}", "mode", "k"]),
    "parameter name": lambda t, m: next(
        s["parameter"] for s in t["graph_module"]["signature"]["input_specs"] if "parameter" in s
    ).__setitem__("parameter_name", 'lin.w"), getattr(__import__("os"), "system")("true'),
}


@pytest.mark.parametrize("case", sorted(NAMES))
def test_a_name_or_constant_input_that_would_be_python_is_refused(modal, tmp_path, marker, case):
    bad = rewrite(
        modal,
        tmp_path / "bad.pt2",
        edit_json("models/model.json", lambda tree: NAMES[case](tree, marker)),
    )
    assert refused(bad, marker, "models/model.json").unsafe


def test_plain_constant_inputs_load_and_run(modal, marker):
    ep = load(modal)
    x = torch.randn(2, 3)
    weight, bias = ep.state_dict["lin.weight"], ep.state_dict["lin.bias"]
    torch.testing.assert_close(
        ep.module()(x, "a", 3), torch.nn.functional.linear(x, weight, bias) * 3
    )
    with pytest.raises(AssertionError, match="Guard failed"):  # the guard, as torch wrote it
        ep.module()(x, "b", 3)
    assert not marker.exists()


class Keyed(torch.nn.Module):
    def forward(self, d):
        return d["a"] * 2


def test_a_sample_input_key_that_would_be_python_is_refused(tmp_path, marker):
    """Before: ``ep.module()`` wrote the input's path (``d['KEY']``) into a guard's message, a
    string literal the key could close, and the first call ran the rest."""
    good = tmp_path / "keyed.pt2"
    torch.export.save(torch.export.export(Keyed(), ({"a": torch.randn(3)},)), good)
    key = f'a" + str({touch(marker)}) + "'.replace("'", '"')
    body = _torch_saved((({key: torch.randn(3)},), {}))
    member = "data/sample_inputs/model.pt"
    bad = rewrite(good, tmp_path / "bad.pt2", lambda n, b: body if n == member else b)
    assert refused(bad, marker, member).unsafe
    ep = load(good)
    x = torch.randn(3)
    torch.testing.assert_close(ep.module()({"a": x}), x * 2)


def test_a_graph_name_that_would_be_python_is_refused(saved, tmp_path, marker):
    """Before: torch set the name as the FX node's name unchanged, FX wrote
    ``def forward(self, x=<code>)`` while torch loaded the program, and the default ran on
    load. The payload needs no quotes (``chr``), so only "an identifier" keeps it out."""
    path = "+".join(f"chr({ord(c)})" for c in str(marker))
    name = (
        "x=getattr(getattr(__import__(chr(112)+chr(97)+chr(116)+chr(104)+chr(108)+chr(105)"
        f"+chr(98)),chr(80)+chr(97)+chr(116)+chr(104))({path}),"
        "chr(116)+chr(111)+chr(117)+chr(99)+chr(104))()"
    )

    def edit(member, body):
        if member != "models/model.json":
            return body
        tree = json.loads(body.replace(b'"x"', json.dumps(name).encode()))
        tree["graph_module"]["module_call_graph"][0]["signature"]["forward_arg_names"] = ["x", "y"]
        return json.dumps(tree).encode()

    bad = rewrite(saved["derived"], tmp_path / "bad.pt2", edit)
    assert "is not an identifier" in str(refused(bad, marker, "models/model.json"))


# ----- namedtuple outputs of a type this process does not know ---------------------------------
Pair = collections.namedtuple("Pair", ["a", "b"])
torch.utils._pytree._register_namedtuple(Pair, serialized_type_name="fxpass_tests.hostile.Pair")


class Paired(torch.nn.Module):
    def forward(self, x):
        return Pair(x * 2, x + 1)


@pytest.fixture(scope="session")
def unknown_namedtuple(tmp_path_factory) -> Path:
    """A program returning a namedtuple whose serialized name no process registers."""
    folder = tmp_path_factory.mktemp("namedtuple")
    torch.export.save(torch.export.export(Paired(), (torch.randn(3),)), folder / "known.pt2")
    return rewrite(
        folder / "known.pt2",
        folder / "unknown.pt2",
        lambda n, b: b.replace(b"fxpass_tests.hostile.Pair", b"elsewhere.Unknown"),
    )


def test_an_unknown_namedtuple_loads_as_a_stand_in(unknown_namedtuple):
    ep = load(unknown_namedtuple)
    x = torch.randn(3)
    out = ep.module()(x)
    torch.testing.assert_close(out.a, x * 2)
    torch.testing.assert_close(out.b, x + 1)


def test_namedtuple_fields_that_are_not_names_are_one_pt2error(
    unknown_namedtuple, tmp_path, marker
):
    """collections.namedtuple refuses them (ValueError) before it would eval them."""

    def edit(name, body):
        if name != "models/model.json":
            return body
        tree = json.loads(body.replace(b"elsewhere.Unknown", b"elsewhere.BadFields"))
        for fields in tree["graph_module"]["treespec_namedtuple_fields"].values():
            fields["field_names"] = ["a b", "c=__import__('os')"]
        return json.dumps(tree).encode()

    bad = rewrite(unknown_namedtuple, tmp_path / "bad.pt2", edit)
    refused(bad, marker, "models/model.json")
