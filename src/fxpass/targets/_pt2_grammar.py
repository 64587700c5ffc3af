"""The expression strings of a ``.pt2`` archive, checked against the grammar export writes.

Two kinds of string in a program's JSON become code when torch loads or runs it:

* every ``expr_str`` (a symbolic size, stride or value) goes to ``sympy.sympify``, which
  evaluates Python: ``sympy_expression`` checks them, and the range constraints' symbol
  names;
* every ``guards_code`` line is pasted into a Python function that ``ep.module()`` executes:
  ``guard_expression`` checks them.

Names are a third kind: FX writes graph value names into the ``forward`` it generates while
torch loads the program (``def forward(self, NAME)``: a name ``x=<code>`` ran that code on
load), and ``ep.module()`` writes parameter and buffer names, submodule paths, argument names
and constant string inputs into Python source (``getattr(self, "NAME")``, a guard
``L['mode'] == 'VALUE'``): ``program_names`` refuses graph names and argument names that are
not identifiers, quotes, backslashes and control characters in the others, and constant
inputs of the wrong type.

Each string is parsed with :mod:`ast` (``mode="eval"``) and every node must be in an
allow-list: integer literals, symbols (``s0``, ``u3``, ...), arithmetic, comparisons and the
function names torch's serializer and guard printer write (derived from torch's own
``torch.utils._sympy.functions`` and its guard namespace). Nothing is ever evaluated here.
"""

from __future__ import annotations

import ast
import functools
import re
from collections.abc import Callable

__all__ = ["ExpressionError", "guard_expression", "program_names", "sympy_expression"]

#: Longer than any expression export writes, short enough to parse at once.
MAX_LENGTH = 100_000
#: An integer literal export writes fits in int64 (sizes, int_oo's stand-in) with room to spare.
MAX_INT_BITS = 128
#: ``Pow(x, 70000)`` would make sympy build a huge number before anything runs.
MAX_EXPONENT = 64
#: Characters export never writes and a grammar walk cannot see (comments, escapes, lines).
_FORBIDDEN_CHARS = re.compile(r"[^ -~]|[#\\;`]")
#: A dict key or attribute in a guard's input path (``L['x']``, ``L['kwargs']['mask']``).
_PATH_KEY = re.compile(r"[A-Za-z0-9_.\-]*", re.ASCII)
_IDENTIFIER = re.compile(r"[A-Za-z][A-Za-z0-9_]*", re.ASCII)
_FLOAT_TEXT = re.compile(r"[-+]?(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?|[-+]?(inf|nan)", re.ASCII)

#: sympy's own classes that ``srepr`` writes for what export's symbolic shapes hold.
_SYMPY_CORE = frozenset(
    [
        "Symbol",
        "Integer",
        "Float",
        "Rational",
        "Add",
        "Mul",
        "Pow",
        "Abs",
        "floor",
        "ceiling",
        "Piecewise",
        "ExprCondPair",
        "And",
        "Or",
        "Not",
        "Equality",
        "Unequality",
        "GreaterThan",
        "LessThan",
        "StrictGreaterThan",
        "StrictLessThan",
        "Eq",
        "Ne",
        "Ge",
        "Le",
        "Gt",
        "Lt",
        "Max",
        "Min",
        "Mod",
        "IntInfinity",
        "NegativeIntInfinity",
    ]
)
#: Constants ``srepr`` writes as bare names.
_SYMPY_CONSTANTS = frozenset({"oo", "zoo", "nan", "true", "false", "int_oo", "pi", "E"})
#: What a guard may call: builtins the printer writes, and ``math.*`` / ``torch.*`` functions.
_GUARD_BUILTINS = frozenset({"max", "min", "abs", "round", "int", "float"})
_GUARD_MATH = frozenset(
    [
        "floor",
        "ceil",
        "trunc",
        "cos",
        "cosh",
        "acos",
        "sin",
        "sinh",
        "asin",
        "tan",
        "tanh",
        "atan",
        "asinh",
        "log",
        "log2",
        "exp",
        "sqrt",
        "isnan",
        "inf",
        "nan",
        "pi",
        "e",
    ]
)
_GUARD_TORCH = frozenset(
    {"sym_float", "sym_int", "sym_max", "sym_min", "sym_not", "sym_ite", "sym_sqrt", "_sym_sqrt"}
)
_TENSOR_METHODS = frozenset({"size", "stride", "storage_offset", "dim", "numel"})

_ARITHMETIC = (
    ast.Add,
    ast.Sub,
    ast.Mult,
    ast.Div,
    ast.FloorDiv,
    ast.Mod,
    ast.Pow,
    ast.LShift,
    ast.RShift,
    ast.BitAnd,
    ast.BitOr,
    ast.BitXor,
)
_COMPARISONS = (ast.Eq, ast.NotEq, ast.Lt, ast.LtE, ast.Gt, ast.GtE)


