"""The ground floor: small helpers over torch.fx and torch's op objects that every other
package may use, and that use nothing of fxpass above them.

:mod:`~fxpass.fxutil.fx_internals` (every private torch.fx internal fxpass touches, one function
each: a torch upgrade that renames one changes that file only), :mod:`~fxpass.fxutil.ops`
(op names to ops and back), :mod:`~fxpass.fxutil.paths` (dotted attribute paths),
:mod:`~fxpass.fxutil.values` (fake values of nodes and calls), :mod:`~fxpass.fxutil.dialect`
(ATen and ExecuTorch Edge spellings), :mod:`~fxpass.fxutil.layout` and
:mod:`~fxpass.fxutil.views` (strides and view ops); and two plain helpers every package
shares: :mod:`~fxpass.fxutil.files` (the atomic file write) and
:mod:`~fxpass.fxutil.messages` (an error in one line).
"""
