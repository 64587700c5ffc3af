"""``PatternPrettyPrinter``: patterns written out as Python, as Inductor's printer writes them.

Inductor's printer names every call expression it meets (``add_Tensor = CallFunction(...)``)
and refers to it by that name, but it recognizes only Inductor's own expression class: given
fxpass's patterns it would write them nested, one expression per output. This printer names
fxpass's call expressions and Inductor's alike (the same text for the same pattern); vLLM's
``dump_patterns`` uses it after ``install()``.

>>> import torch
>>> from fxpass.compat.inductor import CallFunction, KeywordArg, PatternPrettyPrinter
>>> add = CallFunction(torch.ops.aten.add.Tensor, KeywordArg("x"), KeywordArg("y"))
>>> print(PatternPrettyPrinter.run(CallFunction(torch.ops.aten.relu.default, add)))
add_Tensor = CallFunction(aten.add.Tensor, KeywordArg('x'), KeywordArg('y'))
output = CallFunction(aten.relu.default, add_Tensor)
"""

from __future__ import annotations

import functools
from typing import Any

from ...fxutil.fx_internals import new_namespace

__all__ = ["PatternPrettyPrinter"]


def _is_call(obj: Any) -> bool:
    """A call expression with arguments (fxpass's ``_TargetArgsExpr`` or Inductor's)."""
    return hasattr(obj, "flat_args_kwargs") and hasattr(obj, "fns_repr")


class PatternPrettyPrinter:
    """Writes a pattern as Python: ``memoized_objs_names``/``memoized_objs_pp`` hold the
    named call expressions in the order they were named, ``namespace`` the names taken."""

    def __init__(self) -> None:
        self.namespace = new_namespace()
        self.memoized_objs_names: dict[Any, str] = {}
        self.memoized_objs_pp: dict[Any, str] = {}

    @staticmethod
    @functools.cache
    def run(obj: Any, output_name: str = "output") -> str:
        """``obj`` written as Python, its value assigned to ``output_name``."""
        pp = PatternPrettyPrinter()
        if not hasattr(obj, "pretty_print"):
            raise TypeError(f"PatternPrettyPrinter.run takes a pattern expression, got {obj!r}")
        out = obj.pretty_print(pp=pp)
        lines = [
            f"{name} = {pp.memoized_objs_pp[key]}" for key, name in pp.memoized_objs_names.items()
        ]
        lines.append(f"{output_name} = {out}")
        return "\n".join(lines)

    def pretty_print(self, obj: Any) -> str:
        if _is_call(obj):
            name = self.memoized_objs_names.get(obj)
            return name if name is not None else self.memoize(obj)
        if hasattr(obj, "pretty_print"):
            return obj.pretty_print(self)
        return repr(obj)

    def memoize(self, obj: Any) -> str:
        """Write ``obj`` out and name it after its target (``aten.``, ``torch.``, ``prims.``
        dropped)."""
        text = obj.pretty_print(self)
        base = obj.fns_repr()
        for prefix in ("aten.", "torch.", "prims."):
            base = base.replace(prefix, "")
        name = self.namespace.create_name(base, None)
        self.memoized_objs_names[obj] = name
        self.memoized_objs_pp[obj] = text
        return name
