"""The commands: list, show, run, diff, bisect, repro (demo lives in its own module)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import click
from rich.syntax import Syntax
from rich.table import Table
from rich.text import Text

from ..fxutil.messages import clip, first_line
from ._common import (
    FAILED,
    LOAD,
    NUMERICS,
    USAGE,
    CliError,
    check_folder,
    check_writable,
    emit_json,
    import_option,
    modules_named,
    plural,
    stderr,
    stdout,
    write_atomic,
)
from ._ops import needed_ops
from ._run import apply_pipeline, evaluate, evaluate_promoted, graph_inputs, parse_pipeline
from ._targets import Target, load_target

_TOL = [  # a negative tolerance fails equal values: refused as a usage error (exit 2)
    click.option(
        "--rtol",
        type=click.FloatRange(min=0),
        default=None,
        help="Relative tolerance, >= 0 (default: by dtype).",
    ),
    click.option(
        "--atol",
        type=click.FloatRange(min=0),
        default=None,
        help="Absolute tolerance, >= 0 (default: by dtype).",
    ),
]


def _tolerances(fn):
    for opt in reversed(_TOL):
        fn = opt(fn)
    return fn


def _print_graph(console, title: str, text: str) -> None:
    console.rule(title, style="dim")
    if console.is_terminal:
        console.print(Syntax(text, "python", theme="ansi_dark", word_wrap=False))
    else:
        console.print(text, markup=False, highlight=False, crop=False, overflow="ignore")


def _graph_code(gm: Any) -> str:
    from ..core.instrument import graph_text

    return graph_text(gm, "code")


# ----- list -----------------------------------------------------------------------------------
@click.command("list")
@click.option("--json", "as_json", is_flag=True, help="Print JSON for machines.")
@import_option
def list_cmd(as_json: bool, imports: list[str]) -> None:
    """List the registered passes with their options and one-line docs."""
    from ..core.pass_registry import REGISTRY

    infos = REGISTRY.infos()
    default = REGISTRY.pass_list("default").names()
    if as_json:
        emit_json(
            {
                "passes": [
                    {
                        "name": i.name,
                        "summary": i.summary,
                        "options": {k: o.describe() for k, o in i.options.items()},
                        "origin": i.origin,
                        "enabled": REGISTRY.is_enabled(i.name),
                    }
                    for i in infos
                ],
                "default": default,
            }
        )
        return
    out = stdout()
    out.print(_pass_table(infos, REGISTRY), soft_wrap=False)
    out.print(Text("default pipeline: ", style="bold") + Text(", ".join(default) or "(empty)"))


def _pass_table(infos: list, registry: Any) -> Table:
    """One row per pass: its name, then what it does with each option on a line below,
    wrapped (never cut) to the terminal's width; 80 columns read fine."""
    table = Table(box=None, show_header=False, pad_edge=False, padding=(0, 2, 0, 0),
                  title="registered passes", title_justify="left", title_style="bold")  # fmt: skip
    width = max((len(i.name) for i in infos), default=4)
    table.add_column("pass", style="bold", no_wrap=True, min_width=width, max_width=width)
    table.add_column("what it does", overflow="fold", ratio=1)
    for info in infos:
        text = Text(info.summary or "(no description)")
        if not registry.is_enabled(info.name):
            text.append(" [disabled]", style="dim")
        for opt in info.options.values():
            text.append("\n  " + opt.describe(), style="cyan")
        table.add_row(info.name, text)
    return table


# ----- show -----------------------------------------------------------------------------------
@click.command()
@click.argument("target")
@click.option("--pass", "-p", "spec", default=None, help="Show the graph before and after SPEC.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON for machines.")
@import_option
def show(target: str, spec: str | None, as_json: bool, imports: tuple[str, ...]) -> None:
    """Print TARGET's graph, or the graph before and after one pass (or spec).

    TARGET is a .pt2 file, a .fxgraph file, or module:function.
    """
    pipeline = parse_pipeline(spec) if spec is not None else None
    t = load_target(target, imports=imports)
    out = stdout()
    before = _graph_code(t.graph_module)
    if pipeline is None:
        needs = needed_ops(t.graph_module)
        if as_json:
            emit_json({"target": target, "nodes": len(t.graph_module.graph.nodes), "code": before,
                       "ops": {ns.name: ns.to_dict() for ns in needs}})  # fmt: skip
            return
        _print_graph(out, f"{target} ({len(t.graph_module.graph.nodes)} nodes)", before)
        out.rule("ops it calls, by namespace, and who registers them", style="dim")
        for ns in needs:
            out.print(ns.line(), markup=False, highlight=False)
        return
    from ..html.capture import GraphRecorder

    rec = GraphRecorder()
    result = apply_pipeline(t, pipeline, [rec])
    after = _graph_code(result.graph_module)
    if as_json:
        emit_json(
            {
                "target": target,
                "spec": str(pipeline),
                "modified": result.modified,
                "before": before,
                "after": after,
                "changes": [c.to_dict() for c in rec.changes],
            }
        )
        return
    _print_graph(out, f"before {pipeline}", before)
    _print_graph(out, f"after {pipeline}", after)
    _print_changes(out, rec.changes, result.modified)


