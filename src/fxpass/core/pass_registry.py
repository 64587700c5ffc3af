"""Named passes with typed options, ordered pass lists, and plug-ins from entry points.

>>> import fxpass as fp
>>> @fp.register("drop_dropout")
... def drop_dropout(gm, *, p: float = 0.0) -> bool:
...     '''Remove eval-mode dropout.'''
...     ...

``fp.registry.names()`` lists every registered pass, ``fp.registry.create("cse")`` makes one,
``fp.Pipeline.parse("drop_dropout{p=0.1}")`` uses the options. Third-party packages register
passes through the ``fxpass.passes`` entry-point group (a module that registers passes when
imported, or a pass object registered under the entry point's name).

Pass lists are ordered lists of registered names, like Torch-TensorRT's ATen lowering list:
``@fp.register("my_pass", index=0)`` inserts into the ``default`` list (the pipeline the
demo, the backend and the CLI run when given no spec), ``pass_list="name"`` picks another,
and :meth:`PassList.dump`, :meth:`PassList.remove`, :meth:`PassList.apply` do the rest.
"""

from __future__ import annotations

import copy
import difflib
import inspect
import re
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from importlib import metadata
from typing import Any

from torch import fx

from ..fxutil.messages import INPUT_LIMIT
from .analysis_manager import preserved_names
from .contract import FunctionPass, Pass, is_lowering, metadata_keys, pass_of
from .errors import OptionError, UnknownPassError
from .imports import resolve_import
from .options import Option, _Mismatch, bind_options, format_value, options_of, unknown_option
from .ranges import format_ranges, to_ranges
from .run import DISABLED, PassResult

__all__ = [
    "REGISTRY",
    "PassInfo",
    "PassList",
    "Registry",
    "applies_to",
    "as_pass",
    "register",
    "resolve_import",
]

ENTRY_POINT_GROUP = "fxpass.passes"


_ROLE = re.compile(r":[\w:.]+:`~?([^`<]*?)\s*(?:<[^>]*>)?`")


def plain_text(rst: str) -> str:
    """Docstring markup as plain text: ````x```` -> x, ``:func:`~a.b.f``` -> f."""
    text = _ROLE.sub(
        lambda m: m.group(1).rsplit(".", 1)[-1] if "~" in m.group(0) else m.group(1), rst
    )
    return text.replace("``", "")


def _summary(obj: Any) -> tuple[str, str]:
    doc = inspect.getdoc(obj) or ""
    first = doc.strip().split("\n\n", 1)[0].replace("\n", " ") if doc else ""
    return plain_text(first), doc


def _source(obj: Any) -> str:
    try:
        target = inspect.unwrap(obj)
        return f"{inspect.getsourcefile(target)}:{inspect.getsourcelines(target)[1]}"
    except (TypeError, OSError):
        return getattr(obj, "__module__", "") or ""


@dataclass
class PassInfo:
    """A registered pass: how to make it, its options and its documentation."""

    name: str
    factory: Callable[..., Pass]
    options: dict[str, Option] = field(default_factory=dict)
    summary: str = ""
    doc: str = ""
    source: str = ""
    origin: str = "fxpass"
    takes_pipeline: bool = False
    statistics: Mapping[str, str] = field(default_factory=dict)
    #: what was registered (the function, Pass class or object), for import references
    target: Any = None

    def create(
        self,
        options: Mapping[str, Any] | None = None,
        children: Sequence[Any] | None = None,
        *,
        spec: str | None = None,
    ) -> Pass:
        """Make the pass with ``options`` (validated); ``spec`` overrides how it prints."""
        return self.make(self.bind(options or {}), children, spec=spec)

    def bind(self, options: Mapping[str, Any], *, written: bool = False) -> dict[str, Any]:
        """The options checked and converted (``written``: ``(text, quoted)`` from a spec)."""
        return bind_options(self.options, options, self.name, written=written)

    def make(
        self,
        values: Mapping[str, Any],
        children: Sequence[Any] | None = None,
        *,
        spec: str | None = None,
    ) -> Pass:
        """Make the pass from options :meth:`bind` returned."""
        if self.takes_pipeline:
            p = self.factory(list(children or ()), **values)
        elif children is not None:
            raise _Mismatch(f"pass '{self.name}' does not take a nested pipeline")
        else:
            p = self.factory(**values)
        if spec is None:
            spec = self.name
            if values:
                spec += "{" + " ".join(f"{k}={format_value(v)}" for k, v in values.items()) + "}"
            if self.takes_pipeline:
                spec += "(" + ",".join(_as_pass_spec(c) for c in children or ()) + ")"
        p.written_as = spec
        p.name = self.name
        return p

    def unknown_option(self, key: str) -> str:
        """The message for an option this pass does not have."""
        return unknown_option(self.options, key, self.name)


