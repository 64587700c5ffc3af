"""Run fxpass's differential fuzzers for a while; write a shrunk repro per disagreement class.

    python tools/fuzz.py --minutes N [--fuzzer NAME ...] [--seed S] [--out DIR]

Fuzzers run round-robin, each case drawn from its own seeded ``random.Random`` (the seed,
the fuzzer's name and the case number), so a run is repeatable. A fuzzer is an object with

* ``name``;
* ``generate(rng) -> case``: a case as data whose ``repr`` rebuilds it;
* ``check(case) -> Finding | None``: ``None`` when fxpass agrees with the reference, a
  finding (``key``: the disagreement's class, ``detail``) when not; raises ``Skip`` when the
  case says nothing (the program does not export, the reference itself fails);
* ``shrinks(case) -> list[case]``: strictly smaller cases (fewer ops, a smaller pattern);
* ``repro(case, finding) -> str``: a script that rebuilds the case, checks it again, prints
  the finding and exits 1 while it reproduces;
* optionally ``notes``: a ``Counter`` of what the cases exercised (printed).

The first case of each class is shrunk (the first smaller case that still gives the same
class is taken, until none does or ``--shrink-seconds`` pass) and its repro written to
``DIR/<fuzzer>-<class>.py``; later cases of a class are counted. ``DIR/summary.json`` and the
printed summary give per fuzzer the cases run, the skipped ones by reason and the
disagreements by class. Exit status 1 if any disagreement was found, 2 on bad arguments.

Fuzzers (docs/fuzz.md says what each compares): ``rewrite``, ``pipeline``, ``rollback``
(``tools/fuzz_rewrite.py``); ``fx`` (fxpass.compat.fx vs torch's subgraph rewriter,
``tests/_random_programs.py``), ``inductor`` (fxpass.compat.inductor vs Inductor's pattern
matcher, ``tests/compat/inductor/_random_patterns.py``) and ``pt2`` (mutated ``.pt2``
archives, ``tools/fuzz_pt2.py``), imported when asked for. ``--fuzzer path/to/file.py:Class``
runs a fuzzer class of your own.
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import json
import re
import sys
import time
import traceback
import warnings
from pathlib import Path
from typing import Any

TOOLS = Path(__file__).resolve().parent
ROOT = TOOLS.parent
sys.path.insert(0, str(TOOLS))

import fuzz_external  # noqa: E402
from fuzz_external import Unavailable, load_file  # noqa: E402
from fuzz_rewrite import Finding, Skip  # noqa: E402

OWN = ("rewrite", "pipeline", "rollback")
DEFAULT = (*OWN, "fx", "inductor", "pt2")


def make_fuzzer(name: str) -> Any:
    """The fuzzer called ``name`` (or ``file.py:Class``); ``Unavailable`` if its module is
    not in this checkout."""
    if name in OWN:
        import fuzz_rewrite

        return fuzz_rewrite.FUZZERS[name]()
    if name in ("fx", "inductor", "pt2"):
        return fuzz_external.make(name)
    if ":" in name:
        file, cls = name.rsplit(":", 1)
        path = Path(file).resolve()
        return getattr(load_file(path), cls)()
    raise KeyError(name)


@dataclasses.dataclass
class Tally:
    """One fuzzer's counts in a run."""

    cases: int = 0
    skipped: collections.Counter = dataclasses.field(default_factory=collections.Counter)
    found: collections.Counter = dataclasses.field(default_factory=collections.Counter)
    repros: dict = dataclasses.field(default_factory=dict)


def _check(fuzzer: Any, case: Any) -> Finding | None:
    """``fuzzer.check(case)``, a crash of the check being a finding of its own class."""
    try:
        return fuzzer.check(case)
    except Skip:
        raise
    except Exception as e:  # broad: a crash is a finding, reported with its traceback
        tb = "".join(traceback.format_exception(type(e), e, e.__traceback__)[-8:])
        return Finding(f"crash:{type(e).__name__}", tb)


def shrink(fuzzer: Any, case: Any, finding: Finding, seconds: float) -> tuple[Any, Finding, int]:
    """The smallest case reached from ``case`` that still gives ``finding``'s class."""
    stop = time.monotonic() + seconds
    steps = 0
    improved = True
    while improved and time.monotonic() < stop:
        improved = False
        for smaller in fuzzer.shrinks(case):
            if time.monotonic() >= stop:
                break
            try:
                again = _check(fuzzer, smaller)
            except Skip:
                continue
            if again is not None and again.key == finding.key:
                case, finding, improved = smaller, again, True
                steps += 1
                break
    return case, finding, steps


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9]+", "-", text).strip("-")[:80] or "finding"


