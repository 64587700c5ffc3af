"""Every graph change in fxpass goes through the editor (``fxpass.edit.Editor``).

A walk over the source (``ast``) finds each direct torch.fx mutation — ``graph.create_node`` /
``call_function`` / ``call_method`` / ``call_module`` / ``get_attr`` / ``placeholder`` /
``output`` / ``node_copy`` / ``graph_copy`` / ``erase_node`` / ``eliminate_dead_code``,
``node.args =`` / ``kwargs =`` / ``target =``, ``replace_all_uses_with``,
``replace_input_with``, ``update_arg`` / ``update_kwarg`` / ``insert_arg``, ``prepend`` /
``append`` on a node — and each use of fxutil's raw edit primitives, outside ``edit/`` (the
editor) and ``fxutil/`` (the ground floor over torch.fx), and fails unless the function is on
the allow-list below with the reason it is not a pass's edit.

``.append`` is also a list's: a receiver proven to be a list (assigned or annotated as one,
a ``setdefault(k, [])``, an attribute some class declares as a list) is not a node. Calls
on ``self`` and ``super()`` are a class's own methods (an ``fx.Interpreter``'s
``call_function``), and so are calls on an attribute holding an interpreter (made by a
function annotated to return one, or by a class named ``...Interpreter``): they run a node,
not edit one. Stores on ``self`` and on a caught exception are not a node's.
"""

from __future__ import annotations

import ast
import functools
from collections.abc import Iterator
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "src" / "fxpass"

#: Folders whose code may edit graphs directly: the editor, and the ground floor over torch.fx.
EDITING_LAYERS = ("edit/", "fxutil/")

GRAPH_CALLS = {
    "create_node",
    "call_function",
    "call_method",
    "call_module",
    "get_attr",
    "placeholder",
    "output",
    "node_copy",
    "graph_copy",
    "erase_node",
    "eliminate_dead_code",
}
NODE_CALLS = {"replace_all_uses_with", "replace_input_with", "update_arg", "update_kwarg"}
NODE_CALLS |= {"insert_arg", "prepend", "append"}
NODE_STORES = {"args", "kwargs", "target"}
#: fxutil's raw edit primitives: the editor is built on them; nothing else uses them.
RAW_PRIMITIVES = {"set_args_kwargs", "dead_node_eraser", "rename_node", "release_name"}
#: Attributes of a node that are nodes (``node.next.append(x)`` moves ``x``).
NODE_LINKS = {"next", "prev", "_next", "_prev"}

#: Functions that change graphs directly, and why that is not a pass's edit.
#: Keys are ``"path/in/fxpass.py:Qualified.name"``.
ALLOWED = {
    "compat/inductor/_trace.py:fwd_only": (
        "torch compatibility: Inductor's fwd_only steps (dead-code elimination) on the graph "
        "make_fx just traced, exactly as Inductor does them"
    ),
    "compat/inductor/_trace.py:joint_fwd_bwd": (
        "torch compatibility: Inductor's joint_fwd_bwd steps on the graph AOTAutograd just "
        "traced, exactly as Inductor does them"
    ),
    "compat/inductor/_trace.py:_clone": (
        "copies a traced graph into a new one (graph_copy): nothing to tell, no run watches it"
    ),
}

#: Folders another branch is rewriting now, and which one: their edits are checked once it
#: lands (the lead removes the entry when merging it).
BEING_REWRITTEN: dict[str, str] = {}  # folder -> which branch rewrites it, until it merges


# ----- what a receiver is ------------------------------------------------------------------------
LIST, HOLDER, OBJECT = "list", "holder", "object"  # a list, a container of lists, not a node
_NODE_TYPES = ("Node", "Any", "object")


