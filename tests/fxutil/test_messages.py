"""One rule for an error in one line: the first non-blank line, stripped, cut at LIMIT."""

from __future__ import annotations

import re
from pathlib import Path

from fxpass.fxutil.messages import LIMIT, error_summary, first_line

SRC = Path(__file__).resolve().parents[2] / "src" / "fxpass"


def test_the_first_line_is_the_first_that_says_something():
    assert first_line(RuntimeError("\n\n   shapes differ  \nat node %mul")) == "shapes differ"
    assert first_line("one line") == "one line"
    assert first_line(RuntimeError()) == ""
    assert first_line(RuntimeError(" \n ")) == ""


def test_a_long_line_is_cut_and_says_so():
    line = first_line(ValueError("x" * 1000))
    assert len(line) == LIMIT and line.endswith("…")
    assert first_line("y" * LIMIT) == "y" * LIMIT  # exactly the limit: not cut
    assert first_line("abcdef", limit=4) == "abc…"


def test_a_foreign_error_is_named_by_its_type():
    assert error_summary(KeyError("w")) == "KeyError: 'w'"
    assert error_summary(RuntimeError()) == "RuntimeError"
    assert error_summary(ValueError("bad\nmore")) == "ValueError: bad"


def test_no_module_cuts_an_error_message_its_own_way():
    idiom = re.compile(
        r"str\((e|err|error|exc|cause|root)\)\s*(\.strip\(\))?\s*\.(splitlines|split|partition)\("
    )
    others = [
        f"{p.relative_to(SRC)}:{i}"
        for p in SRC.rglob("*.py")
        if p.name != "messages.py"
        for i, line in enumerate(p.read_text().splitlines(), 1)
        if idiom.search(line)
    ]
    assert not others, f"summarise errors with fxpass.fxutil.messages: {others}"