def _as_pass_spec(p: Any) -> str:
    return p.spec if isinstance(p, Pass) else str(p)


class PassList:
    """An ordered list of registered pass names (Torch-TensorRT's lowering-pass list)."""

    def __init__(self, registry: Registry, name: str) -> None:
        self.registry = registry
        self.name = name
        self._names: list[str] = []

    def insert(self, name: str, index: int | None = None) -> None:
        """Insert the registered pass ``name`` at ``index`` (the end when None)."""
        if name not in self.registry._infos:
            self.registry.get(name)  # raises UnknownPassError with suggestions
        if index is None:
            self._names.append(name)
        else:
            self._names.insert(index, name)

    def remove(self, key: str | int) -> str:
        """Remove a pass by name or by index; returns the name removed."""
        if isinstance(key, int):
            if not -len(self._names) <= key < len(self._names):
                raise IndexError(
                    f"pass list '{self.name}' has {len(self._names)} passes; no index {key}"
                )
            return self._names.pop(key)
        if key not in self._names:
            raise KeyError(f"pass list '{self.name}' has no pass '{key}'; it has {self._names}")
        self._names.remove(key)
        return key

    def names(self) -> list[str]:
        return list(self._names)

    def __len__(self) -> int:
        return len(self._names)

    def __iter__(self):
        return iter(list(self._names))

    def __contains__(self, name: object) -> bool:
        return name in self._names

    def pipeline(self) -> Any:
        """A :class:`~fxpass.Pipeline` of the list's passes, as it stands now (made by the
        registry's ``pipeline`` pass)."""
        if "pipeline" not in self.registry._infos:
            raise LookupError(
                f"pass list '{self.name}' cannot make a pipeline: its registry has no 'pipeline' "
                "pass; register it with fxpass.core.pipeline.register_pipelines(registry)"
            )
        pipe = self.registry.create("pipeline", [self.registry.create(n) for n in self._names])
        pipe.name, pipe.written_as = self.name, None
        return pipe

    def apply(self, gm: fx.GraphModule, sample_inputs: Sequence[Any] | None = None) -> PassResult:
        """Run the list's passes on ``gm`` (Torch-TensorRT's ``apply_lowering_passes``)."""
        return self.pipeline().run(gm, sample_inputs)

    def dump(self) -> str:
        """The list as text, one pass per line with its index (``dump_lowering_passes``)."""
        lines = [f"pass list '{self.name}' ({len(self._names)} passes):"]
        for i, name in enumerate(self._names):
            info = self.registry.get(name)
            state = "" if self.registry.is_enabled(name) else "  [disabled]"
            lines.append(f"  {i:>3}  {name:<28} {info.summary}{state}")
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.dump()


def _declarations(applies_to: Any, needs: Sequence[str], followed_by: Sequence[str]) -> dict:
    """What ``register`` sets on a pass besides its name, checked now (a bad value is an
    error where the pass is registered, not where it first runs)."""
    for what, names in (("needs", needs), ("followed_by", followed_by)):
        if isinstance(names, str) or not all(isinstance(n, str) and n for n in names):
            raise TypeError(f"{what} is a list of registered pass names, not {names!r}")
    return {
        "applies_to": to_ranges(applies_to) if applies_to is not None else None,
        "needs": tuple(needs),
        "followed_by": tuple(followed_by),
    }


