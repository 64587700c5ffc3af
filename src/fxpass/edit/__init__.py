"""Editing graphs: the one service every pass changes a graph through.

:mod:`~fxpass.edit.editor` (ask the debug counter, edit, tell instrumentation, record
provenance), :mod:`~fxpass.edit.provenance` (``from_node`` and ``fxpass_provenance`` of new
nodes), :mod:`~fxpass.edit.location` (where code was written or called from),
:mod:`~fxpass.edit.alias` (who writes which memory, which values share it),
:mod:`~fxpass.edit.dialect_writer` (the dialect new nodes are written in),
:mod:`~fxpass.edit.watch` (seeing edits made without the editor, to tell the run of them).
"""
