"""Collectives inserted through the editor are actions of the debug counter: bisect, run
on every rank of a gloo group, names a planted bad all-reduce among correct ones."""

from __future__ import annotations

import _planted_collective as planted
import _spawn


def test_bisect_names_the_planted_bad_collective():
    results = _spawn.run(planted.bisect_on_rank, 2, timeout=240)
    assert results[0] == results[1]  # both ranks searched alike (same collectives)
    found = results[0]
    assert not found["ok"] and found["bad_pass"] == planted.RULE, found["text"]
    rw = found["rewrite"]
    total = len(found["matmuls"])
    assert (rw["index"], rw["total"], rw["pass_path"]) == (planted.PLANTED, total, planted.RULE)
    assert rw["rule"] == planted.RULE and rw["old"] == [found["matmuls"][planted.PLANTED - 1]]
    assert rw["new"][0].startswith("all_reduce"), rw
    assert rw["location"].startswith("_planted_collective.py:"), rw