class _Index:
    """What the whole package declares: attributes some class declares as lists, module
    names that are lists, and what each function returns (by its annotation)."""

    def __init__(self, trees: dict[str, ast.Module]) -> None:
        self.list_attrs: set[str] = set()
        self.module_lists: set[str] = set()
        self.returns: dict[str, str] = {}
        #: attributes holding an ``fx.Interpreter`` (its ``call_function`` runs an op)
        self.interpreter_attrs: set[str] = set()
        makes_interpreter: set[str] = set()
        for tree in trees.values():
            for node in ast.walk(tree):
                if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    kind = _annotation_kind(node.returns)
                    if kind is not None:
                        self.returns[node.name] = kind
                    if node.returns is not None and "Interpreter" in ast.unparse(node.returns):
                        makes_interpreter.add(node.name)
                for target, value, ann in _targets(node):
                    is_list = _is_list_value(value) or _annotation_kind(ann) == LIST
                    if isinstance(target, ast.Attribute) and is_list:
                        self.list_attrs.add(target.attr)
                    elif isinstance(target, ast.Name) and is_list and ann is not None:
                        self.list_attrs.add(target.id)  # a dataclass field
            for node in tree.body:
                for target, _, ann in _targets(node):
                    if isinstance(target, ast.Name) and _annotation_kind(ann) == LIST:
                        self.module_lists.add(target.id)
        self.list_attrs -= NODE_LINKS
        for tree in trees.values():
            for node in ast.walk(tree):
                for target, value, _ in _targets(node):
                    if isinstance(target, ast.Attribute) and _makes(value, makes_interpreter):
                        self.interpreter_attrs.add(target.attr)


def _makes(value: ast.AST | None, functions: set[str]) -> bool:
    """``value`` calls one of ``functions``, or a class whose name ends in Interpreter."""
    if not isinstance(value, ast.Call):
        return False
    func = value.func
    name = func.id if isinstance(func, ast.Name) else getattr(func, "attr", "")
    return name in functions or name.endswith("Interpreter")


def _annotation_kind(ann: ast.AST | None) -> str | None:
    """LIST, HOLDER (a container of lists), OBJECT (a type that is not a node) or None."""
    if ann is None:
        return None
    text = ast.unparse(ann).replace(" ", "").replace("'", "").replace('"', "")
    head = text.split("[", 1)[0].rsplit(".", 1)[-1]
    if head in ("list", "List", "deque", "MutableSequence"):
        return HOLDER if text.startswith(("list[list[", "List[List[")) else LIST
    if head in ("dict", "defaultdict", "Mapping", "MutableMapping"):
        return HOLDER if ",list[" in text else OBJECT
    if any(t in text for t in _NODE_TYPES) or head in ("None", "Optional"):
        return None
    return OBJECT


def _is_list_value(value: ast.AST | None) -> bool:
    """An expression that makes a list (or deque)."""
    if isinstance(value, (ast.List, ast.ListComp)):
        return True
    if isinstance(value, ast.BinOp):
        return _is_list_value(value.left) or _is_list_value(value.right)
    if isinstance(value, ast.Call) and isinstance(value.func, (ast.Name, ast.Attribute)):
        name = value.func.id if isinstance(value.func, ast.Name) else value.func.attr
        if name == "field":
            return any(_names_list(k.value) for k in value.keywords)
        return name in ("list", "sorted", "deque")
    return False


def _names_list(node: ast.AST) -> bool:
    return isinstance(node, ast.Name) and node.id == "list"


def _holds_lists(value: ast.AST | None) -> bool:
    """A container whose elements are lists (``[[] for ...]``, ``defaultdict(list)``,
    ``{k: [] ...}``, ``[a, b, []]``)."""
    if isinstance(value, ast.ListComp):
        return _is_list_value(value.elt)
    if isinstance(value, ast.DictComp):
        return _is_list_value(value.value)
    if isinstance(value, (ast.List, ast.Tuple)):
        return any(_is_list_value(e) for e in value.elts)
    if isinstance(value, ast.Dict):
        return bool(value.values) and all(_is_list_value(v) for v in value.values)
    if isinstance(value, ast.Call) and getattr(value.func, "id", None) == "defaultdict":
        return bool(value.args) and _names_list(value.args[0])
    return False