def _print_changes(out, changes: list, modified: bool) -> None:
    if not modified:
        out.print("the graph did not change", style="dim")
    for c in changes:
        out.print(
            f"{c.label}: +{c.added} new, -{c.removed} removed, ~{c.changed} changed, "
            f"{c.rewired} rewired, in {plural(c.hunks_total, 'region')}",
            markup=False,
        )


# ----- run ------------------------------------------------------------------------------------
@click.command()
@click.argument("target")
@click.option("-p", "--pipeline", "spec", default=None, help="Pipeline spec (default: 'default').")
@click.option("-o", "--output", type=click.Path(dir_okay=False), default=None,
              help="Write the transformed program (.pt2 for exported programs, else .fxgraph).")  # fmt: skip
@click.option("--print-after-change", is_flag=True, help="Print the graph after each change.")
@click.option("--print-after-all", is_flag=True, help="Print the graph after every pass.")
@click.option("--timing", is_flag=True, help="Print the nested per-pass timing tree.")
@click.option("--statistics", is_flag=True, help="Print the statistics each pass counted.")
@click.option("--verify", is_flag=True, help="Check numerics after each pass and at the end.")
@click.option("--verify-each", type=click.Choice(["changed", "full"]), default=None,
              help="Lint after each pass the nodes it changed (changed, the default) or the "
                   "whole graph, and the input (full).")  # fmt: skip
@click.option("--report", "html", type=click.Path(dir_okay=False), default=None,
              help="Write the HTML report with pictures of each change.")  # fmt: skip
@click.option("--reproducer", type=click.Path(file_okay=False), default=None,
              help="On failure, write a reproducer folder under this folder.")  # fmt: skip
@click.option("--cache", "cache", type=click.Path(file_okay=False), default=None,
              help="Keep the result in this folder; a later run restores it without the passes.")  # fmt: skip
@click.option("--portable", is_flag=True,
              help="Lower every fxpass:: op to torch's own ops last: the output runs without "
              "fxpass.")  # fmt: skip
@click.option("--json", "as_json", is_flag=True, help="Print JSON for machines.")
@_tolerances
@import_option
def run(target, spec, output, print_after_change, print_after_all, timing, statistics,
        verify, verify_each, html, reproducer, cache, portable, as_json, rtol, atol, imports) -> None:  # fmt: skip
    """Run a pipeline on TARGET: print what each pass did, optionally verify and save.

    TARGET is a .pt2 file, a .fxgraph file, or module:function.
    """
    from ..core.errors import PassFailedError
    from ..core.instrument import PrintIR, Statistics, Timing

    pipeline = parse_pipeline(spec)
    if verify_each is not None:
        pipeline.verify_each = verify_each
    if html:
        check_writable(html, "report")
    for folder, what in ((cache, "pipeline cache"), (reproducer, "reproducer")):
        if folder:
            check_folder(folder, what)
    if output:  # fail before the (slow) load where the TARGET's name tells its kind
        check_writable(output, "output")
        _check_output_suffix(target, output)
    t = load_target(target, imports=imports)
    if output:
        _check_output_kind(t, output)
    instruments: list[Any] = []
    if print_after_change or print_after_all:
        instruments.append(PrintIR(after=print_after_all, after_change=True, stream=sys.stderr))
    if timing:
        instruments.append(Timing(stream=sys.stderr))
    if statistics:
        instruments.append(Statistics(stream=sys.stderr))
    check = reference = None
    if verify:
        from ..verify.inputs import output_names
        from ..verify.numerics import NumericsCheck

        names = output_names(t.program) if t.is_exported else None
        inputs = graph_inputs(t)
        reference = evaluate(t.program, t)
        truth = evaluate_promoted(t.program, t)
        # a GraphModule's outputs on its inputs are what the check would compute again; an
        # exported program's graph also returns mutated buffers, which module() does not
        known = {} if t.is_exported else {"reference": reference, "truth": truth}
        check = NumericsCheck(inputs, rtol=rtol, atol=atol, names=names, **known)
        instruments.append(check)
    recorder = _html_recorder(html, t, spec, check)
    if recorder is not None:
        instruments.append(recorder)
    if reproducer:
        from ..core.reproducer import CrashReproducer

        named = [*modules_named(imports), *t.imported]  # what auto found, by name
        instruments.append(CrashReproducer(reproducer, imports=named))
    try:
        result = apply_pipeline(t, pipeline, instruments, cache, portable=portable)
    except PassFailedError as e:
        report = getattr(e, "report", None)
        if as_json:
            emit_json({"ok": False, "error": first_line(e), "exit_code": FAILED,
                       "report": report.to_dict() if report else None})  # fmt: skip
        raise
    final = None
    if verify:
        from ..verify.compare import compare_outputs

        final = compare_outputs(
            reference, evaluate(result.program, t), rtol=rtol, atol=atol, truth=truth
        )
        if recorder is not None:
            recorder.write(final_numerics=final)
    diverged = final is not None and (not final.ok or not check.ok)
    written = None
    if output and not diverged:
        written = _save_program(result, t, output)
    _report_run(t, result, check, final, written, html, as_json, diverged)
    if diverged:
        raise CliError("numerics diverged" + ("" if not output else f"; {output} not written"),
                       NUMERICS)  # fmt: skip


