"""The graph forms (dialects) fxpass meets: one list, what each form is and what its nodes call.

A pattern matches only graphs of its own form, a pass writes new nodes in the form of the
graph it edits, and each door names the forms it takes. Every list of forms in fxpass is a
mapping from that door's spelling onto :data:`FORMS` (:func:`spelled`), checked when the
module is imported, so a door cannot name a form that is not here:

=========  =========  ===================================================================
form       its ops    how a graph of the form is made
=========  =========  ===================================================================
fx         torch      ``torch.fx.symbolic_trace``: calls, methods and modules as written
dynamo     torch      Dynamo: the torch-level graph a ``torch.compile`` backend receives
export     aten       ``torch.export`` without decompositions (the training IR)
aten       aten       ``torch.export`` + ``run_decompositions()``: core ATen
aot        aten       AOTAutograd: the functional ATen graphs Inductor's hooks receive
edge       edge       ``executorch.exir.to_edge``: ATen ops wrapped as Edge ops
=========  =========  ===================================================================

Which op a node calls is read in every form through :func:`fxpass.fxutil.dialect.aten_op`;
new nodes are written by the form's one node writer, :class:`fxpass.edit.dialect_writer.Spelling`
(ops as they are, except in an Edge graph, where they become Edge ops).

>>> FORMS["aot"].ops
'aten'
>>> spelled({"trace": "fx"})["trace"].name
'fx'
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

__all__ = ["FORMS", "GraphForm", "spelled"]


@dataclass(frozen=True)
class GraphForm:
    """One graph form: its ``name``, what its ``call_function`` nodes call (``ops``:
    ``"torch"`` functions and methods, ``"aten"`` ops or ``"edge"`` ops) and how a graph of
    it is made (``made_by``)."""

    name: str
    ops: str
    made_by: str


FORMS: dict[str, GraphForm] = {
    f.name: f
    for f in (
        GraphForm("fx", "torch", "torch.fx.symbolic_trace"),
        GraphForm("dynamo", "torch", "Dynamo's graph, as a torch.compile backend receives it"),
        GraphForm("export", "aten", "torch.export without decompositions"),
        GraphForm("aten", "aten", "torch.export, then run_decompositions() (core ATen)"),
        GraphForm("aot", "aten", "AOTAutograd's functional graphs, as Inductor's hooks get them"),
        GraphForm("edge", "edge", "executorch.exir.to_edge (Edge ops)"),
    )
}


def spelled(spellings: Mapping[str, str]) -> dict[str, GraphForm]:
    """A door's names for the forms it takes: ``{its name: the form's name}`` becomes
    ``{its name: GraphForm}``; a form that is not in :data:`FORMS` is a programming error."""
    unknown = sorted(set(spellings.values()) - set(FORMS))
    if unknown:
        raise ValueError(f"not graph forms: {unknown}; the forms are {', '.join(FORMS)}")
    return {name: FORMS[form] for name, form in spellings.items()}
