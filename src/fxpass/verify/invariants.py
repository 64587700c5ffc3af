"""Metadata invariants: what every node of a well-formed graph carries after a pass.

Backends read ``meta['val']`` for shapes and dtypes, and people debugging read
``stack_trace`` and ``nn_module_stack``; a pass that drops them breaks what runs after it.
:func:`check_metadata` lists the nodes that miss a key; :func:`require_metadata` makes a check
for :meth:`Pipeline.add_checks <fxpass.Pipeline.add_checks>`, so the pass that drops
metadata is the one named in the error.

>>> pipe.add_checks(require_metadata("val"))           # doctest: +SKIP
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from torch import fx

__all__ = ["MetadataError", "check_metadata", "require_metadata"]

_OPS = ("call_function", "call_method", "call_module", "placeholder", "get_attr")


class MetadataError(AssertionError):
    """Nodes are missing metadata a pass should have kept or written."""


def check_metadata(
    gm: fx.GraphModule, keys: Iterable[str] = ("val",), *, ops: Iterable[str] = _OPS
) -> list[str]:
    """``"node: missing key"`` for each node of an op kind in ``ops`` without each of ``keys``.

    Provenance written by fxpass's rewrites (``meta['fxpass_provenance']``) must come with
    torch's ``meta['from_node']``; that is checked too.
    """
    keys, ops = tuple(keys), set(ops)
    problems = []
    for node in gm.graph.nodes:
        if node.op not in ops:
            continue
        missing = [k for k in keys if k not in node.meta and not (k == "val" and _no_value(node))]
        if "fxpass_provenance" in node.meta and not node.meta.get("from_node"):
            missing.append("from_node")
        if missing:
            problems.append(f"{node.name} ({node.op} {node.target}): missing {', '.join(missing)}")
    return problems


def _no_value(node: fx.Node) -> bool:
    """Ops that return nothing (``aten._assert_tensor_metadata``) have no value to describe."""
    schema = getattr(node.target, "_schema", None)
    return node.op == "call_function" and schema is not None and not schema.returns


def require_metadata(*keys: str, ops: Iterable[str] = _OPS) -> Callable[[fx.GraphModule], None]:
    """A pipeline check that raises :class:`MetadataError` when nodes miss ``keys``."""
    keys = keys or ("val",)

    def check(gm: fx.GraphModule) -> None:
        problems = check_metadata(gm, keys, ops=ops)
        if problems:
            more = f" (and {len(problems) - 5} more)" if len(problems) > 5 else ""
            raise MetadataError(
                f"{len(problems)} nodes miss metadata: {'; '.join(problems[:5])}{more}"
            )

    check.__name__ = f"require_metadata({', '.join(keys)})"
    return check
