"""Contract entries of the stream ops (``fxpass/ops/stream.py``): they return nothing, so
fake and real must agree on whether a call raises (a negative stream or event number) and
leave the tensor ``record_stream`` is given as it was, in every layout and dtype."""

from __future__ import annotations

from typing import Any

import torch
from hypothesis import strategies as st

from . import Call, Contract, in_layout, tensors

_IDS = st.integers(-2, 7)  # negative numbers are refused, by the fake kernel too


@st.composite
def _record_stream_calls(draw: Any) -> Call:
    shape = tuple(draw(st.lists(st.integers(1, 4), min_size=0, max_size=3)))
    return Call((draw(tensors(shape)), draw(_IDS)))


def _ints(n: int) -> Any:
    return st.builds(lambda *ids: Call(tuple(ids)), *[_IDS] * n)


def _int_examples(n: int) -> Any:
    return lambda: [Call((0,) * n), Call(tuple(range(1, n + 1)))]


CONTRACTS = {
    "fxpass::set_stream": Contract(calls=_ints(1), examples=_int_examples(1)),
    "fxpass::record_event": Contract(calls=_ints(2), examples=_int_examples(2)),
    "fxpass::wait_event": Contract(calls=_ints(2), examples=_int_examples(2)),
    "fxpass::record_stream": Contract(
        calls=_record_stream_calls(),
        examples=lambda: [
            Call((in_layout((3, 4), torch.float32, layout), 1))
            for layout in ("contiguous", "transposed", "sliced", "expanded")
        ],
    ),
}