def _check_output_suffix(target: str, output: str) -> None:
    kinds = {".pt2": "an exported program", ".fxgraph": "a GraphModule"}
    suffix, want = Path(target).suffix, Path(output).suffix
    if suffix in kinds and want != suffix:
        raise CliError(
            f"TARGET {clip(target)} is {kinds[suffix]}: write it to a {suffix} file, not "
            f"{clip(output)}",
            USAGE,
        )


def _check_output_kind(t: Target, output: str) -> None:
    suffix = Path(output).suffix
    want = ".pt2" if t.is_exported else ".fxgraph"
    if suffix != want:
        kind = "an exported program" if t.is_exported else "a GraphModule"
        raise CliError(
            f"TARGET {clip(t.text)} is {kind}: write it to a {want} file, not {clip(output)}",
            USAGE,
        )


def _html_recorder(html, t: Target, spec, check):
    if not html:
        return None
    from ..html import HtmlReport

    info = {"target": t.text, "command": "fxpass " + " ".join(sys.argv[1:])}
    return HtmlReport(html, title=f"fxpass report: {Path(t.text).name}", numerics=check, info=info)


def _save_program(result, t: Target, output: str) -> Path:
    if t.is_exported:
        import torch

        return write_atomic(output, lambda tmp: torch.export.save(result.program, tmp), "output")
    from ..core.serialize import save_graph

    inputs = graph_inputs(t) if t.args is not None else None
    return write_atomic(output, lambda tmp: save_graph(result.program, tmp, inputs), "output")


def _report_run(t, result, check, final, written, html, as_json, diverged) -> None:
    if as_json:
        emit_json(
            {
                "ok": not diverged,
                "target": t.text,
                "modified": result.modified,
                "report": result.report.to_dict(),
                "numerics": {
                    "passes": [r.to_dict() for r in check.results],
                    "first_divergence": (
                        check.first_divergence.to_dict() if check.first_divergence else None
                    ),
                    "final": final.to_dict() if final is not None else None,
                }
                if check is not None
                else None,
                "output": str(written) if written else None,
                "html": str(Path(html).absolute()) if html else None,
            }
        )
        return
    out = stdout()
    out.print(result.report)
    if check is not None:
        first = check.first_divergence
        if first is not None:
            out.print(Text(f"numerics: first divergence after {first}", style="red"))
        out.print(
            Text(f"numerics at the end: {final.summary()}", style="green" if final.ok else "red")
        )
    if written:
        out.print(f"wrote {written}", markup=False, soft_wrap=True)
    if html:
        out.print(f"wrote {Path(html).absolute()}", markup=False, soft_wrap=True)


# ----- diff -----------------------------------------------------------------------------------
@click.command()
@click.argument("a")
@click.argument("b")
@click.option("--report", "html", type=click.Path(dir_okay=False), default=None,
              help="Write an HTML page with pictures of the differences.")  # fmt: skip