class ExpressionError(ValueError):
    """An expression string outside the grammar; the message says which part."""


@functools.cache
def _symbol_name() -> re.Pattern[str]:
    """``s0``, ``u3``, ``zuf1``...: torch's symbol prefixes followed by a number."""
    from torch.utils._sympy.symbol import prefix_str

    prefixes = sorted(set(prefix_str.values()), key=len, reverse=True)
    return re.compile("(?:" + "|".join(map(re.escape, prefixes)) + ")[0-9]+", re.ASCII)


@functools.cache
def _sympy_functions() -> frozenset[str]:
    """The function classes torch defines for symbolic shapes (``FloorDiv``, ``Mod``,
    ``CeilToInt``, ``PythonMod``, ``OpaqueUnaryFn_sqrt``...), with sympy's core classes."""
    import inspect

    import sympy
    import torch.utils._sympy.functions as functions

    torch_names = {
        name
        for name, value in vars(functions).items()
        if inspect.isclass(value)
        and issubclass(value, sympy.Basic)
        and value.__module__ == functions.__name__
    }
    return frozenset(torch_names | _SYMPY_CORE)


@functools.cache
def _guard_names() -> frozenset[str]:
    """Names a guard may call: the builtins the printer writes and torch's guard namespace
    (``SYMPY_INTERP``), without its modules (``math.*``/``torch.*`` are checked apart)."""
    from torch.fx.experimental.symbolic_shapes import SYMPY_INTERP

    return frozenset(_GUARD_BUILTINS | (set(SYMPY_INTERP) - {"math", "torch"}))


def _assumptions() -> frozenset[str]:
    from sympy.core.assumptions import _assume_defined

    return frozenset(_assume_defined)


def _show(text: str, limit: int = 120) -> str:
    return repr(text if len(text) <= limit else text[:limit] + "...")


def _parse(text: object, what: str) -> ast.expr:
    if not isinstance(text, str):
        raise ExpressionError(f"{what} is a {type(text).__name__}, not a string")
    if len(text) > MAX_LENGTH:
        raise ExpressionError(f"{what} is {len(text)} characters long (at most {MAX_LENGTH})")
    bad = _FORBIDDEN_CHARS.search(text)
    if bad:
        raise ExpressionError(f"{what} {_show(text)} holds {bad.group()!r}")
    try:
        return ast.parse(text, mode="eval").body
    except (SyntaxError, ValueError, RecursionError, MemoryError) as e:
        raise ExpressionError(f"{what} {_show(text)} is not an expression ({e})") from e


def _check_int(value: int, text: str, what: str) -> None:
    if value.bit_length() > MAX_INT_BITS:
        raise ExpressionError(f"{what} {_show(text)} has an integer of {value.bit_length()} bits")


def _walk(root: ast.expr, visit: Callable[[ast.AST], list[ast.AST]]) -> None:
    """Visit every node once, without recursion (a deep expression is no stack risk)."""
    stack: list[ast.AST] = [root]
    while stack:
        stack.extend(visit(stack.pop()))


def _exponent(node: ast.expr) -> int | None:
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
        node = node.operand
    if isinstance(node, ast.Constant) and type(node.value) is int:
        return node.value
    if (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Name)
        and node.func.id == "Integer"
        and node.args
    ):
        return _exponent(node.args[0])
    return None


def _check_power(exponent: ast.expr, text: str, what: str) -> None:
    value = _exponent(exponent)
    if value is not None and abs(value) > MAX_EXPONENT:
        raise ExpressionError(f"{what} {_show(text)} raises to the power {value}")


