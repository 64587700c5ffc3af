"""What every command shares: exit codes, the one-line error, consoles, JSON, safe writes."""

from __future__ import annotations

import json
import os
import re
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import click
from rich.console import Console

from ..fxutil import files
from ..fxutil.messages import clip

# Exit codes (documented in `fxpass --help` and docs/cli.md).
OK = 0
FAILED = 1  # a pass failed (the input was left unchanged); `diff --exit-code`: graphs differ
USAGE = 2  # bad command line: unknown option, malformed pipeline spec, unknown pass
LOAD = 3  # the TARGET could not be loaded: missing, corrupt, unsafe, or its import failed
NUMERICS = 4  # numerics diverged (`run --verify`, `bisect` found the breaking pass)
WRITE = 5  # an output file could not be written
INTERNAL = 70  # a bug in fxpass or in a pass's Python code outside a pipeline run
INTERRUPTED = 130

EXIT_CODES = [
    (OK, "ok"),
    (FAILED, "a pass failed (the input was left unchanged); diff --exit-code: graphs differ"),
    (USAGE, "bad command line: option, pipeline spec, pass name or option value"),
    (LOAD, "TARGET cannot be loaded: missing, damaged, unsafe, or its import failed"),
    (NUMERICS, "numerics diverged (run --verify, demo, bisect found the breaking pass)"),
    (WRITE, "an output file cannot be written"),
    (INTERNAL, "internal error (a bug: --debug shows the traceback)"),
    (INTERRUPTED, "interrupted"),
]
EXIT_CODES_HELP = "Exit codes:\n" + "\n".join(f"  {c:<4} {text}" for c, text in EXIT_CODES)


def plural(n: int, word: str) -> str:
    """``1 layer``, ``2 layers``: a count and its noun, agreeing."""
    return f"{n} {word}{'' if n == 1 else 's'}"


class CliError(Exception):
    """An error the command reports as one line, with an exit code."""

    def __init__(self, message: str, code: int = FAILED) -> None:
        super().__init__(message)
        self.code = code


def stdout() -> Console:
    """Results: colour only on a terminal, NO_COLOR honoured (rich reads the environment)."""
    return Console(highlight=False, soft_wrap=False)


def stderr() -> Console:
    return Console(stderr=True, highlight=False)


_EMITTED = [False]  # whether this command already printed its JSON object


def emit_json(data: Any) -> None:
    _EMITTED[0] = True
    sys.stdout.write(json.dumps(data, indent=2, default=str) + "\n")
    sys.stdout.flush()


def begin_command() -> None:
    """A command starts: it has printed no JSON object yet (``main`` may run several in one
    process: a library's or a test's)."""
    _EMITTED[0] = False


def emit_json_error(message: str, code: int) -> None:
    """With --json, a failed command still prints one JSON object (unless it already did)."""
    if not _EMITTED[0]:
        emit_json({"ok": False, "error": message, "exit_code": code})


def check_writable(path: str | os.PathLike, what: str) -> Path:
    """Fail early, before any work, when ``path`` cannot be written."""
    path = Path(path)
    parent = path.parent if str(path.parent) else Path(".")
    where = f"cannot write the {what} to {clip(str(path))}"
    try:
        if path.is_dir():
            raise CliError(f"{where}: it is a directory", WRITE)
        if not parent.is_dir():
            raise CliError(f"{where}: folder {clip(str(parent))} does not exist", WRITE)
    except OSError as e:  # a name the system cannot look up (too long, ...)
        raise CliError(f"{where}: {e.strerror or e}", WRITE) from e
    if not os.access(parent, os.W_OK):
        raise CliError(f"{where}: folder {clip(str(parent))} is not writable", WRITE)
    return path


def check_folder(path: str | os.PathLike, what: str) -> Path:
    """Fail early, before any work, when ``path`` cannot be a folder to write in (made when
    first written): it is a file, or a name the system cannot look up."""
    path = Path(path).expanduser()
    where = f"cannot use {clip(str(path))} as the {what} folder"
    try:
        if path.exists() and not path.is_dir():
            raise CliError(f"{where}: it is a file", WRITE)
    except OSError as e:
        raise CliError(f"{where}: {e.strerror or e}", WRITE) from e
    return path


def write_atomic(path: str | os.PathLike, write: Callable[[str], Any], what: str) -> Path:
    """Write through ``write(tmp_path)`` to a temporary file, then rename it into place
    (:func:`fxpass.fxutil.files.write_atomic`); returns the absolute path written (what the
    commands print). A failure to write is one line, exit 5."""
    path = check_writable(path, what)
    try:
        files.write_atomic(path, write)
    except OSError as e:
        raise CliError(
            f"cannot write the {what} to {clip(str(path))}: {e.strerror or e}", WRITE
        ) from e
    return path.absolute()


# ----- the one import rule: --import MODULE and $FXPASS_IMPORT, on every command that loads --
IMPORT_ENV = "FXPASS_IMPORT"
#: ``--import auto`` (or ``auto`` in ``$FXPASS_IMPORT``): import the module fxpass itself names
#: as needed — the installed module whose source registers an op the program calls — saying so.
AUTO = "auto"


def modules_named(imports: Sequence[str]) -> list[str]:
    """The modules among ``imports`` (without ``auto``)."""
    return [m for m in imports if m != AUTO]


def allowed_imports(given: Sequence[str]) -> list[str]:
    """The modules to import: ``$FXPASS_IMPORT`` (comma or space separated), then ``--import``."""
    from_env = re.split(r"[,\s]+", os.environ.get(IMPORT_ENV, "").strip())
    out: list[str] = []
    for name in [*from_env, *given]:
        if name and name not in out:
            out.append(name)
    return out


def import_allowed(imports: Sequence[str]) -> None:
    """Import the ``--import`` modules (and FXPASS_IMPORT's); a failure is one line, exit 3."""
    from ..core.imports import import_modules

    for module in modules_named(imports):
        try:
            import_modules([module])
        except Exception as e:
            raise CliError(
                f"cannot import {clip(module)} (named by --import or {IMPORT_ENV}): "
                f"{type(e).__name__}: {clip(str(e), 160)}",
                LOAD,
            ) from e


def _import_now(_ctx: click.Context, _param: click.Parameter, given: tuple[str, ...]) -> list[str]:
    imports = allowed_imports(given)
    import_allowed(imports)  # before anything else: a module may register ops, passes, types
    return imports


def import_option(fn: Any) -> Any:
    """``--import MODULE`` (repeatable) and ``$FXPASS_IMPORT``, for every command that loads a
    program: the modules are imported while the command line is read, before the command
    runs, and the command gets their names (``imports``) to pass on to what it loads."""
    return click.option(
        "--import",
        "imports",
        multiple=True,
        metavar="MODULE",
        callback=_import_now,
        help=f"Import MODULE first (repeatable; also ${IMPORT_ENV}, comma-separated): it may "
        "register ops, passes and output types, e.g. --import transformers.integrations.moe. "
        "--import auto imports the module that registers an op the program calls, when "
        "fxpass finds one, and says so.",
    )(fn)
