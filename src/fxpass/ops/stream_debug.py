"""Make stream races visible on CPU: a debug mode that runs each stream's kernels late.

On CPU the stream ops do nothing and kernels run in graph order, so a schedule that races on
a GPU (a wait missing, an event recorded before the kernel it should cover, a tensor freed
while another stream still reads it) computes the right numbers anyway. Inside
:func:`stream_debug`, every kernel is queued on the stream that is current when it is
issued instead of running at once; it returns a tensor of the right layout that is
*unwritten* (NaN; -1 for integers, False for masks) until its kernel runs. Queued work runs
only when something forces it, in the most unfavourable order the events allow:

* ``hold="side"`` (default): the main stream runs as soon as work is issued; a side stream's
  kernels run only when a ``wait_event`` needs a record made after them, and never if
  nothing waits for them. A kernel that reads a side stream's result without waiting for it
  reads unwritten memory.
* ``hold="main"``: the other way round — side streams run at once, the main stream only
  when a side stream waits for it, and at the end (when the caller reads the results).
  A side stream that reads the main stream's result (or the graph's inputs, which the
  caller's work on the main stream wrote) without waiting for it reads unwritten memory.

The caching allocator is modelled too: when the program drops the last reference to a
tensor, its memory goes to the next work of the stream that made it (in that stream's
order); a kernel of another stream still queued to read it then, which no
``record_stream`` covers, reads it overwritten (every bit flipped). Views run at once (they read no memory); so do ops the host must
wait for (a ``.item()``, an output shape that depends on values), after the work queued
before them on their stream. Everything runs in one thread in a fixed order: the same
schedule gives the same numbers every time. A safe schedule gives exactly the outputs of
an ordinary run. Every read of memory that was not written yet, or was handed out again,
is listed in :attr:`StreamDebug.stale_reads`.

>>> with stream_debug() as run:                                   # doctest: +SKIP
...     out = scheduled(*inputs)
>>> run.stale_reads                                               # doctest: +SKIP
['aten._scaled_dot_product_flash_attention_for_cpu.default (stream 0) read what
  aten.clone.default (stream 1) had not written yet']

For forward runs: the block runs under ``torch.no_grad`` (autograd would keep alive tensors
the graph lets go of). Random ops draw their numbers when their kernel runs.
"""

from __future__ import annotations

import contextlib
import functools
import weakref
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten, tree_map, tree_unflatten

from .stream import STREAM_OPS, _check_ids, _note

__all__ = ["StreamDebug", "stream_debug"]

_FX = torch.ops.fxpass
_HOLDS = ("side", "main")


def _key(t: torch.Tensor) -> int:
    return t.untyped_storage()._cdata


def _poison(t: torch.Tensor) -> None:
    """Fill ``t`` with what memory no kernel wrote yet reads as here: NaN; -1 for integers
    (an index from the end, a count no kernel makes); False for masks (nothing attends)."""
    if t.dtype.is_floating_point or t.dtype.is_complex:
        t.fill_(float("nan"))
    elif t.dtype == torch.bool:
        t.fill_(False)
    else:
        t.fill_(-1 if t.dtype.is_signed else torch.iinfo(t.dtype).max)


def _overwritten(t: torch.Tensor) -> torch.Tensor:
    """What a kernel reads from ``t``'s memory after someone else wrote it: NaN, or every
    bit of ``t`` flipped (never the value it held)."""
    if t.dtype.is_floating_point or t.dtype.is_complex:
        return torch.full_like(t, float("nan"))
    return torch.bitwise_not(t)


@dataclass(eq=False)
class _Kernel:
    """A queued kernel: the op, its arguments (tensors as aliases the program cannot see:
    they keep the memory alive), the placeholders it fills."""

    name: str
    stream: int
    func: Any
    args: tuple
    kwargs: dict
    reads: list[torch.Tensor]
    fills: list[torch.Tensor] = field(default_factory=list)
    reused: set[int] = field(default_factory=set)  # storages handed out before it ran


@dataclass(eq=False)
class _Reuse:
    """The allocator hands freed memory to the next work of its home stream, here."""

    key: int
    home: int
    kept: frozenset[int]  # streams record_stream covered


@dataclass(eq=False)
class _CallerWork:
    """What the caller queued on the main stream before the block: it wrote the inputs."""


