"""The driver's fuzzers over generators and verdicts kept with the tests they serve.

``fx``
    ``tests/_random_programs.py`` draws a program and a pattern (cut out of it or made up),
    matcher flags, filters and a replacement; ``tests/compat/test_subgraph_differential.py``
    compares ``fxpass.compat.fx`` with torch's ``SubgraphMatcher`` and
    ``replace_pattern_with_filters`` (the same matches, graphs and outputs; where torch
    itself is wrong, fxpass's matches checked against the matcher's rules).
``inductor``
    ``tests/compat/inductor/_random_patterns.py`` draws a program and a
    ``register_replacement`` pair; ``_differential.compare`` applies it with Inductor's
    pattern matcher and with ``fxpass.compat.inductor`` (the same count, the same nodes, the
    same outputs, fresh ``meta['val']``; where Inductor fails, fxpass fails alike or leaves a
    valid graph).
``pt2``
    ``tools/fuzz_pt2.py`` mutates a small ``.pt2`` archive (flipped bytes, dropped or doubled
    members, retyped or deep JSON, hostile expressions, pickles, native libraries);
    ``check_mutant`` loads it with fxpass: one ``Pt2Error`` line or a program, never another
    exception, and no payload runs.

A case is the seed its generator draws from (these generators are not structural data, so
their cases are not shrunk); the ``pt2`` repro carries the mutant's bytes.
"""

from __future__ import annotations

import base64
import importlib.util
import random
import re
import sys
import tempfile
import traceback
import zlib
from pathlib import Path
from typing import Any

from fuzz_rewrite import Finding

ROOT = Path(__file__).resolve().parents[1]

__all__ = ["FxFuzzer", "InductorFuzzer", "Pt2Fuzzer", "Unavailable", "load_file", "make"]


class Unavailable(Exception):
    """A fuzzer whose module is not in this checkout."""


def load_file(path: Path, name: str | None = None) -> Any:
    """The module at ``path``, imported under its stem, its folder put on ``sys.path``."""
    name = name or path.stem
    if name in sys.modules:
        return sys.modules[name]
    if not path.exists():
        raise Unavailable(
            f"{path.relative_to(ROOT) if path.is_relative_to(ROOT) else path} is not here"
        )
    sys.path.insert(0, str(path.parent))
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[name]
        raise
    return module


_HEADER = '''"""fxpass fuzz repro ({fuzzer}): {key}

{detail}
"""

import random
import sys
from pathlib import Path

for root in [Path(__file__).resolve().parent, Path.cwd(), Path({repo!r})]:
    if (root / "tools" / "fuzz_external.py").exists():
        for sub in ("src", "tools", "tests", "tests/compat", "tests/compat/inductor"):
            sys.path.insert(0, str(root / sub))
        break

from fuzz_external import {cls}, load_file  # noqa: E402

'''

_FOOTER = """
finding = {cls}().check(CASE)
print(finding.key if finding else "no disagreement", finding.detail if finding else "", sep="\\n")
sys.exit(1 if finding else 0)
"""


def _script(fuzzer: Any, case: Any, finding: Finding, body: str = "") -> str:
    cls = type(fuzzer).__name__
    detail = finding.detail.replace('"""', "'''").replace("\\", "\\\\")
    head = _HEADER.format(
        fuzzer=fuzzer.name, key=finding.key, detail=detail, repo=str(ROOT), cls=cls
    )
    return head + body + f"\nCASE = {case!r}\n" + _FOOTER.format(cls=cls)


def _assertion_key(which: str, e: BaseException, file: str) -> str:
    """``which:Type@line`` — the check that failed and where (their asserts carry no text)."""
    line = next(
        (f.lineno for f in reversed(traceback.extract_tb(e.__traceback__)) if f.filename == file),
        None,
    )
    return f"{which}:{type(e).__name__}" + (f"@{line}" if line else "")