def _is_constructor(value: ast.AST | None) -> bool:
    """``Text(...)``, ``OpCall(...)``: a class made here (fxpass never makes a Node so)."""
    if not isinstance(value, ast.Call):
        return False
    func = value.func
    name = func.id if isinstance(func, ast.Name) else getattr(func, "attr", "")
    return name[:1].isupper() and name != "Node"


def _targets(stmt: ast.AST) -> Iterator[tuple[ast.AST, ast.AST | None, ast.AST | None]]:
    """(target, value, annotation) of an assignment, tuple unpacking split."""
    if isinstance(stmt, ast.Assign):
        for target in stmt.targets:
            if isinstance(target, ast.Tuple) and isinstance(stmt.value, ast.Tuple):
                yield from zip(target.elts, stmt.value.elts, [None] * len(target.elts))
            else:
                yield target, stmt.value, None
    elif isinstance(stmt, ast.AnnAssign):
        yield stmt.target, stmt.value, stmt.annotation
    elif isinstance(stmt, ast.AugAssign) and _is_list_value(stmt.value):
        yield stmt.target, stmt.value, None


class _Scope:
    """What a function (or the module) knows about its names: which are lists, containers
    of lists, or objects that are not nodes; which are caught exceptions."""

    def __init__(self, body: ast.AST, outer: _Scope | None, index: _Index) -> None:
        self.index = index
        # every kind a name is given somewhere in the scope (``x = None`` gives none)
        self.kinds: dict[str, set[str]] = (
            {k: set(v) for k, v in outer.kinds.items()} if outer else {}
        )
        self.errors: set[str] = set(outer.errors) if outer else set()
        args = getattr(body, "args", None)
        if args is not None:
            for a in [*args.posonlyargs, *args.args, *args.kwonlyargs]:
                kind = _annotation_kind(a.annotation)
                if kind is not None:
                    self.kinds.setdefault(a.arg, set()).add(kind)
        self.nodes = _own_nodes(body)
        for node in self.nodes:
            for target, value, ann in _targets(node):
                if isinstance(target, ast.Name):
                    for kind in (_annotation_kind(ann), self.kind_of_value(value)):
                        if kind is not None:
                            self.kinds.setdefault(target.id, set()).add(kind)
            if isinstance(node, ast.ExceptHandler) and node.name:
                self.errors.add(node.name)
            if _list_method_call(node):  # duck typing: a node has no list methods
                self.kinds.setdefault(node.func.value.id, set()).add(LIST)

    def kind_of_value(self, value: ast.AST | None) -> str | None:
        if _holds_lists(value):
            return HOLDER
        if _is_list_value(value):
            return LIST
        if _is_constructor(value):
            return OBJECT
        return self.kind(value) if value is not None else None

    def kind(self, expr: ast.AST) -> str | None:
        """What ``expr`` is known to be, or None (perhaps a node)."""
        index = self.index
        if isinstance(expr, ast.Name):
            kinds = self.kinds.get(expr.id)
            if kinds:
                return HOLDER if HOLDER in kinds else next(iter(sorted(kinds)))
            return LIST if expr.id in index.module_lists else None
        if isinstance(expr, ast.Attribute):
            return LIST if expr.attr in index.list_attrs else None
        if isinstance(expr, ast.IfExp):
            kinds = {self.kind(expr.body), self.kind(expr.orelse)}
            return kinds.pop() if len(kinds) == 1 else None
        if isinstance(expr, ast.Subscript):
            base = expr.value
            if self.kind(base) == HOLDER or _is_setdefault_of_lists(base):
                return LIST
            return None
        if isinstance(expr, ast.Call) and isinstance(expr.func, ast.Attribute):
            func = expr.func
            if _is_setdefault_of_lists(expr):
                return LIST
            if func.attr == "get" and self.kind(func.value) == HOLDER:
                return LIST
            return index.returns.get(func.attr)
        if isinstance(expr, ast.Call) and isinstance(expr.func, ast.Name):
            return index.returns.get(expr.func.id)
        return None