def sympy_expression(text: object, what: str = "expression") -> None:
    """Refuse (:class:`ExpressionError`) a string torch would hand to ``sympy.sympify`` unless
    it is written in the grammar of ``sympy.srepr`` / ``str`` of export's symbolic shapes:
    ``Mul(Integer(2), Symbol('s0', positive=True, integer=True))``, ``2*s0 + 1``..."""
    body = _parse(text, what)
    assert isinstance(text, str)
    symbol, functions, assumptions = _symbol_name(), _sympy_functions(), _assumptions()

    def refuse(node: ast.AST, why: str) -> ExpressionError:
        part = ast.get_source_segment(text, node) or type(node).__name__
        return ExpressionError(f"{what} {_show(text)} {why}: {_show(part, 60)}")

    def visit(node: ast.AST) -> list[ast.AST]:
        if isinstance(node, ast.Constant):
            if type(node.value) is int:
                _check_int(node.value, text, what)
                return []
            if type(node.value) is float:
                return []
            raise refuse(node, "holds a literal export does not write")
        if isinstance(node, ast.Name):
            if symbol.fullmatch(node.id) or node.id in _SYMPY_CONSTANTS:
                return []
            raise refuse(node, "names something that is not a symbol")
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
            return [node.operand]
        if isinstance(node, ast.BinOp) and isinstance(node.op, _ARITHMETIC):
            if isinstance(node.op, ast.Pow):
                _check_power(node.right, text, what)
            return [node.left, node.right]
        if isinstance(node, ast.Call):
            return visit_call(node)
        raise refuse(node, "is outside the grammar of exported shapes")

    def visit_call(node: ast.Call) -> list[ast.AST]:
        if not isinstance(node.func, ast.Name) or node.func.id not in functions:
            raise refuse(node.func, "calls a function export does not write")
        name, args = node.func.id, list(node.args)
        if any(isinstance(a, ast.Starred) for a in args):
            raise refuse(node, "unpacks arguments")
        if name == "Symbol":
            first = args[0] if args else None
            if not (
                isinstance(first, ast.Constant)
                and isinstance(first.value, str)
                and symbol.fullmatch(first.value)
            ):
                raise refuse(node, "is a Symbol without a symbol name")
            args = args[1:]
        elif name == "Float":
            first = args[0] if args else None
            if isinstance(first, ast.Constant) and isinstance(first.value, str):
                if not _FLOAT_TEXT.fullmatch(first.value):
                    raise refuse(first, "is not a number")
                args = args[1:]
        elif name in ("Pow", "PowByNatural", "FloatPow") and len(args) == 2:
            _check_power(args[1], text, what)
        for keyword in node.keywords:
            value = keyword.value
            if keyword.arg in assumptions or keyword.arg == "evaluate":
                ok = isinstance(value, ast.Constant) and type(value.value) is bool
            elif keyword.arg == "precision":
                ok = isinstance(value, ast.Constant) and type(value.value) is int
            else:
                ok = False
            if not ok:
                raise refuse(keyword, "passes an argument export does not write")
        return args

    _walk(body, visit)


def guard_expression(text: object, what: str = "guard") -> None:
    """Refuse (:class:`ExpressionError`) a ``guards_code`` line unless it is written in the
    grammar of torch's shape-guard printer: comparisons and arithmetic over input sizes
    (``L['x'].size()[0] <= 1024``), integers, and the functions that printer writes."""
    body = _parse(text, what)
    assert isinstance(text, str)
    names = _guard_names()

    def refuse(node: ast.AST, why: str) -> ExpressionError:
        part = ast.get_source_segment(text, node) or type(node).__name__
        return ExpressionError(f"{what} {_show(text)} {why}: {_show(part, 60)}")

    def source(node: ast.AST) -> bool:
        """``L['x']``, ``L['x'].size()[0]``, ``L['args'][0].stride()[1]``..."""
        while True:
            if isinstance(node, ast.Name):
                return node.id == "L"
            if isinstance(node, ast.Subscript):
                key = node.slice
                if not isinstance(key, ast.Constant):
                    return False
                if type(key.value) is int:
                    _check_int(key.value, text, what)
                elif not (isinstance(key.value, str) and _PATH_KEY.fullmatch(key.value)):
                    return False
                node = node.value
            elif isinstance(node, ast.Call):
                func = node.func
                if (
                    node.keywords
                    or not isinstance(func, ast.Attribute)
                    or func.attr not in _TENSOR_METHODS
                    or len(node.args) > 1
                    or any(
                        not (isinstance(a, ast.Constant) and type(a.value) is int)
                        for a in node.args
                    )
                ):
                    return False
                node = func.value
            elif isinstance(node, ast.Attribute):
                if not _IDENTIFIER.fullmatch(node.attr):
                    return False
                node = node.value
            else:
                return False

    def visit(node: ast.AST) -> list[ast.AST]:
        if isinstance(node, ast.Constant):
            if type(node.value) is int:
                _check_int(node.value, text, what)
                return []
            if type(node.value) in (float, bool):
                return []
            raise refuse(node, "holds a literal the guard printer does not write")
        if isinstance(node, (ast.Subscript, ast.Attribute)) or (
            isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
        ):
            if source(node):
                return []
            if isinstance(node, ast.Attribute) and _module_constant(node):
                return []
            if isinstance(node, ast.Call) and _module_function(node.func):
                if node.keywords or any(isinstance(a, ast.Starred) for a in node.args):
                    raise refuse(node, "passes arguments the guard printer does not write")
                return [*node.args]
            raise refuse(node, "is not an input size")
        if isinstance(node, ast.Name):
            if node.id == "inf":
                return []
            raise refuse(node, "names something the guard printer does not write")
        if isinstance(node, ast.Call):
            if not isinstance(node.func, ast.Name) or node.func.id not in names:
                raise refuse(node.func, "calls a function the guard printer does not write")
            if node.keywords or any(isinstance(a, ast.Starred) for a in node.args):
                raise refuse(node, "passes arguments the guard printer does not write")
            return [*node.args]
        if isinstance(node, ast.UnaryOp) and isinstance(
            node.op, (ast.USub, ast.UAdd, ast.Not, ast.Invert)
        ):
            return [node.operand]
        if isinstance(node, ast.BinOp) and isinstance(node.op, _ARITHMETIC):
            if isinstance(node.op, ast.Pow):
                _check_power(node.right, text, what)
            return [node.left, node.right]
        if isinstance(node, ast.BoolOp):
            return [*node.values]
        if isinstance(node, ast.Compare) and all(isinstance(o, _COMPARISONS) for o in node.ops):
            return [node.left, *node.comparators]
        if isinstance(node, ast.IfExp):
            return [node.test, node.body, node.orelse]
        raise refuse(node, "is outside the grammar of shape guards")

    _walk(body, visit)


