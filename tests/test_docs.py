"""Every ```python block in README.md and docs/*.md runs and prints what the page shows, so
documentation cannot rot or lie.

Blocks of one page run in order, in one namespace, in a fresh interpreter (so passes a page
registers do not collide with another page's), with a temporary working directory. The
```text block right after a python block is what that block prints, compared after the
normalisation rules of tests/_docs.py (timings, addresses, uuids, hashes, paths, spacing);
``<!-- not compared: REASON -->`` before such a block exempts it. The conventions are in
docs/architecture.md ("Documentation that runs").
"""

from __future__ import annotations

import os

import pytest
from _docs import PAGES, PageRuns, Runner, matches, mismatch, normalise, read_page, split_output

_TEST = "test_python_examples_run_and_print_what_the_page_shows"


@pytest.fixture(scope="module")
def page_runs(request, tmp_path_factory):
    """The pages this session selected, run in forked children of one warm interpreter, two
    at a time (one at a time under xdist, whose workers already share the cores)."""
    selected = [
        item.callspec.params["path"]
        for item in request.session.items
        if getattr(item, "originalname", None) == _TEST and hasattr(item, "callspec")
    ]
    jobs = 1 if os.environ.get("PYTEST_XDIST_WORKER") else min(2, os.cpu_count() or 1)
    runner = Runner({**os.environ, "NO_COLOR": "1"})
    yield PageRuns(runner, selected, jobs, tmp_path_factory.mktemp)
    runner.close()


def test_docs_have_examples():
    pages = [read_page(p) for p in PAGES]
    assert any(page.examples for page in pages)
    assert sum(ex.compared for page in pages for ex in page.examples) >= 50


@pytest.mark.parametrize("path", PAGES, ids=lambda p: p.name)
def test_python_examples_run_and_print_what_the_page_shows(path, page_runs):
    page, done = page_runs.result(path)
    assert not page.problems, "\n".join(page.problems)
    if done is None:
        pytest.skip(f"{page.name} has no python examples")
    rc, stdout, stderr = done
    printed = split_output(stdout)
    problems = [
        problem
        for i, ex in enumerate(page.examples)
        if ex.compared and i in printed and (i + 1 in printed or rc == 0)
        if (problem := mismatch(page, ex, printed[i])) is not None
    ]
    if rc:
        ran = max(printed, default=None)
        where = (
            f"the python block at {page.name}:{page.examples[ran].code.line}"
            if ran is not None
            else "before the first block"
        )
        problems.append(
            f"{page.name}: {where} failed (exit code {rc})\n"
            f"stdout (end):\n{stdout[-3000:]}\nstderr (end):\n{stderr[-5000:]}"
        )
    if problems:
        pytest.fail("\n\n".join(problems), pytrace=False)


# ----- the comparison itself ------------------------------------------------------------------


def test_normalise_rules():
    assert normalise("2 rewrites in 12.9 ms  \n\n") == normalise("2 rewrites in 8.61 ms")
    assert normalise("took 3s, then 40 us") == "took <time>, then <time>"
    assert normalise("2 rewrites, 4 slices of 16 s-blocks") == "2 rewrites, 4 slices of 16 s-blocks"
    table = "  rule   tried  ms\n  add      12   1.37\n\nlater 5"
    assert normalise(table) == " rule tried ms\n add 12 <time>\n\nlater 5"
    assert normalise("<object at 0x7f3a2b4c5d60>") == "<object at 0x<addr>>"
    assert normalise("wrote /tmp/pytest-7/test_x0/out.pt2") == "wrote …/out.pt2"
    assert normalise("busiest: 'rewrite_examples.py:96'") == "busiest: 'rewrite_examples.py:<line>'"
    assert normalise("uuid 0f8fad5b-d9cb-469f-a165-70867728950e") == "uuid <uuid>"
    assert normalise("graph 3f2a9c0b1d4e5f60") == "graph <hash>"
    assert normalise("┏━━━━┳━━┓") == normalise("┏━━┳━━━━━━┓")
    # what must still differ
    assert normalise("2 ranks") != normalise("3 ranks")
    assert normalise("add_1 -> add_1") != normalise("add_1 -> add_2")
    assert normalise("rel error 5e+04") != normalise("rel error 6e+04")


def test_ellipsis_and_the_report(tmp_path):
    assert matches("output 0 at [...]: expected ...", "output 0 at [3, 4]: expected 3.8")
    assert matches("first\n...\nlast", "first\na\nb\nlast")
    assert matches("first\n...\nlast", "first\nlast")
    assert not matches("output 0 at [...]", "output 1 at [3, 4]")
    assert not matches("a\nb", "a\nb\nc")

    doc = tmp_path / "page.md"
    doc.write_text(
        "```python\nprint(1)\n```\n\n```text\n2\n```\n"
        "```python\nprint(3)\n```\n<!-- not compared: random -->\n```text\n4\n```\n"
        "prose\n```text\nnot an output\n```\n"
    )
    page = read_page(doc)
    assert [ex.compared for ex in page.examples] == [True, False]
    assert mismatch(page, page.examples[0], "2\n") is None
    report = mismatch(page, page.examples[0], "1\n")
    assert report is not None
    assert report.startswith("page.md:5: the output shown after the python block at line 1")
    assert "\n-2\n+1\n" in report and "verbatim:\n    1" in report


def test_misplaced_markers_are_problems(tmp_path):
    doc = tmp_path / "page.md"
    doc.write_text("<!-- not compared: x -->\nprose\n```python\nprint(1)\n```\n")
    assert read_page(doc).problems