class Registry:
    """Names -> pass factories. :data:`REGISTRY` is the one fxpass uses."""

    def __init__(self, *, entry_points: bool = True, disabled: set[str] | None = None) -> None:
        """``entry_points``: load plug-ins on first lookup; ``disabled``: the set of names
        :meth:`disable` adds to (fxpass's registry shares the one every run skips)."""
        self._infos: dict[str, PassInfo] = {}
        self._disabled: set[str] = set() if disabled is None else disabled
        self._lists: dict[str, PassList] = {}
        self._load_entry_points = entry_points
        self._plugins_loaded = not entry_points
        self.plugin_errors: list[str] = []

    # ----- registering ------------------------------------------------------------------
    def register(
        self,
        name: str | Callable | None = None,
        *,
        index: int | None = None,
        pass_list: str | None = None,
        takes_pipeline: bool = False,
        replace: bool = False,
        origin: str = "user",
        statistics: Mapping[str, str] | None = None,
        applies_to: Mapping[str, Any] | str | None = None,
        needs: Sequence[str] = (),
        followed_by: Sequence[str] = (),
        preserves: Sequence[Any] | None = None,
        keeps: Sequence[str] | str | None = None,
        edits: str | None = None,
    ) -> Any:
        """Register a pass function, :class:`Pass` subclass or object, or pipeline factory.

        Use as ``@register``, ``@register("name")`` or ``@register("name", index=0)``, or
        call it on a pass object: ``register(RuleSet("fold", [...]))`` registers the rule set
        under its own name and returns it. With ``index`` or ``pass_list`` the pass is also
        inserted into that pass list (``default`` when only ``index`` is given). Options
        come from the signature (see :mod:`fxpass.core.options`); ``statistics`` declares
        what the pass counts (name -> description; it becomes the pass's ``statistics``);
        ``applies_to`` limits the pass to ranges of symbolic sizes (see
        :mod:`fxpass.core.ranges`); ``needs`` and ``followed_by`` name passes that must run
        before and after it (see :mod:`fxpass.core.requirements`); ``preserves`` the analyses
        it keeps valid (see :mod:`fxpass.core.analysis_manager`); ``keeps`` the node metadata
        it keeps valid (see :data:`fxpass.core.contract.METADATA`); ``origin`` where it comes
        from (``fxpass list`` shows it; see :func:`register`); ``edits="editor"`` that every
        change it makes goes through the editor (a failed run then undoes it from the
        editor's journal instead of a whole-graph snapshot).
        Registering a taken name is an error unless ``replace``.
        """
        declared = _declarations(applies_to, needs, followed_by)
        if callable(name) and not isinstance(name, str):
            return self.register(
                None,
                index=index,
                pass_list=pass_list,
                replace=replace,
                origin=origin,
                statistics=statistics,
                **declared,
                preserves=preserves,
                keeps=keeps,
                edits=edits,
            )(name)

        def decorate(obj: Any) -> Any:
            if statistics is not None:
                obj.statistics = dict(statistics)
            for attr, value in declared.items():
                if value:
                    setattr(obj, attr, value)
            if preserves is not None:
                preserved_names(preserves)  # a clear error now, not when the pass runs
                obj.preserves = tuple(preserves)
            if keeps is not None:
                who = f"pass '{name or getattr(obj, 'name', None) or obj.__name__}'"
                obj.keeps = metadata_keys(keeps, who)
            if edits is not None:
                if edits not in ("editor", "any"):
                    raise ValueError(f"edits= takes 'editor' or 'any', got {edits!r}")
                obj.edits = edits
            info = self._info_for(obj, name, takes_pipeline, origin)
            if info.name in self._infos and not replace:
                raise ValueError(
                    f"a pass named '{info.name}' is already registered (from "
                    f"{self._infos[info.name].source}); pick another name or pass replace=True"
                )
            self._infos[info.name] = info
            if index is not None or pass_list is not None:
                self.pass_list(pass_list or "default").insert(info.name, index)
            return obj

        return decorate

    def _info_for(self, obj: Any, name: str | None, takes_pipeline: bool, origin: str) -> PassInfo:
        summary, doc = _summary(obj)
        if isinstance(obj, type) and issubclass(obj, Pass):
            pname = name or obj.name
            factory = obj
            options = options_of(obj, skip=1 if takes_pipeline else 0)
        elif isinstance(obj, Pass):  # a ready instance: no options
            pname = name or obj.name
            factory = lambda: obj  # noqa: E731
            options = {}
        elif callable(obj):
            pname = name or obj.__name__
            lowering = is_lowering(obj)
            options = options_of(obj, skip=2 if lowering else 1)
            needs_code = getattr(obj, "needs_code", None)

            def factory(_fn=obj, _name=pname, _low=lowering, **opts):
                return FunctionPass(_fn, _name, lowering=_low, needs_code=needs_code, options=opts)

        else:
            raise TypeError(f"cannot register {obj!r}: expected a function or a Pass subclass")
        return PassInfo(
            name=pname,
            factory=factory,
            options=options,
            summary=summary,
            doc=doc,
            source=_source(obj),
            origin=origin,
            takes_pipeline=takes_pipeline,
            statistics=dict(getattr(obj, "statistics", {}) or {}),
            target=obj,
        )

    def register_factory(
        self, factory: Callable[..., Pass], *, takes_pipeline: bool = False, origin: str = "fxpass"
    ) -> None:
        """Register ``factory`` (a function or :class:`Pass` class that makes the pass, e.g. a
        pipeline) under its own name; its options come from its signature, after the list
        of nested passes when ``takes_pipeline``."""
        info = self._info_for(factory, None, takes_pipeline, origin)
        info.factory = factory
        self._infos[info.name] = info

    def unregister(self, name: str) -> PassInfo:
        """Forget a registered pass (and drop it from every pass list)."""
        info = self.get(name)
        del self._infos[name]
        for plist in self._lists.values():
            while name in plist:
                plist.remove(name)
        return info

    # ----- looking up -------------------------------------------------------------------
    def _ensure_plugins(self) -> None:
        if self._plugins_loaded:
            return
        self._plugins_loaded = True
        for ep in metadata.entry_points(group=ENTRY_POINT_GROUP):
            dist = getattr(getattr(ep, "dist", None), "name", "?")
            try:
                obj = ep.load()
                if not inspect.ismodule(obj) and ep.name not in self._infos:
                    self.register(ep.name, origin=f"plugin {dist}")(obj)
            except Exception as e:  # a broken plug-in must not break fxpass
                msg = (
                    f"could not load pass plug-in '{ep.name}' ({ep.value}) from "
                    f"distribution '{dist}': {type(e).__name__}: {e}"
                )
                self.plugin_errors.append(msg)
                warnings.warn(f"fxpass: {msg}", stacklevel=3)

    def names(self) -> list[str]:
        """Every registered pass name, sorted."""
        self._ensure_plugins()
        return sorted(self._infos)

    def __contains__(self, name: object) -> bool:
        self._ensure_plugins()
        return name in self._infos

    def get(self, name: str) -> PassInfo:
        """The :class:`PassInfo` of ``name``; an unknown name suggests the closest ones.
        Plug-ins are loaded for a name not registered yet (they never replace a registered
        pass), so looking up fxpass's own passes does not pay for scanning every installed
        distribution's entry points (~10 ms on a first run)."""
        hit = self._infos.get(name)
        if hit is not None:
            return hit
        self._ensure_plugins()
        try:
            return self._infos[name]
        except KeyError:
            close = (  # a name far longer than any registered one is close to none
                difflib.get_close_matches(name, list(self._infos), n=3, cutoff=0.6)
                if len(name) <= INPUT_LIMIT
                else []
            )
            raise UnknownPassError(name, close) from None

    def info_of(self, obj: Any) -> PassInfo | None:
        """The :class:`PassInfo` under which ``obj`` (a function, Pass class or object) is
        registered, or None."""
        self._ensure_plugins()
        return next((i for i in self._infos.values() if i.target is obj), None)

    def create(self, name: str, children: Sequence[Any] | None = None, **options: Any) -> Pass:
        """Make the pass registered as ``name`` with ``options``."""
        info = self.get(name)
        try:
            return info.create(options, children)
        except _Mismatch as e:
            raise OptionError(str(e), name, 1) from None

    def infos(self) -> list[PassInfo]:
        return [self._infos[n] for n in self.names()]

    # ----- enabling ---------------------------------------------------------------------
    def disable(self, name: str) -> None:
        """Skip this pass wherever it appears (runs report it as skipped)."""
        self.get(name)
        self._disabled.add(name)

    def enable(self, name: str) -> None:
        self.get(name)
        self._disabled.discard(name)

    def is_enabled(self, name: str) -> bool:
        return name not in self._disabled

    # ----- pass lists -------------------------------------------------------------------
    def pass_list(self, name: str = "default") -> PassList:
        """The pass list called ``name`` (made empty on first use)."""
        if name not in self._lists:
            self._lists[name] = PassList(self, name)
        return self._lists[name]

    def dump(self) -> str:
        """Every registered pass with its options and summary."""
        lines = []
        for info in self.infos():
            opts = ", ".join(o.describe() for o in info.options.values())
            lines.append(f"{info.name:<28} {info.summary}")
            if opts:
                lines.append(f"{'':<28} options: {opts}")
        return "\n".join(lines)


