"""The .pt2 mutation fuzzer (tools/fuzz_pt2.py), bounded: every mutant of a real saved program
loads or is refused with one Pt2Error line, and no payload it plants ever runs.
``python tools/fuzz.py --minutes N`` runs the same property for longer."""

from __future__ import annotations

import random
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tools.fuzz_pt2 import MARKER, check_mutant, mutate_pt2, seed_pt2


@pytest.fixture(scope="session")
def seed() -> bytes:
    return seed_pt2()


@settings(
    max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(st.integers(min_value=0, max_value=2**32 - 1))
def test_every_mutant_loads_or_is_one_pt2error_and_runs_nothing(seed, tmp_path, number):
    mutant = tmp_path / f"mutant{number}.pt2"
    mutant.write_bytes(mutate_pt2(seed, random.Random(number)))
    assert check_mutant(mutant) is None


def test_the_property_catches_what_it_claims(seed, tmp_path, monkeypatch):
    """check_mutant reports an escaping exception and a payload that ran (a check that cannot
    fail proves nothing)."""
    import fxpass.targets.pt2 as pt2

    path = tmp_path / "seed.pt2"
    path.write_bytes(seed)
    assert check_mutant(path) is None

    def raises(*_a, **_k):
        raise KeyError("graph")

    monkeypatch.setattr(pt2, "load", raises)
    assert check_mutant(path) == "load raised KeyError: 'graph'"

    def runs(*_a, **_k):
        MARKER.touch()
        raise pt2.Pt2Error("refused")

    monkeypatch.setattr(pt2, "load", runs)
    assert "a payload ran" in (check_mutant(path) or "")


def test_the_mutations_cover_every_kind(seed):
    """Over a few hundred mutants: truncations, duplicates, drops, hostile expressions, pickles
    and native members all occur (a fuzzer stuck on one mutation finds little)."""
    import io
    import zipfile

    kinds = set()
    rng = random.Random(0)
    base = set(zipfile.ZipFile(io.BytesIO(seed)).namelist())
    for _ in range(300):
        data = mutate_pt2(seed, rng)
        try:
            names = zipfile.ZipFile(io.BytesIO(data)).namelist()
        except zipfile.BadZipFile:
            kinds.add("truncated")
            continue
        if len(names) != len(set(names)):
            kinds.add("duplicate")
        if base - set(names):
            kinds.add("dropped")
        if any("aotinductor" in n or n.endswith(".so") for n in names):
            kinds.add("native")
        if any(
            n.rsplit("/", 1)[-1].startswith(
                ("opaque_obj_9", "custom_obj_9", "tensor_9", "weight_9")
            )
            for n in names
        ):
            kinds.add("pickle")
        if b"pathlib" in data:
            kinds.add("hostile expression or pickle")
    assert kinds >= {
        "truncated",
        "duplicate",
        "dropped",
        "native",
        "pickle",
        "hostile expression or pickle",
    }, kinds