@dataclass(eq=False)
class _Wait:
    stream: int  # the recording stream
    upto: int  # its queue position the record was made at


@dataclass
class _Layout:
    leaves: list[tuple]  # (shape, strides, dtype, device) of each tensor result
    spec: Any  # how they nest
    aliases: bool  # whether a result shares an input's memory (a view)


#: op, argument structure and layouts -> what it returns: the same in every block
_LAYOUTS: dict[Any, _Layout | None] = {}


@functools.cache
def _fake_mode() -> FakeTensorMode:
    return FakeTensorMode()


def _layout_key(flat: list) -> tuple:
    """A key for arguments by layout (and which of them share memory), not by values."""
    groups: dict[int, int] = {}
    out = []
    for a in flat:
        if isinstance(a, torch.Tensor):
            group = groups.setdefault(_key(a), len(groups))
            out.append((tuple(a.shape), a.stride(), a.storage_offset(), a.dtype, a.device, group))
        else:
            hash(a)
            out.append(a)
    return tuple(out)


@dataclass
class _Storage:
    home: int  # the stream whose work allocated it
    live: int = 0  # program-visible tensors holding it


class StreamDebug(TorchDispatchMode):
    """The state of one :func:`stream_debug` block: queues, events, what was read stale."""

    def __init__(self, hold: str = "side") -> None:
        super().__init__()
        if hold not in _HOLDS:
            raise ValueError(f"stream_debug: hold must be 'side' or 'main', not {hold!r}")
        self.hold = hold
        self.current = 0
        self.queues: dict[int, list[Any]] = {0: []}
        self.done: dict[int, int] = {0: 0}
        self.events: dict[int, tuple[int, int]] = {}  # event -> (stream, queue position)
        self.kept: set[tuple[int, int]] = set()  # (storage, stream) under record_stream
        self.storages: dict[int, _Storage] = {}  # live memory allocated inside the block
        self.allocated: set[int] = set()  # every storage allocated inside the block
        self.caller_done = False
        self.unwritten: dict[int, str] = {}  # storage -> the queued kernel that writes it
        self.holders: dict[int, weakref.finalize] = {}  # id(tensor) -> its finalizer
        #: One line per kernel that read memory not written yet, or handed out again.
        self.stale_reads: list[str] = []
        #: How many kernels were queued.
        self.kernels = 0

    # ----- queues ----------------------------------------------------------------------------
    def held(self, stream: int) -> bool:
        return (stream != 0) if self.hold == "side" else (stream == 0)

    def queue(self, stream: int) -> list[Any]:
        self.done.setdefault(stream, 0)
        return self.queues.setdefault(stream, [])

    def issue(self, item: Any, stream: int) -> None:
        self.queue(stream).append(item)
        if not self.held(stream):
            self.drain(stream)

    def drain(self, stream: int, upto: int | None = None) -> None:
        """Run ``stream``'s queue up to position ``upto`` (all of it by default). A wait
        first runs the recording stream up to its record, so the recursion follows events
        back in issue order and ends."""
        items = self.queue(stream)
        end = len(items) if upto is None else upto
        while self.done[stream] < end:
            item = items[self.done[stream]]
            items[self.done[stream]] = None  # ran: let its memory go
            self.done[stream] += 1
            if isinstance(item, _Wait):
                self.drain(item.stream, item.upto)
            elif isinstance(item, _Kernel):
                self.execute(item)
            elif isinstance(item, _Reuse):
                self.reuse(item)
            elif isinstance(item, _CallerWork):
                self.caller_done = True

    def execute(self, k: _Kernel) -> None:
        stale: dict[int, torch.Tensor] = {}  # id(alias) -> what the kernel reads instead
        for t in k.reads:
            key = _key(t)
            if key in self.unwritten:  # it holds the poison it was made with
                self.stale_reads.append(
                    f"{k.name} (stream {k.stream}) read what {self.unwritten[key]} had not "
                    f"written yet"
                )
                continue
            if key in k.reused:
                why = "memory the program had freed and the allocator had handed out again"
            elif key not in self.allocated and not self.caller_done:
                why = "an input before the main stream's work on it was known to be done"
            else:
                continue
            self.stale_reads.append(f"{k.name} (stream {k.stream}) read {why}")
            stale[id(t)] = _overwritten(t)
        args, kwargs = k.args, k.kwargs
        if stale:
            args, kwargs = tree_map(lambda a: stale.get(id(a), a), (args, kwargs))
        with torch.no_grad():
            result = k.func(*args, **kwargs)
        if k.fills:
            for target, value in zip(k.fills, tree_flatten(result)[0]):
                target.copy_(value)
                self.unwritten.pop(_key(target), None)
        k.reads.clear()
        k.args, k.kwargs = (), {}

    # ----- memory ----------------------------------------------------------------------------
    def own(self, t: Any, *, fresh: bool) -> None:
        """Count ``t`` as a program-visible holder of its memory (``fresh``: allocated
        here, on the current stream). Memory from outside the block is never freed."""
        if not isinstance(t, torch.Tensor) or id(t) in self.holders:
            return
        key = _key(t)
        info = self.storages.get(key)
        if info is None:
            if not fresh:
                return
            info = self.storages[key] = _Storage(self.current)
            self.allocated.add(key)
        info.live += 1
        self.holders[id(t)] = weakref.finalize(t, self.dropped, id(t), key)

    def dropped(self, holder: int, key: int) -> None:
        """The program let go of a tensor. When no tensor holds its memory any more, the
        allocator may give it to the next work on its home stream: from where that stream
        has got to now, a kernel of another stream still queued to read it (and not covered
        by ``record_stream``) reads it overwritten."""
        self.holders.pop(holder, None)
        info = self.storages.get(key)
        if info is None:
            return
        info.live -= 1
        if info.live:
            return
        del self.storages[key]
        kept = frozenset(s for (k, s) in self.kept if k == key)
        self.kept -= {(key, s) for s in kept}  # its address may come back for new memory
        self.issue(_Reuse(key, info.home, kept), info.home)

    def reuse(self, item: _Reuse) -> None:
        for stream, items in self.queues.items():
            if stream == item.home or stream in item.kept:
                continue
            for k in items[self.done[stream] :]:
                if isinstance(k, _Kernel) and any(_key(t) == item.key for t in k.reads):
                    k.reused.add(item.key)

    # ----- ops -------------------------------------------------------------------------------
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in STREAM_OPS:
            return self.stream_op(func, args)
        if any(isinstance(a, torch.Tensor) for a in _written(func, args, kwargs)):
            return self.queue_write(func, args, kwargs)
        layout = self.layout(func, args, kwargs)
        if layout is None:  # the host needs values: run what came before on this stream, then it
            self.drain(self.current)
            return self.now(func, args, kwargs)
        if layout.aliases or not layout.leaves:  # a view or a metadata check: no memory read
            return self.now(func, args, kwargs)
        return self.queue_kernel(func, args, kwargs, layout)

    def now(self, func, args, kwargs) -> Any:
        ins = {_key(t) for t in tree_flatten((args, kwargs))[0] if isinstance(t, torch.Tensor)}
        with torch.no_grad():
            out = func(*args, **kwargs)
        for t in tree_flatten(out)[0]:
            if isinstance(t, torch.Tensor):
                self.own(t, fresh=_key(t) not in ins)
        return out

    def stream_op(self, func, args) -> None:
        name = func._schema.name.split("::")[1]
        numbers = {
            a.name: v
            for a, v in zip(func._schema.arguments, args)
            if not isinstance(v, torch.Tensor)
        }
        _check_ids(name, **numbers)
        _note(name, *numbers.values())
        if func is _FX.set_stream.default:
            self.current = args[0]
        elif func is _FX.record_event.default:
            event, stream = args
            self.events[event] = (stream, len(self.queue(stream)))
        elif func is _FX.wait_event.default:
            event, stream = args
            if event in self.events:  # a wait for an event never recorded waits for nothing
                self.issue(_Wait(*self.events[event]), stream)
        else:
            self.kept.add((_key(args[0]), args[1]))

    def layout(self, func, args, kwargs) -> _Layout | None:
        """What ``func`` returns for inputs laid out like these (shapes, strides: from a run
        on fake tensors, remembered per op and input layout); None when the host needs
        values (data-dependent shapes, numbers)."""
        flat, spec = tree_flatten((args, kwargs))
        try:
            key = (func, spec, _layout_key(flat))
        except TypeError:  # an unhashable argument: do not remember
            return self.fake_layout(func, args, kwargs)
        if key not in _LAYOUTS:
            if len(_LAYOUTS) > 20000:
                _LAYOUTS.clear()
            _LAYOUTS[key] = self.fake_layout(func, args, kwargs)
        return _LAYOUTS[key]

    def fake_layout(self, func, args, kwargs) -> _Layout | None:
        mode = _fake_mode()

        def fake(a: Any) -> Any:
            return mode.from_tensor(a, static_shapes=True) if isinstance(a, torch.Tensor) else a

        fake_args, fake_kwargs = tree_map(fake, (args, kwargs))
        try:
            with mode:
                out = func(*fake_args, **fake_kwargs)
        except Exception:  # broad: data-dependent output shapes, no fake kernel: not checked
            return None
        leaves, spec = tree_flatten(out)
        if not all(isinstance(t, torch.Tensor) for t in leaves):
            return None  # a number the host reads
        ins = {
            _key(t)
            for t in tree_flatten((fake_args, fake_kwargs))[0]
            if isinstance(t, torch.Tensor)
        }
        return _Layout(
            [(t.shape, t.stride(), t.dtype, t.fake_device) for t in leaves],
            spec,
            any(_key(t) in ins for t in leaves),
        )

    def queue_kernel(self, func, args, kwargs, layout: _Layout) -> Any:
        placeholders = []
        for shape, stride, dtype, device in layout.leaves:
            p = torch.empty_strided(shape, stride, dtype=dtype, device=device)
            _poison(p)
            placeholders.append(p)
        name = str(func)
        kernel = self.kernel(func, args, kwargs, fills=[p.detach() for p in placeholders])
        for p in placeholders:
            self.unwritten[_key(p)] = f"{name} (stream {self.current})"
            self.own(p, fresh=True)
        self.issue(kernel, self.current)
        return tree_unflatten(placeholders, layout.spec)

    def queue_write(self, func, args, kwargs) -> Any:
        """An in-place (or ``out=``) op: queued; it returns the tensors it writes."""
        self.issue(self.kernel(func, args, kwargs), self.current)
        returned = _returned_writes(func, args, kwargs)
        return returned[0] if len(returned) == 1 else tuple(returned)

    def kernel(self, func, args, kwargs, fills=()) -> _Kernel:
        reads: list[torch.Tensor] = []

        def alias(a: Any) -> Any:
            if isinstance(a, torch.Tensor):
                reads.append(a.detach())
                return reads[-1]
            return a

        call_args, call_kwargs = tree_map(alias, (args, kwargs))
        self.kernels += 1
        return _Kernel(str(func), self.current, func, call_args, call_kwargs, reads, list(fills))

    def finish(self) -> None:
        """The caller reads the results: everything the main stream has queued runs (and
        what it waited for); a side stream's work nobody waited for never runs."""
        for f in list(self.holders.values()):
            f.detach()
        self.holders.clear()
        self.drain(0)