_SCOPES = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)


def _own_nodes(body: ast.AST) -> list[ast.AST]:
    """The nodes of a function or module in source order, not those of the functions and
    classes inside it."""
    out = []
    stack = list(ast.iter_child_nodes(body))[::-1]
    while stack:
        node = stack.pop()
        out.append(node)
        if not isinstance(node, _SCOPES):
            stack.extend(list(ast.iter_child_nodes(node))[::-1])
    return out


def _list_method_call(node: ast.AST) -> bool:
    """``name.insert(...)``, ``name.extend(...)``, ...: a method lists have and nodes do not."""
    return (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and isinstance(node.func.value, ast.Name)
        and node.func.attr in ("insert", "extend", "pop", "sort", "remove", "clear", "index")
    )


def _is_setdefault_of_lists(node: ast.AST) -> bool:
    """``d.setdefault(k, [])`` (or of a tuple holding a list)."""
    if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)):
        return False
    if node.func.attr != "setdefault" or len(node.args) != 2:
        return False
    default = node.args[1]
    return _is_list_value(default) or _holds_lists(default)


# ----- the walk ----------------------------------------------------------------------------------
def _direct_edits(rel: str, tree: ast.Module, index: _Index) -> Iterator[tuple[str, str]]:
    """(qualified function name, what it does and where) for each direct edit."""

    def visit(body: ast.AST, qual: str, outer: _Scope | None) -> Iterator[tuple[str, str]]:
        scope = _Scope(body, outer, index)
        for node in scope.nodes:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                inner = f"{qual}.{node.name}" if qual else node.name
                yield from visit(node, inner, scope)
                continue
            found = _edit_in(node, scope)
            if found:
                yield qual or "<module>", f"{found} ({rel}:{node.lineno})"

    yield from visit(tree, "", None)


def _edit_in(node: ast.AST, scope: _Scope) -> str | None:
    if isinstance(node, ast.Call):
        func = node.func
        if isinstance(func, ast.Name) and func.id in RAW_PRIMITIVES:
            return f"{func.id}(...)"
        if not isinstance(func, ast.Attribute):
            return None
        receiver, name = func.value, func.attr
        own = (isinstance(receiver, ast.Name) and receiver.id == "self") or (
            isinstance(receiver, ast.Call) and getattr(receiver.func, "id", None) == "super"
        )
        # an interpreter's call_function / placeholder / output run the node, not edit it
        own = own or (
            isinstance(receiver, ast.Attribute) and receiver.attr in scope.index.interpreter_attrs
        )
        if name in RAW_PRIMITIVES or (name in GRAPH_CALLS and not own):
            return f"{ast.unparse(receiver)}.{name}(...)"
        if name in NODE_CALLS and not own and scope.kind(receiver) is None:
            return f"{ast.unparse(receiver)}.{name}(...)"
    elif isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign)):
        targets = node.targets if isinstance(node, ast.Assign) else [node.target]
        for target in targets:
            for t in ast.walk(target):
                stored = isinstance(t, ast.Attribute) and isinstance(t.ctx, ast.Store)
                if not (stored and t.attr in NODE_STORES):
                    continue
                owner = t.value
                if isinstance(owner, ast.Name) and owner.id in ("self", *scope.errors):
                    continue  # an object's own attribute, an exception's args
                if scope.kind(owner) is None:
                    return f"{ast.unparse(t)} = ..."
    elif isinstance(node, ast.ImportFrom):
        raw = [a.name for a in node.names if a.name in RAW_PRIMITIVES]
        if raw:
            return f"imports {', '.join(raw)}"
    return None