REGISTRY = Registry(disabled=DISABLED)


def register(
    name: str | Callable | None = None,
    *,
    index: int | None = None,
    pass_list: str | None = None,
    replace: bool = False,
    statistics: Mapping[str, str] | None = None,
    applies_to: Mapping[str, Any] | str | None = None,
    needs: Sequence[str] = (),
    followed_by: Sequence[str] = (),
    preserves: Sequence[Any] | None = None,
    keeps: Sequence[str] | str | None = None,
    origin: str = "user",
    edits: str | None = None,
) -> Any:
    """Register a pass in fxpass's registry (see :meth:`Registry.register`).

    ``@register("name", statistics={"merged": "nodes merged"})`` declares what the pass
    counts with :func:`fxpass.stat`; ``register(rule_set)`` registers a pass object (a
    :class:`~fxpass.RuleSet`, a ``Pipeline``) under its own name. ``applies_to={"tokens":
    (1, 512)}`` limits it to a range of a symbolic size; ``needs=["remove_assert_ops"]`` and
    ``followed_by=["dce"]`` are passes that must run before and after it;
    ``preserves=[positions]`` the analyses it keeps valid; ``keeps=("val", "stack_trace")``
    the node metadata it keeps valid.

    ``origin`` says where the pass comes from (``fxpass list`` shows it): ``"user"`` for a
    pass a program registers as it runs; a library whose import registers its passes names
    itself (fxpass's own passes say ``origin="fxpass"``), and a crash reproducer then names
    such a pass by its registered name instead of its import path.
    """
    return REGISTRY.register(
        name,
        index=index,
        pass_list=pass_list,
        replace=replace,
        statistics=statistics,
        applies_to=applies_to,
        needs=needs,
        followed_by=followed_by,
        preserves=preserves,
        keeps=keeps,
        origin=origin,
        edits=edits,
    )


