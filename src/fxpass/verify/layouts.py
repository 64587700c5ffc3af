"""Layout invariants: the strides a graph records are the strides its ops will produce.

Backends trust ``meta['val']``: Inductor compiles against the recorded strides of a custom
op's result (and, with size asserts off, reads memory by them), and every ``view``
downstream was traced against the layout of its input. A pass whose new node records one
layout while its op's fake kernel computes another, or whose replacement changes the layout
its users were traced against, compiles to wrong code or fails at run time. This check
catches both, after the pass that did it:

* each **new node** — made by a rewrite (``meta['fxpass_provenance']``) or calling a custom
  op (any namespace but ``aten`` and ``prims``) — is re-run on its inputs' fake values, and
  its recorded shape, dtype and strides must equal what the op's fake kernel gives;
* each **user** of a new node is re-run the same way and must still produce what it
  recorded (a ``view`` that no longer fits its input raises here, as it would at run time).

Strides of size-one dimensions address nothing and are not compared; with symbolic shapes
only strides known to differ count. :func:`check_layouts` lists the problems,
:func:`require_layouts` makes a check for :meth:`Pipeline.add_checks
<fxpass.Pipeline.add_checks>`, so the pass that broke a layout is the one named.

>>> pipe.add_checks(require_layouts())                # doctest: +SKIP
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import torch
from torch import fx
from torch.fx.experimental.symbolic_shapes import statically_known_true

from ..fxutil.layout import format_layout, significant_strides
from ..fxutil.messages import error_summary
from ..fxutil.values import FakeEvaluator, Strictness

__all__ = ["LayoutError", "check_layouts", "require_layouts"]

_BUILTIN_NAMESPACES = frozenset({"aten", "prims"})
_NO = object()


class LayoutError(AssertionError):
    """Nodes record layouts their ops do not produce, or users no longer fit their inputs."""


def check_layouts(
    gm: fx.GraphModule, *, every_node: bool = False, nodes: Iterable[fx.Node] | None = None
) -> list[str]:
    """One line per problem: new nodes (see the module docstring; every node with
    ``every_node``; the ``nodes`` given) whose ``meta['val']`` differs from their fake
    kernel's result, and users of those nodes that no longer produce what they recorded.
    Each line names the node, the pass that made it, and both layouts."""
    if nodes is not None:
        checked = list(nodes)
    else:
        checked = [n for n in gm.graph.nodes if every_node or _is_new(n)]
    problems = [p for n in checked if (p := _check_node(n, None)) is not None]
    seen = set(checked)
    for node in checked:
        for user in node.users:
            if user not in seen:
                seen.add(user)
                if (p := _check_node(user, node)) is not None:
                    problems.append(p)
    return problems


def require_layouts(*, every_node: bool = False) -> Callable[[fx.GraphModule], None]:
    """A pipeline check that raises :class:`LayoutError` listing :func:`check_layouts`'s
    problems (the first five)."""

    def check(gm: fx.GraphModule) -> None:
        problems = check_layouts(gm, every_node=every_node)
        if problems:
            more = f" (and {len(problems) - 5} more)" if len(problems) > 5 else ""
            raise LayoutError(f"{len(problems)} layout problem(s): {'; '.join(problems[:5])}{more}")

    check.__name__ = "require_layouts"
    return check


# ----- one node ---------------------------------------------------------------------------
def _is_new(node: fx.Node) -> bool:
    if "fxpass_provenance" in node.meta:
        return True
    target = node.target
    return (
        node.op == "call_function"
        and isinstance(target, torch._ops.OpOverload)
        and target.namespace not in _BUILTIN_NAMESPACES
    )


def _edits_metadata(target: Any) -> bool:
    # an ATen in-place op re-run on the recorded values could resize or restride them
    return (
        isinstance(target, torch._ops.OpOverload)
        and target.namespace in _BUILTIN_NAMESPACES
        and target._schema.is_mutable
    )


def _recorded(node: fx.Node) -> Any:
    meta = node.meta
    val = meta.get("val", _NO)
    return meta.get("example_value", _NO) if val is _NO else val


def _check_node(node: fx.Node, new_input: fx.Node | None) -> str | None:
    """A problem with ``node`` (re-run on its inputs' values), or None."""
    if node.op not in ("call_function", "call_method") or _edits_metadata(node.target):
        return None
    recorded = _recorded(node)
    if recorded is _NO:
        return None
    # what the fake kernel cannot say (no input value, no fake mode, data-dependent) is not
    # a layout problem: None, nothing to compare
    evaluator = FakeEvaluator(strictness=Strictness.DECLINE, cache=None, new_mode=False)
    try:
        computed = evaluator.rerun(node, value=_input_value)
    except Exception as e:  # broad: reported — the layout problem says it no longer runs, why
        return f"{_describe(node, new_input)} no longer runs on its inputs ({error_summary(e)})"
    if computed is None:
        return None
    diff = _first_difference(recorded, computed)
    if diff is None:
        return None
    index, want, got = diff
    where = f" output {index}" if index else ""
    source = "its fake kernel gives" if new_input is None else "re-run on its inputs it gives"
    return (
        f"{_describe(node, new_input)}{where} records {format_layout(want)}, "
        f"{source} {format_layout(got)}"
    )


def _describe(node: fx.Node, new_input: fx.Node | None) -> str:
    text = f"%{node.name} ({node.target})"
    if new_input is not None:
        text += f", a user of %{new_input.name}{_made_by(new_input)},"
        return text
    return text + _made_by(node)


def _made_by(node: fx.Node) -> str:
    prov = node.meta.get("fxpass_provenance")
    return f" made by pass '{prov['pass']}'" if isinstance(prov, dict) and "pass" in prov else ""


def _input_value(node: fx.Node) -> Any:
    v = _recorded(node)
    return None if v is _NO else v


# ----- comparing values ---------------------------------------------------------------------
def _first_difference(recorded: Any, computed: Any, index: str = "") -> Any:
    """(index, recorded, computed) of the first tensor whose metadata differs, or None."""
    if isinstance(recorded, torch.Tensor) and isinstance(computed, torch.Tensor):
        return None if _same_meta(recorded, computed) else (index, recorded, computed)
    if isinstance(recorded, (tuple, list)) and isinstance(computed, (tuple, list)):
        if len(recorded) != len(computed):
            return (index, recorded, computed)
        for i, (r, c) in enumerate(zip(recorded, computed)):
            diff = _first_difference(r, c, f"{index}[{i}]" if index else str(i))
            if diff is not None:
                return diff
    return None


def _same_meta(a: torch.Tensor, b: torch.Tensor) -> bool:
    if a.dtype != b.dtype or a.dim() != b.dim():
        return False
    if _known_different(a.shape, b.shape):
        return False
    sa = significant_strides(a.shape, a.stride())
    sb = significant_strides(a.shape, b.stride())
    return not _known_different(sa, sb)


def _known_different(xs: Iterable[Any], ys: Iterable[Any]) -> bool:
    xs, ys = list(xs), list(ys)
    if len(xs) != len(ys):
        return True
    for x, y in zip(xs, ys):
        if isinstance(x, int) and isinstance(y, int):
            if x != y:
                return True
        elif statically_known_true(x != y):
            return True
    return False
