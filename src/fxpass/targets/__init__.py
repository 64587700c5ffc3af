"""Where passes run: GraphModules, ExportedPrograms, torch.compile, Inductor, piecewise graphs.

Each target is a thin adapter around the one path every run takes: a GraphModule (plus what
the target knows about it) goes through a :class:`~fxpass.Pipeline` and comes back out.
"""