def _module_constant(node: ast.Attribute) -> bool:
    return (
        isinstance(node.value, ast.Name)
        and node.value.id == "math"
        and node.attr in {"inf", "nan", "pi", "e"}
    )


def _module_function(func: ast.expr) -> bool:
    if not isinstance(func, ast.Attribute) or not isinstance(func.value, ast.Name):
        return False
    module, name = func.value.id, func.attr
    return (module == "math" and name in _GUARD_MATH) or (
        module == "torch" and name in _GUARD_TORCH
    )


#: Graph value names: torch sets them as FX node names without cleaning them, and FX writes
#: them into the generated ``forward`` (``def forward(self, NAME)``), so they must be
#: identifiers ("" is a positional argument of a higher-order op).
_IDENTIFIER_KEYS = frozenset({"name", "as_name"})
#: Keys whose string values torch writes into generated Python source inside quotes
#: (get_attr targets, submodule paths).
_NAME_KEYS = frozenset(
    [
        "fqn",
        "parameter_name",
        "buffer_name",
        "tensor_constant_name",
        "custom_obj_name",
        "user_input_name",
        "target",
    ]
)
_UNQUOTABLE = re.compile(r"[\x00-\x1f\x7f\"'\\]")


def _check_name(text: object, what: str) -> None:
    if isinstance(text, str) and _UNQUOTABLE.search(text):
        raise ExpressionError(
            f"{what} {_show(text)} holds a quote, backslash or control character, which torch "
            "would write into Python source"
        )


def _check_graph_inputs(inputs: object) -> None:
    """A graph's constant inputs become guards (``L['k'] == 3``, ``L['mode'] == 'a'``)."""
    for entry in inputs if isinstance(inputs, list) else ():
        if not isinstance(entry, dict) or len(entry) != 1:
            continue
        ((kind, value),) = entry.items()
        ok = {
            "as_int": lambda v: type(v) is int,
            "as_bool": lambda v: type(v) is bool,
            "as_float": lambda v: type(v) in (int, float) or v in ("Infinity", "-Infinity", "NaN"),
            "as_string": lambda v: isinstance(v, str) and not _UNQUOTABLE.search(v),
        }.get(kind, lambda v: True)(value)
        if not ok:
            raise ExpressionError(
                f"constant input {kind} {_show(repr(value), 80)} is not a plain {kind[3:]} "
                "(torch would write it into a guard's Python source)"
            )


def program_names(program: object) -> None:
    """Refuse (:class:`ExpressionError`) a program whose names or constant inputs would
    change the Python source ``ep.module()`` generates (see the module docstring)."""
    stack: list[object] = [program]
    while stack:
        node = stack.pop()
        if isinstance(node, list):
            stack.extend(node)
            continue
        if not isinstance(node, dict):
            continue
        for key, value in node.items():
            if key in _IDENTIFIER_KEYS:
                if not (value == "" or (isinstance(value, str) and value.isidentifier())):
                    raise ExpressionError(
                        f"graph name {_show(str(value))} is not an identifier (torch writes it "
                        "into Python source as a variable)"
                    )
            elif key in _NAME_KEYS:
                _check_name(value, key.replace("_", " "))
            elif key == "forward_arg_names" and isinstance(value, list):
                for name in value:
                    if not (isinstance(name, str) and name.isidentifier()):
                        raise ExpressionError(f"argument name {_show(str(name))} is not a name")
            elif key == "inputs" and "nodes" in node:
                _check_graph_inputs(value)
            if isinstance(value, (dict, list)):
                stack.append(value)
