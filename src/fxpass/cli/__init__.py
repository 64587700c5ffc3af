"""The ``fxpass`` command (also ``python -m fxpass``): a thin layer over the library.

Every error is one line on stderr (``error: ...``) with a documented exit code; ``--debug``
(anywhere on the command line, or ``FXPASS_DEBUG=1``) adds the traceback.
"""

from __future__ import annotations

import os
import sys
import traceback
import warnings
from collections.abc import Sequence

import click

from ..fxutil.messages import cap, error_summary, first_line
from ._common import (
    EXIT_CODES_HELP,
    FAILED,
    INTERNAL,
    INTERRUPTED,
    LOAD,
    NUMERICS,
    OK,
    USAGE,
    CliError,
    begin_command,
    emit_json_error,
    stderr,
)
from .check_ranks import check_ranks_cmd
from .commands import bisect_cmd, diff, list_cmd, repro, run, show
from .demo import demo
from .shard import shard_cmd

__all__ = ["cli", "main"]


@click.group(
    context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100},
    epilog="\b\n" + EXIT_CODES_HELP,
)
@click.option("--debug", is_flag=True, help="Show tracebacks on errors.")
@click.version_option(package_name="fxpass", prog_name="fxpass")
def cli(debug: bool) -> None:
    """Write, compose, inspect, verify and apply compiler passes on PyTorch FX graphs.

    TARGET is a .pt2 file (torch.export.save), a .fxgraph file, or module:function: a
    Python function that returns (model, example_inputs), an ExportedProgram or a
    GraphModule. Loading .pt2 and .fxgraph files runs no code; module:function imports and
    runs your code, because you asked for it. Color only on a terminal; NO_COLOR is honoured.
    """


_SHORT = {
    demo: "The whole job on the embedded tiny Llama model; writes report.html.",
    list_cmd: "Registered passes, their options and one-line docs.",
    show: "Print a graph, or the graph before and after a pass.",
    run: "Run a pipeline on TARGET: table, IR, timing, verify, report, save.",
    diff: "What differs between the graphs of two TARGETs.",
    bisect_cmd: "Find the first pass and rewrite that break numerics.",
    repro: "Re-run a crash reproducer; it fails as the original did.",
}
for _command, _short in _SHORT.items():
    _command.short_help = _short
    cli.add_command(_command)
cli.add_command(shard_cmd)
cli.add_command(check_ranks_cmd)


def _error(message: str) -> None:
    console = stderr()
    console.print("error: ", style="bold red", end="")
    console.print(message, markup=False, highlight=False, soft_wrap=True)


def _code_for(e: BaseException) -> tuple[int, str]:
    from ..core.errors import FxpassError, PassFailedError, SpecError
    from ..verify.compare import NumericsError
    from ._run import spec_error_line

    if isinstance(e, CliError):
        return e.code, str(e)
    if isinstance(e, click.exceptions.UsageError):
        where = f" (see '{e.ctx.command_path} --help')" if e.ctx is not None else ""
        return USAGE, f"{e.format_message()}{where}"
    if isinstance(e, SpecError):
        return USAGE, spec_error_line(e)
    if isinstance(e, PassFailedError):
        line = first_line(e)
        tail = " (the input was left unchanged)" if e.restored else ""
        if e.reproducer:
            tail += f"; reproduce with: {e.reproducer}"
        return FAILED, line + tail
    if isinstance(e, NumericsError):
        return NUMERICS, first_line(e)
    if isinstance(e, FxpassError):
        return FAILED, first_line(e)
    if isinstance(e, click.exceptions.FileError):
        return LOAD, e.format_message()
    return INTERNAL, f"internal error: {error_summary(e)} (run with --debug for the traceback)"


def main(argv: Sequence[str] | None = None) -> None:
    """Run the command line ``argv`` (default: ``sys.argv[1:]``) and exit with its code."""
    args = list(sys.argv[1:] if argv is None else argv)
    debug = "--debug" in args or os.environ.get("FXPASS_DEBUG") == "1"
    args = [a for a in args if a != "--debug"]
    if not debug:  # torch's deprecation chatter is noise on a command line
        warnings.filterwarnings("ignore", category=FutureWarning)
        warnings.filterwarnings("ignore", category=DeprecationWarning)
    begin_command()
    try:
        rv = cli.main(args=args, prog_name="fxpass", standalone_mode=False)
        code = rv if isinstance(rv, int) else OK
    except click.exceptions.NoArgsIsHelpError as e:
        click.echo(e.ctx.get_help())
        code = OK
    except click.exceptions.Exit as e:
        code = e.exit_code
    except click.exceptions.Abort:
        code = INTERRUPTED
    except KeyboardInterrupt:
        _error("interrupted")
        code = INTERRUPTED
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else FAILED
    except BaseException as e:  # broad: reported — the command's one line on stderr, exit code
        code, message = _code_for(e)
        message = cap(" ".join(message.split("\n")))  # one line, whatever it quotes
        if debug:
            traceback.print_exception(e)
        _error(message)
        if "--json" in args:
            emit_json_error(message, code)
    sys.stdout.flush()
    sys.exit(code)