def as_pass(obj: Any) -> Pass:
    """Turn anything a pipeline accepts into a :class:`~fxpass.Pass`: a registered name
    makes that pass, anything else is wrapped by :func:`fxpass.core.contract.pass_of`."""
    if isinstance(obj, str):
        return REGISTRY.create(obj)
    return pass_of(obj)


def applies_to(p: Any, ranges: Mapping[str, Any] | str | None = None, **sizes: Any) -> Pass:
    """A copy of the pass ``p`` (anything :func:`as_pass` takes) limited to ``ranges``:
    ``applies_to(fuse_x, tokens=(1, 512))``. It prints as ``fuse_x{applies_to=tokens:1..512}``.
    """
    given = dict(to_ranges(ranges)) if ranges is not None else {}
    given.update(to_ranges(sizes) if sizes else {})
    if not given:
        raise ValueError("applies_to needs at least one size range, e.g. tokens=(1, 512)")
    base = as_pass(p)
    new = copy.copy(base)
    new.applies_to = given
    new.written_as = _with_option(base.spec, f"applies_to={format_ranges(given)}")
    return new


_OLD_OPTION = re.compile(r"\s*applies_to=(\[[^\]]*\]|[^\s},]+)")


def _with_option(text: str, option: str) -> str:
    """``name(...)`` -> ``name{option}(...)``; an ``applies_to`` written before is replaced."""
    head, paren, rest = text.partition("(")
    head = _OLD_OPTION.sub("", head).replace("{}", "")
    if head.endswith("}"):
        return f"{head[:-1]} {option}}}{paren}{rest}"
    return f"{head}{{{option}}}{paren}{rest}"