@click.option("--exit-code", is_flag=True, help="Exit with 1 when the graphs differ.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON for machines.")
@import_option
def diff(a: str, b: str, html: str | None, exit_code: bool, as_json: bool, imports) -> None:
    """Show what differs between the graphs of two TARGETs (matched by node name/provenance)."""
    from ..html.capture import diff_graphs
    from ..verify.testing import op_counts

    if html:
        check_writable(html, "report")
    ta, tb = load_target(a, imports=imports), load_target(b, imports=imports)
    change = diff_graphs(ta.graph_module, tb.graph_module, name=f"{a} -> {b}", max_hunks=20)
    ca, cb = op_counts(ta.graph_module), op_counts(tb.graph_module)
    ops = {k: (ca.get(k, 0), cb.get(k, 0)) for k in sorted(set(ca) | set(cb)) if ca[k] != cb[k]}
    same = not (change.added or change.removed or change.changed or change.rewired)
    if html:
        from ..html import render_html, write_html

        doc = render_html(None, [change], title=f"fxpass diff {a} {b}", info={"a": a, "b": b})
        write_atomic(html, lambda tmp: write_html(tmp, doc), "report")
    if as_json:
        emit_json({"same": same, "changes": change.to_dict(), "op_counts": ops})
    else:
        _print_diff(change, ops, same)
    if exit_code and not same:
        sys.exit(FAILED)


def _print_diff(change, ops: dict, same: bool) -> None:
    out = stdout()
    if same:
        out.print("the graphs are the same")
        return
    out.print(
        f"nodes {change.nodes_before} -> {change.nodes_after}: +{change.added} new, "
        f"-{change.removed} removed, ~{change.changed} changed, {change.rewired} rewired, "
        f"in {plural(change.hunks_total, 'region')}",
        markup=False,
    )
    if ops:
        table = Table(title="op counts that differ", title_justify="left")
        for col in ("op", "A", "B"):
            table.add_column(col, justify="left" if col == "op" else "right")
        for op, (x, y) in ops.items():
            table.add_row(op, str(x), str(y))
        out.print(table)
    for i, hunk in enumerate(change.hunks[:5], 1):
        before, after = hunk.text()
        more = f" (and {hunk.like_it - 1} more like it)" if hunk.like_it > 1 else ""
        out.rule(f"region {i}{more}", style="dim")
        for line in before:
            out.print(Text(f"- {line}", style="red"))
        for line in after:
            out.print(Text(f"+ {line}", style="green"))


# ----- bisect ---------------------------------------------------------------------------------
@click.command("bisect")
@click.argument("target")
@click.option("-p", "--pipeline", "spec", default=None, help="Pipeline spec (default: 'default').")
@click.option("--json", "as_json", is_flag=True, help="Print JSON for machines.")
@_tolerances
@import_option
def bisect_cmd(target: str, spec: str | None, as_json: bool, rtol, atol, imports) -> None:
    """Find the first pass, and the first single rewrite, that breaks numerics.

    Exits 4 when it found one, 0 when numerics hold after every pass.
    """
    from ..verify.bisect import bisect

    pipeline = parse_pipeline(spec)
    t = load_target(target, imports=imports)
    err = stderr()
    program = t.program
    inputs = t.args if t.is_exported else graph_inputs(t)
    say = None if as_json else (lambda msg: err.print(f"[dim]bisect: {msg}[/dim]"))
    result = bisect(program, pipeline, inputs, rtol=rtol, atol=atol, on_step=say)
    if as_json:
        emit_json(result.to_dict())
    else:
        out = stdout()
        for line in result.lines():
            style = "green" if result.ok else ("red" if line.startswith("first") else None)
            out.print(Text(line, style=style))
    if not result.ok:
        sys.exit(NUMERICS)


# ----- repro ----------------------------------------------------------------------------------
@click.command()
@click.argument("path")
@click.option("-p", "--pipeline", "spec", default=None,
              help="For a .fxgraph file: the pipeline to run on it.")  # fmt: skip
@import_option
def repro(path: str, spec: str | None, imports: tuple[str, ...]) -> None:
    """Re-run a crash reproducer folder (or a pipeline on a .fxgraph file).

    Fails exactly as the original run did: the same error, exit code 1.
    """
    p = Path(path)
    if p.is_dir():
        from ..core.errors import FxpassError, PassFailedError
        from ..core.reproducer import run_reproducer

        try:
            result = run_reproducer(p)
        except PassFailedError:
            raise
        except FxpassError as e:
            raise CliError(first_line(e), LOAD) from e
        stdout().print(result.report)
        stdout().print("the failure did not reproduce: the pipeline ran cleanly")
        return
    if not p.exists():
        raise CliError(f"no such reproducer folder or file: {path}", LOAD)
    t = load_target(path, imports=imports)
    pipeline = parse_pipeline(spec)
    result = apply_pipeline(t, pipeline, [])
    stdout().print(result.report)


__all__ = ["bisect_cmd", "diff", "list_cmd", "repro", "run", "show"]