def _sources() -> dict[str, ast.Module]:
    return {
        p.relative_to(PACKAGE).as_posix(): ast.parse(p.read_text(), str(p))
        for p in sorted(PACKAGE.rglob("*.py"))
    }


@functools.cache
def _all_edits() -> dict[str, list[str]]:
    trees = _sources()
    index = _Index(trees)
    found: dict[str, list[str]] = {}
    for rel, tree in trees.items():
        if rel.startswith(EDITING_LAYERS):
            continue
        for qual, what in _direct_edits(rel, tree, index):
            found.setdefault(f"{rel}:{qual}", []).append(what)
    return found


def test_every_graph_change_goes_through_the_editor():
    found = _all_edits()
    waiting = {k for k in found if k.startswith(tuple(BEING_REWRITTEN))}
    bad = {k: v for k, v in found.items() if k not in ALLOWED and k not in waiting}
    lines = [f"  {k}: {', '.join(v)}" for k, v in sorted(bad.items())]
    assert not bad, (
        "direct graph edits outside fxpass.edit and fxpass.fxutil; make them through "
        "fxpass.edit.Editor (insert / create / set_args / set_target / replace_input / "
        "replace_all_uses / erase / erase_all / move / rename, inside editor.change(...) for "
        "one change of several edits), or add the function to ALLOWED with the reason it is "
        "not a pass's edit:\n" + "\n".join(lines)
    )


def test_the_allow_list_names_only_functions_that_edit():
    found = _all_edits()
    stale = sorted(set(ALLOWED) - set(found))
    assert not stale, f"ALLOWED names functions that no longer edit graphs directly: {stale}"
    assert all(len(reason) > 40 for reason in [*ALLOWED.values(), *BEING_REWRITTEN.values()])
    missing = [p for p in BEING_REWRITTEN if not (PACKAGE / p).is_dir()]
    assert not missing, f"BEING_REWRITTEN names folders that are gone: {missing}"


def test_the_walk_finds_each_kind_of_direct_edit():
    """The walk itself: each spelling of a direct edit is found, lists and own methods are not."""
    source = """
import torch.fx as fx
from fxpass.fxutil.fx_internals import rename_node

class Mine(fx.Interpreter):
    def call_function(self, target, args, kwargs):
        return super().call_function(target, args, kwargs)

    def run_node(self, n):
        self.target = n.target            # its own attribute
        self.done: list[int] = []
        self.done.append(1)
        return self.placeholder(n)

def _interp() -> fx.Interpreter:
    return fx.Interpreter(None)

class Runs:
    def __init__(self):
        self.interpreter = _interp()
        self.other = fx.Interpreter(None)

    def run(self, target):
        self.interpreter.call_function(target, (), {})
        self.other.placeholder("x", (), {})

def edits(gm, node, other, items: list[int]):
    out = []
    out.append(node)
    items.append(1)
    groups = {}
    groups.setdefault(1, []).append(node)
    try:
        pass
    except ValueError as e:
        e.args = ("why",)
    gm.graph.erase_node(node)
    node.args = (other,)
    node.next.append(other)
    other.append(node)
    node.replace_all_uses_with(other)
    g = fx.Graph()
    g.placeholder("x")
    rename_node(node, "y")
"""
    tree = ast.parse(source)
    edits = list(_direct_edits("m.py", tree, _Index({"m.py": tree})))
    assert [q for q, _ in edits] == ["<module>", *["edits"] * 7]
    spelled = " ".join(w for _, w in edits)
    for kind in ("erase_node", "node.args =", "node.next.append", "other.append"):
        assert kind in spelled
    for kind in ("replace_all_uses_with", "g.placeholder", "rename_node(...)"):
        assert kind in spelled
    assert "out.append" not in spelled and "items.append" not in spelled
    assert "interpreter.call_function" not in spelled and "other.placeholder" not in spelled