def run(
    fuzzers: list[Any],
    minutes: float,
    seed: int,
    out: Path,
    shrink_seconds: float = 120.0,
    log: Any = print,
) -> dict[str, Tally]:
    """Run ``fuzzers`` round-robin for ``minutes``; return their tallies."""
    out = out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    tallies = {f.name: Tally() for f in fuzzers}
    stop = time.monotonic() + minutes * 60
    turn = 0
    while True:
        fuzzer = fuzzers[turn % len(fuzzers)]
        turn += 1
        tally = tallies[fuzzer.name]
        if time.monotonic() >= stop and turn > len(fuzzers):
            break
        rng = __import__("random").Random(f"{seed}:{fuzzer.name}:{tally.cases}")
        tally.cases += 1
        try:
            case = fuzzer.generate(rng)
            finding = _check(fuzzer, case)
        except Skip as e:
            tally.skipped[str(e)] += 1
            continue
        except Exception as e:  # broad: a crash while generating is a finding too
            case, finding = None, Finding(f"generate:{type(e).__name__}", traceback.format_exc())
        if finding is None:
            continue
        tally.found[finding.key] += 1
        if tally.found[finding.key] > 1:
            continue
        log(f"[{fuzzer.name}] case {tally.cases - 1}: {finding.key}: shrinking")
        path = out / f"{_slug(fuzzer.name)}-{_slug(finding.key)}.py"
        if case is None:
            path.write_text(f'"""{fuzzer.name}: {finding.key}"""\n# {finding.detail}\n')
        else:
            case, finding, steps = shrink(fuzzer, case, finding, shrink_seconds)
            path.write_text(fuzzer.repro(case, finding))
            log(f"[{fuzzer.name}]   {steps} shrink steps; repro: {path}")
        tally.repros[finding.key] = str(path)
    return tallies


def summary(tallies: dict[str, Tally], fuzzers: list[Any], unavailable: dict[str, str]) -> dict:
    data: dict[str, Any] = {}
    for f in fuzzers:
        t = tallies[f.name]
        data[f.name] = {
            "cases": t.cases,
            "skipped": dict(t.skipped),
            "disagreements": dict(t.found),
            "repros": t.repros,
            "notes": dict(getattr(f, "notes", {}) or {}),
        }
    for name, why in unavailable.items():
        data[name] = {"unavailable": why}
    return data


def render(data: dict) -> str:
    lines = []
    for name, d in data.items():
        if "unavailable" in d:
            lines.append(f"{name}: not run ({d['unavailable']})")
            continue
        skipped = sum(d["skipped"].values())
        found = sum(d["disagreements"].values())
        lines.append(f"{name}: {d['cases']} cases, {skipped} skipped, {found} disagreements")
        for key, n in sorted(d["disagreements"].items()):
            lines.append(f"  {key}: {n}  ({d['repros'].get(key, '')})")
        for why, n in sorted(d["skipped"].items()):
            lines.append(f"  skipped, {why}: {n}")
        for note, n in sorted(d["notes"].items()):
            lines.append(f"  {note}: {n}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes", type=float, required=True)
    parser.add_argument("--fuzzer", action="append", default=None, metavar="NAME")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=Path("fuzz-out"))
    parser.add_argument("--shrink-seconds", type=float, default=120.0)
    args = parser.parse_args(argv)
    if args.minutes < 0:
        parser.error("--minutes must be 0 or more")
    warnings.filterwarnings("ignore")
    names = args.fuzzer or list(DEFAULT)
    fuzzers, unavailable = [], {}
    for name in names:
        try:
            fuzzers.append(make_fuzzer(name))
        except KeyError:
            parser.error(f"unknown fuzzer {name!r}; known: {', '.join(DEFAULT)} or file.py:Class")
        except (Unavailable, ImportError) as e:
            why = str(e) if isinstance(e, Unavailable) else f"{type(e).__name__}: {e}"
            if args.fuzzer:  # asked for by name: say so and stop
                parser.error(f"fuzzer {name!r} is not available: {why}")
            unavailable[name] = why
    if not fuzzers:
        parser.error("no fuzzer is available")
    tallies = run(fuzzers, args.minutes, args.seed, args.out, args.shrink_seconds)
    data = summary(tallies, fuzzers, unavailable)
    (args.out / "summary.json").write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")
    text = render(data)
    (args.out / "summary.txt").write_text(text + "\n")
    print(text)
    return 1 if any(d.get("disagreements") for d in data.values()) else 0


if __name__ == "__main__":
    sys.exit(main())
