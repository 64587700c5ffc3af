"""Where in ``torch.compile`` a pipeline runs, and several named pipelines at once.

A pass that runs too late is defeated by Inductor's own rewrites; one that runs too early
sees a graph that is not functional yet. ``torch.compile`` offers several places, and the
backend (:func:`fxpass.backend`) can put a pipeline at each, in the order torch runs them:

==============================  ===============================================================
hook                            the graph the pipeline sees
==============================  ===============================================================
``dynamo``                      Dynamo's graph (torch functions, real example inputs), before
                                AOTAutograd; the backend runs it, for any compiler
``pre_grad_custom_pass``        the same graph inside Inductor, after Inductor's cache lookup
                                (a cache hit skips it) and Inductor's own pre-grad passes
``joint_custom_pre_pass``       the joint forward+backward ATen graph (the forward graph when
                                not training), before Inductor's joint-graph passes
``joint_custom_post_pass``      the same graph after them
``post_grad_custom_pre_pass``   each forward and backward ATen graph after partitioning,
                                before Inductor's post-grad passes (its pattern matcher)
``post_grad_custom_post_pass``  the same graphs after them, before lowering (vLLM's fusions)
``aot``                         each forward and backward ATen graph AOTAutograd hands a
                                compiler other than Inductor (Torch-TensorRT's lowering)
==============================  ===============================================================

Named pipelines come from Python (``{"post_grad_custom_post_pass": "fuse_add_rmsnorm"}`` or
:class:`Placement` objects), from a config file (TOML or JSON)::

    [pipelines.cleanup]
    hook = "dynamo"
    spec = "remove_assert_ops"

    [pipelines.fusion]
    hook = "post_grad_custom_post_pass"
    spec = "fuse_add_rmsnorm{applies_to=tokens:1..512}"

or from the environment: ``FXPASS_PIPELINES`` holds the path of such a file, or entries
``name@hook=spec`` separated by ``;`` (``name@`` may be left out: the hook names it)::

    FXPASS_PIPELINES="cleanup@dynamo=remove_assert_ops;fusion@post_grad_custom_post_pass=fuse_add_rmsnorm"

Each pipeline's reports say its name and hook (``report.where``);
``backend.reports_for("fusion")`` picks them out.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..core.errors import FxpassError, SpecError
from ..core.spec import resolve_pipeline

__all__ = [
    "ENV",
    "HOOKS",
    "INDUCTOR_HOOKS",
    "Placement",
    "PipelinesConfigError",
    "load_pipelines",
    "parse_pipelines",
    "pipelines_from_env",
    "placements",
]

ENV = "FXPASS_PIPELINES"

#: Inductor's custom-pass hooks, in the order a compile runs them.
INDUCTOR_HOOKS = (
    "pre_grad_custom_pass",
    "joint_custom_pre_pass",
    "joint_custom_post_pass",
    "post_grad_custom_pre_pass",
    "post_grad_custom_post_pass",
)
#: Every hook, in the order torch runs them (``aot`` replaces Inductor's hooks when the
#: compiler is not Inductor).
HOOKS = ("dynamo", *INDUCTOR_HOOKS, "aot")


class PipelinesConfigError(FxpassError, ValueError):
    """Named pipelines are configured wrongly (an unknown hook, a name given twice, ...)."""


@dataclass(frozen=True)
class Placement:
    """The pipeline ``pipeline`` (a spec, a Pipeline, passes), called ``name``, at ``hook``."""

    name: str
    hook: str
    pipeline: Any = None

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name.strip():
            raise PipelinesConfigError(
                f"a pipeline's name is a non-empty string, not {self.name!r}"
            )
        check_hook(self.hook, f"pipeline '{self.name}'")


def check_hook(hook: Any, what: str = "a pipeline") -> None:
    if hook not in HOOKS:
        raise PipelinesConfigError(
            f"{what}: unknown hook {hook!r}; the hooks, in the order torch runs them: "
            + ", ".join(HOOKS)
        )


def placements(value: Any) -> list[Placement]:
    """Named pipelines from what :func:`fxpass.backend` takes as ``pipelines``: a mapping
    ``{hook: pipeline}``, Placements, ``(name, hook, pipeline)`` triples, or a config file's
    path. Names are unique; pipelines given as specs are checked now."""
    if isinstance(value, (str, os.PathLike)):
        return load_pipelines(value)
    if isinstance(value, Mapping):
        out = [Placement(str(hook), str(hook), p) for hook, p in value.items()]
    elif isinstance(value, Iterable):
        out = []
        for item in value:
            if isinstance(item, Placement):
                out.append(item)
            elif isinstance(item, tuple) and len(item) == 3:
                out.append(Placement(*item))
            else:
                raise PipelinesConfigError(
                    "pipelines are a {hook: pipeline} mapping, Placement objects, "
                    f"(name, hook, pipeline) triples or a config file, not {item!r}"
                )
    else:
        raise PipelinesConfigError(f"pipelines cannot be {type(value).__name__}: {value!r}")
    return _checked(out)


def _checked(out: list[Placement]) -> list[Placement]:
    if not out:
        raise PipelinesConfigError("no pipelines configured: give at least one")
    seen: set[str] = set()
    for p in out:
        if p.name in seen:
            raise PipelinesConfigError(f"two pipelines are called '{p.name}'; name them apart")
        seen.add(p.name)
        if isinstance(p.pipeline, str):
            resolve_pipeline(p.pipeline)  # a bad spec is an error now, with its column
    return out


def parse_pipelines(text: str) -> list[Placement]:
    """``name@hook=spec;name@hook=spec`` (what ``FXPASS_PIPELINES`` holds inline). A bad
    entry is a :class:`~fxpass.SpecError` pointing at its column in ``text``."""
    out: list[Placement] = []
    start = 0
    for entry in text.split(";"):
        offset = start + len(entry) - len(entry.lstrip())
        start += len(entry) + 1
        entry = entry.strip()
        if not entry:
            continue
        head, eq, spec = entry.partition("=")
        if not eq:
            raise SpecError(f"{ENV}: expected name@hook=spec, got '{entry}'", text, offset + 1)
        name, at, hook = head.strip().rpartition("@")
        hook = hook.strip()
        if hook not in HOOKS:
            column = offset + (len(name) + 1 if at else 0) + 1
            raise SpecError(
                f"{ENV}: unknown hook '{hook}'; hooks: {', '.join(HOOKS)}", text, column
            )
        spec_at = offset + len(head) + 1
        try:
            resolve_pipeline(spec)
        except SpecError as e:
            raise SpecError(f"{ENV}: {e.message}", text, spec_at + e.column) from None
        out.append(Placement(name.strip() if at else hook, hook, spec.strip()))
    return _checked(out)


def load_pipelines(path: str | os.PathLike) -> list[Placement]:
    """Named pipelines from a TOML or JSON file: ``[pipelines.NAME]`` tables (TOML) or a
    ``{"pipelines": {NAME: {...}}}`` object (JSON), each with ``hook`` and ``spec``."""
    path = Path(path)
    if not path.is_file():
        raise PipelinesConfigError(f"no pipelines config file at {path}")
    try:
        if path.suffix == ".toml":
            import tomllib

            data = tomllib.loads(path.read_text())
        else:
            data = json.loads(path.read_text())
    except ModuleNotFoundError:  # Python 3.10 has no tomllib
        raise PipelinesConfigError(
            f"{path}: reading TOML needs Python 3.11; write the config as JSON"
        ) from None
    except ValueError as e:
        raise PipelinesConfigError(
            f"{path} is not valid {path.suffix[1:] or 'JSON'}: {e}"
        ) from None
    table = data.get("pipelines") if isinstance(data, dict) else None
    if not isinstance(table, dict) or not table:
        raise PipelinesConfigError(
            f"{path}: expected a 'pipelines' table with one entry per pipeline"
        )
    out = []
    for name, entry in table.items():
        if not isinstance(entry, dict) or set(entry) - {"hook", "spec"} or "hook" not in entry:
            raise PipelinesConfigError(
                f"{path}: pipeline '{name}' has the keys hook and spec, not {entry!r}"
            )
        spec = entry.get("spec")
        try:
            out.append(Placement(name, entry["hook"], spec))
            if spec is not None:
                resolve_pipeline(spec)
        except SpecError as e:
            raise PipelinesConfigError(f"{path}: pipeline '{name}': {e}") from None
    return _checked(out)


def pipelines_from_env() -> list[Placement] | None:
    """The pipelines ``FXPASS_PIPELINES`` configures (a config file's path or inline
    entries), or None when it is unset or blank."""
    value = os.environ.get(ENV, "").strip()
    if not value:
        return None
    if not any(c in value for c in "=;") and (
        value.endswith((".toml", ".json")) or os.path.exists(value)
    ):
        return load_pipelines(value)
    return parse_pipelines(value)
