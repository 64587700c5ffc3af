"""``fxpass demo``: the whole job on the embedded tiny Llama-style decoder."""

from __future__ import annotations

import sys
from typing import Any

import click
from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn
from rich.table import Table
from rich.text import Text

from ..core.instrument import Instrumentation
from ..targets.apply import ApplyResult
from ._common import NUMERICS, CliError, check_writable, emit_json, plural, stderr, stdout
from ._run import apply_pipeline, evaluate, evaluate_promoted, graph_inputs
from ._targets import Target


class _ProgressDisplay(Instrumentation):
    """A live line per pass on a terminal (nothing when output is not a terminal)."""

    def __init__(self, progress: Progress) -> None:
        self.progress = progress
        self.task = progress.add_task("running the default pipeline", total=None)
        self.done = 0

    def before_pass(self, record, gm, ctx):
        text = f"running {record.name} ({self.done} passes done)"
        self.progress.update(self.task, description=text)

    def after_pass(self, record, gm, ctx):
        if not record.children:
            self.done += 1


def _export(layers: int, progress: Progress) -> Target:
    import torch

    from ..models.llama import build_decoder

    task = progress.add_task(
        f"exporting the tiny Llama decoder ({plural(layers, 'layer')})", total=None
    )
    model = build_decoder(layers=layers)
    inputs = model.example_inputs()
    ep = torch.export.export(model, inputs).run_decompositions()
    progress.remove_task(task)
    return Target(f"tiny Llama decoder ({plural(layers, 'layer')})", "python", ep, list(inputs))


def _fused_block(changes: list) -> tuple[Any, Any] | None:
    """The first changed region that made a fused fxpass op, else the first region at all."""
    first = None
    for change in changes:
        for hunk in change.hunks:
            first = first or (change, hunk)
            for _, status, _, d in hunk.after.nodes:
                if status == "new" and d["target"].startswith("fxpass."):
                    return change, hunk
    return first


@click.command()
@click.option("--layers", default=2, show_default=True, type=click.IntRange(1, 64),
              help="Decoder layers in the demo model.")  # fmt: skip
@click.option("--report", "html", default="report.html", show_default=True,
              type=click.Path(dir_okay=False), help="Where to write the HTML report.")  # fmt: skip
@click.option("--no-report", is_flag=True, help="Do not write the HTML report.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON for machines.")
def demo(layers: int, html: str, no_report: bool, as_json: bool) -> None:
    """Export the embedded tiny Llama model, run the default pipeline with a progress display,
    verify numerics, print the per-pass table and one fused block before/after, and write
    report.html."""
    from ..core.pass_registry import REGISTRY
    from ..html import HtmlReport
    from ..verify.compare import compare_outputs
    from ..verify.inputs import output_names
    from ..verify.numerics import NumericsCheck

    html_path = None if no_report else check_writable(html, "report")
    err = stderr()
    with Progress(SpinnerColumn(), TextColumn("{task.description}"), TimeElapsedColumn(),
                  console=err, transient=True, disable=not err.is_terminal) as progress:  # fmt: skip
        t = _export(layers, progress)
        pipeline = REGISTRY.create("default")
        reference = evaluate(t.program, t)
        truth = evaluate_promoted(t.program, t)
        check = NumericsCheck(graph_inputs(t), names=output_names(t.program))
        recorder = HtmlReport(html_path or "report.html", title="fxpass demo: tiny Llama decoder",
                              numerics=check, info={"model": t.text, "pipeline": "default"})  # fmt: skip
        if html_path is None:
            recorder.write = lambda final_numerics=None: None  # record, write nothing
        result = apply_pipeline(t, pipeline, [check, recorder, _ProgressDisplay(progress)])
    final = compare_outputs(reference, evaluate(result.program, t), truth=truth)
    if html_path is not None:
        recorder.write(final_numerics=final)
    block = _fused_block(recorder.changes)
    diverged = not (final.ok and check.ok)
    if as_json:
        _json(t, result, check, final, block, html_path)
    else:
        _print(t, result, check, final, block, html_path, len(pipeline.passes))
    if diverged:
        raise CliError("numerics diverged after the default pipeline", NUMERICS)


def _json(t, result: ApplyResult, check, final, block, html_path) -> None:
    fused = None
    if block is not None:
        change, hunk = block
        before, after = hunk.text()
        fused = {"pass": change.name, "before": before, "after": after, "like_it": hunk.like_it}
    emit_json(
        {
            "model": t.text,
            "modified": result.modified,
            "report": result.report.to_dict(),
            "numerics": {
                "ok": final.ok and check.ok,
                "passes": [r.to_dict() for r in check.results],
                "final": final.to_dict(),
            },
            "fused_block": fused,
            "html": str(html_path.absolute()) if html_path else None,
        }
    )


def _print(t, result: ApplyResult, check, final, block, html_path, npasses: int) -> None:
    out = stdout()
    out.print(Text(f"fxpass demo: {t.text}, default pipeline", style="bold"))
    if npasses == 0:
        out.print("the default pipeline is empty: no pass is registered in it yet", style="yellow")
    out.print(result.report)
    first = check.first_divergence
    if first is not None:
        out.print(Text(f"numerics: first divergence after {first}", style="red"))
    style = "green" if final.ok else "red"
    out.print(Text(f"numerics against the original: {final.summary()}", style=style))
    if block is not None:
        change, hunk = block
        before, after = hunk.text()
        more = f" (one of {hunk.like_it} like it)" if hunk.like_it > 1 else ""
        table = Table(title=f"{change.name}: one changed block{more}", title_justify="left")
        table.add_column("before", style="red", overflow="fold")
        table.add_column("after", style="green", overflow="fold")
        table.add_row("\n".join(before), "\n".join(after))
        out.print(table)
    elif npasses:
        out.print("no pass changed the graph", style="dim")
    if html_path is not None:
        out.print(f"wrote {html_path.absolute()}", markup=False, soft_wrap=True)
    sys.stdout.flush()