def _slots(func) -> list[tuple[int, str, Any]]:
    return [(i, a.name, a.alias_info) for i, a in enumerate(func._schema.arguments)]


def _arg(args, kwargs, i: int, name: str) -> Any:
    return args[i] if i < len(args) else kwargs.get(name)


def _written(func, args, kwargs) -> list[Any]:
    return [
        _arg(args, kwargs, i, name)
        for i, name, info in _slots(func)
        if info is not None and info.is_write
    ]


def _returned_writes(func, args, kwargs) -> list[Any]:
    """The written arguments ``func`` returns, in the order of its returns."""
    out = []
    for ret in func._schema.returns:
        sets = set(ret.alias_info.before_set) if ret.alias_info is not None else set()
        for i, name, info in _slots(func):
            if info is not None and info.is_write and sets & set(info.before_set):
                out.append(_arg(args, kwargs, i, name))
                break
    return out


def stream_debug(hold: str = "side") -> contextlib.AbstractContextManager[StreamDebug]:
    """Run scheduled graphs inside this block with each stream's kernels held back as
    long as the events allow (``hold``: ``"side"`` or ``"main"``), so a race gives wrong
    outputs on CPU. Yields the :class:`StreamDebug` state (``stale_reads``, ``kernels``)."""
    return _block(StreamDebug(hold))


@contextlib.contextmanager
def _block(debug: StreamDebug) -> Iterator[StreamDebug]:
    debug.issue(_CallerWork(), 0)
    try:  # no autograd: it would keep tensors alive that the graph lets go of
        with torch.no_grad(), debug:
            yield debug
    finally:
        debug.finish()