class FxFuzzer:
    """``fxpass.compat.fx`` against torch's subgraph matcher and rewriter."""

    name = "fx"

    def __init__(self) -> None:
        self.gen = load_file(ROOT / "tests" / "_random_programs.py")
        self.diff = load_file(ROOT / "tests" / "compat" / "test_subgraph_differential.py")

    def generate(self, rng: random.Random) -> tuple[str, int]:
        return (rng.choice(["matches", "rewrites"]), rng.randrange(2**32))

    def _draw(self, which: str, seed: int) -> tuple:
        gen, ch = self.gen, self.gen.Chooser(random.Random(seed))
        gm = gen.random_program(ch)
        pattern = (gen.cut_pattern(ch, gm) if ch.coin(0.75) else None) or gen.made_up_pattern(ch)
        if which == "matches":
            flags = dict(
                match_output=ch.coin(0.25),
                match_placeholder=ch.coin(0.4),
                remove_overlapping_matches=ch.coin(0.7),
                ignore_literals=ch.coin(0.25),
            )
            return gm, pattern, flags, ch.choice(["", "", "", "select", "add", "neg", "getitem"])
        replacement = gen.replacement_for(ch, pattern)
        filters = self.diff._FILTERS
        options = dict(
            match_filters=[f] if (f := filters[ch.choice(list(filters))]) else None,
            ignore_literals=ch.coin(0.25),
            node_name_match=ch.choice(["", "", "", "select", "add"]),
        )
        return gm, pattern, replacement, options, ch.coin(0.2)

    def check(self, case: tuple[str, int]) -> Finding | None:
        which, seed = case
        drawn = self._draw(which, seed)
        compare = self.diff._compare_matches if which == "matches" else self.diff._compare_rewrites
        try:
            compare(*drawn)
        except Exception as e:  # broad: a failed comparison is the finding
            tb = "".join(traceback.format_exception(type(e), e, e.__traceback__)[-4:])
            shown = "\n".join(x.code.strip() if hasattr(x, "code") else repr(x) for x in drawn)
            return Finding(_assertion_key(which, e, self.diff.__file__), f"{shown}\n{tb}")
        return None

    def shrinks(self, case: Any) -> list:
        return []

    def repro(self, case: tuple[str, int], finding: Finding) -> str:
        body = "".join(f"# {line}\n" for line in str(self._draw(*case)[0].code).splitlines())
        return _script(self, case, finding, body)


class InductorFuzzer:
    """``fxpass.compat.inductor`` against Inductor's pattern matcher."""

    name = "inductor"

    def __init__(self) -> None:
        folder = ROOT / "tests" / "compat" / "inductor"
        self.gen = load_file(folder / "_random_patterns.py")
        self.diff = load_file(folder / "_differential.py")

    def generate(self, rng: random.Random) -> int:
        return rng.randrange(2**32)

    def check(self, case: int) -> Finding | None:
        verdict = self.diff.compare(self.gen.random_case(random.Random(case)))
        if verdict.agree:
            return None
        return Finding(verdict.kind, verdict.detail)

    def shrinks(self, case: Any) -> list:
        return []

    def repro(self, case: int, finding: Finding) -> str:
        source = self.gen.random_case(random.Random(case)).source
        return _script(self, case, finding, "".join(f"# {line}\n" for line in source.splitlines()))


class Pt2Fuzzer:
    """fxpass's ``.pt2`` loading on mutated archives."""

    name = "pt2"

    def __init__(self) -> None:
        self.gen = load_file(ROOT / "tools" / "fuzz_pt2.py")
        self._seed: bytes | None = None

    def generate(self, rng: random.Random) -> str:
        if self._seed is None:
            self._seed = self.gen.seed_pt2()
        mutant = self.gen.mutate_pt2(self._seed, rng)
        return base64.b64encode(zlib.compress(mutant, 9)).decode()

    def check(self, case: str) -> Finding | None:
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / "mutant.pt2"
            path.write_bytes(zlib.decompress(base64.b64decode(case)))
            problem = self.gen.check_mutant(path)
        if problem is None:
            return None
        return Finding(re.sub(r"\d+", "N", problem.split(":", 1)[0][:80]), problem)

    def shrinks(self, case: Any) -> list:
        return []

    def repro(self, case: str, finding: Finding) -> str:
        return _script(self, case, finding, "# CASE: the mutant .pt2, zlib-compressed, base64\n")


def make(name: str) -> Any:
    """The external fuzzer ``name``; ``Unavailable`` when its modules are not here."""
    cls = {"fx": FxFuzzer, "inductor": InductorFuzzer, "pt2": Pt2Fuzzer}[name]
    return cls()
