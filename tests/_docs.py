"""The pages' examples as data, and what the docs test compares (see tests/test_docs.py).

A page is a list of fenced blocks. Its ```python blocks run, in order, in one namespace; a
```text block that follows a python block with only blank lines between them is that
block's output, compared with what the block printed after both are normalised:

* trailing whitespace and blank lines at either end are dropped;
* runs of spaces count as one, and runs of table rule characters (``─━═``) as one, so a
  table that re-aligns around a wider value still matches;
* timings — a number with a unit of time (``12.9 ms``, ``3 s``, ``40us``) or a number in a
  column headed by one (``ms``) — become ``<time>``; memory addresses (``0x7f3a...``)
  ``0x<addr>``; uuids ``<uuid>``; hex digests of 12 or more digits ``<hash>``;
  absolute paths lose their directories (``/tmp/pytest-3/out.pt2`` -> ``…/out.pt2``) and
  source positions their line (``my_rules.py:29`` -> ``my_rules.py:<line>``);
* ``...`` on the page matches any text within a line, and a line of only ``...`` any
  number of lines (doctest's ellipsis) — for what no rule covers and only there.

A text block that must not be compared carries ``<!-- not compared: REASON -->`` on the line
before its fence. ```py blocks are shown, never run (code for torchrun or a GPU).
"""

from __future__ import annotations

import difflib
import json
import os
import re
import select
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]

_FENCE = re.compile(r"^```(\S*)")
_SKIP = re.compile(r"^<!--\s*not compared:\s*(.*?)\s*-->\s*$")
MARK = "\x1edocs-block {}\x1e"
_MARK = re.compile(r"^\x1edocs-block (\d+)\x1e$", re.M)


@dataclass
class Block:
    """A fenced block: its language, the line of its opening fence (1-based), its text."""

    lang: str
    line: int
    text: str
    end: int  # the line of the closing fence
    skip_reason: str | None = None  # from a ``not compared`` marker before it


@dataclass
class Example:
    """A python block and the text block that shows its output (if any)."""

    code: Block
    output: Block | None = None

    @property
    def compared(self) -> bool:
        return self.output is not None and self.output.skip_reason is None


@dataclass
class Page:
    path: Path
    examples: list[Example] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)  # misplaced markers, unclosed fences

    @property
    def name(self) -> str:
        path = self.path.resolve()
        return str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else path.name


def read_page(path: Path) -> Page:
    page = Page(path)
    lines = path.read_text().splitlines()
    blocks: list[Block] = []
    marker: tuple[int, str] | None = None
    i = 0
    while i < len(lines):
        if (m := _SKIP.match(lines[i])) is not None:
            if not m.group(1):
                page.problems.append(f"{page.name}:{i + 1}: a 'not compared' marker says no reason")
            marker = (i + 1, m.group(1))
            i += 1
            continue
        if (m := _FENCE.match(lines[i])) is None:
            if lines[i].strip() and marker is not None:
                page.problems.append(f"{page.name}:{marker[0]}: marker not before a text block")
                marker = None
            i += 1
            continue
        start, i = i, i + 1
        while i < len(lines) and not lines[i].startswith("```"):
            i += 1
        if i == len(lines):
            page.problems.append(f"{page.name}:{start + 1}: fence never closed")
        body = "\n".join(lines[start + 1 : i]) + "\n"
        block = Block(m.group(1), start + 1, body, i + 1, marker[1] if marker else None)
        if marker is not None and block.lang != "text":
            page.problems.append(f"{page.name}:{marker[0]}: marker not before a text block")
        marker = None
        blocks.append(block)
        i += 1
    for j, block in enumerate(blocks):
        if block.lang != "python":
            continue
        example = Example(block)
        nxt = blocks[j + 1] if j + 1 < len(blocks) else None
        between = lines[block.end : nxt.line - 1] if nxt is not None else []
        if nxt is not None and nxt.lang == "text" and not "".join(between).strip(" "):
            example.output = nxt
        elif nxt is not None and nxt.skip_reason is not None:
            page.problems.append(
                f"{page.name}:{nxt.line}: a 'not compared' text block that is no python "
                "block's output (put the marker only where a text block follows one)"
            )
        page.examples.append(example)
    return page


# ----- normalising ---------------------------------------------------------------------------
_UNIT = r"(?:ns|us|µs|ms|s|sec|min)"
_NUMBER = r"[-+]?\d[\d,]*(?:\.\d+)?(?:e[-+]?\d+)?"
_TIMING = re.compile(rf"(?<![\w.]){_NUMBER} ?{_UNIT}(?![\w-])")
_HEADER_UNIT = re.compile(rf"(?<!\S){_UNIT}(?!\S)")
_NUMBER_TOKEN = re.compile(rf"(?<!\S){_NUMBER}(?!\S)")
_RULES = [
    (re.compile(r"0x[0-9a-fA-F]{4,}"), "0x<addr>"),
    (re.compile(r"\b[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}\b"), "<uuid>"),
    (re.compile(r"\b(?=[0-9a-f]*[a-f])(?=[0-9a-f]*\d)[0-9a-f]{12,}\b"), "<hash>"),
    (_TIMING, "<time>"),
    (re.compile(r"(?<![\w.~])/(?:[^\s/'\"():,]+/)+"), "…/"),
    (re.compile(r"(\.py)(:\d+)+\b"), r"\1:<line>"),
    (re.compile(r"[─━═]{2,}"), "─"),
    (re.compile(r" {2,}"), " "),
]


def _time_columns(lines: list[str]) -> list[str]:
    """Numbers under a column headed by a unit of time (``ms``) become ``<time>``."""
    out, spans = [], []
    for line in lines:
        if not line.strip():
            spans = []
        elif spans:
            line = _NUMBER_TOKEN.sub(lambda m, spans=spans: _under(m, spans), line)
        found = [m.span() for m in _HEADER_UNIT.finditer(line)]
        if found and len(line.split()) > 1 and not _NUMBER_TOKEN.search(line):
            spans = found
        out.append(line)
    return out


def _under(m: re.Match, spans: list[tuple[int, int]]) -> str:
    """``<time>`` for a number that overlaps a time column's header, else the number."""
    return "<time>" if any(m.start() < b and a < m.end() for a, b in spans) else m.group()


def normalise(text: str) -> str:
    """``text`` as the docs test compares it (rules in this module's docstring)."""
    lines = _time_columns([line.rstrip() for line in text.splitlines()])
    text = "\n".join(lines).strip("\n")
    for pattern, repl in _RULES:
        text = pattern.sub(repl, text)
    return "\n".join(line.rstrip() for line in text.splitlines())


def matches(expected: str, actual: str) -> bool:
    """``actual`` (normalised) is what ``expected`` (normalised, with ``...``) allows."""
    regex = []
    for line in expected.splitlines():
        if line.strip() == "...":
            regex.append(r"(?:[^\n]*\n)*?")
        else:
            parts = [re.escape(p) for p in line.split("...")]
            regex.append("[^\n]*?".join(parts) + "\n")
    return re.fullmatch("".join(regex), actual + "\n" if actual else "") is not None


def mismatch(page: Page, example: Example, printed: str) -> str | None:
    """None when ``example`` printed what its page shows, else a report with the diff."""
    assert example.output is not None
    expected, actual = normalise(example.output.text), normalise(printed)
    if matches(expected, actual):
        return None
    where = f"{page.name}:{example.output.line}"
    diff = difflib.unified_diff(
        expected.splitlines(),
        actual.splitlines(),
        f"{where} (the page)",
        f"what the python block at line {example.code.line} printed",
        lineterm="",
        n=2,
    )
    verbatim = "\n".join("    " + line for line in printed.strip("\n").splitlines())
    return (
        f"{where}: the output shown after the python block at line {example.code.line} is "
        f"not what it prints (compared normalised, see tests/_docs.py):\n"
        + "\n".join(diff)
        + f"\nit printed, verbatim:\n{verbatim or '    (nothing)'}"
    )


def script(page: Page) -> str:
    """One script of the page's python blocks; each announces itself on stdout."""
    parts = [
        f"print({MARK.format(i)!r}, flush=True)\n{ex.code.text}"
        for i, ex in enumerate(page.examples)
    ]
    return "\n".join(parts)


def split_output(stdout: str) -> dict[int, str]:
    """What each block printed, by its index in the page."""
    pieces = _MARK.split(stdout)
    return {int(pieces[k]): pieces[k + 1].lstrip("\n") for k in range(1, len(pieces) - 1, 2)}


# ----- running pages ----------------------------------------------------------------------------
# Importing torch and fxpass costs seconds per page. A server process imports them once and
# forks a fresh child per page (before any tensor work, as torch's DataLoader forks its
# workers), so each page still runs in its own interpreter: its registrations do not meet
# another page's. Up to ``jobs`` pages run at once.

_PRELOAD = ("torch", "fxpass", "torch._dynamo", "torch.export", "torch._inductor.compile_fx")


def serve() -> None:
    """The server: a JSON request per line on stdin (``id``, ``script``, ``cwd``, ``out``,
    ``err``); answers ``{id, pid}`` when a page starts and ``{id, rc}`` when it ends."""
    import importlib

    for name in _PRELOAD:
        importlib.import_module(name)
    _say({"ready": True})
    children: dict[int, str] = {}
    buf, stdin_open = b"", True
    while stdin_open or children:
        while children and (done := os.waitpid(-1, os.WNOHANG))[0]:
            _say({"id": children.pop(done[0]), "rc": os.waitstatus_to_exitcode(done[1])})
        if stdin_open and select.select([0], [], [], 0.1 if children else None)[0]:
            chunk = os.read(0, 1 << 16)
            stdin_open = bool(chunk)
            buf += chunk
        elif not stdin_open:
            time.sleep(0.1)
        while b"\n" in buf:
            line, _, buf = buf.partition(b"\n")
            req = json.loads(line)
            sys.stdout.flush()
            sys.stderr.flush()
            pid = os.fork()
            if pid == 0:
                _child(req)  # never returns
            children[pid] = req["id"]
            _say({"id": req["id"], "pid": pid})


def _say(event: dict) -> None:
    os.write(1, json.dumps(event).encode() + b"\n")


def _child(req: dict) -> None:
    import atexit
    import runpy
    import traceback

    code = 1
    try:
        os.setsid()  # its own process group: a timeout ends it and whatever it started
        os.chdir(req["cwd"])
        for fd, name, mode in (
            (0, os.devnull, os.O_RDONLY),
            (1, req["out"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC),
            (2, req["err"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC),
        ):
            target = os.open(name, mode, 0o644)
            os.dup2(target, fd)
            os.close(target)
        sys.stdout.reconfigure(line_buffering=True)  # in order with what subprocesses print
        sys.argv = [req["script"]]
        sys.path[0] = os.path.dirname(req["script"])
        try:
            runpy.run_path(req["script"], run_name="__main__")
            code = 0
        except SystemExit as e:
            code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
            if code and not isinstance(e.code, int):
                print(e.code, file=sys.stderr)
        except BaseException:
            traceback.print_exc()
        atexit._run_exitfuncs()  # as at the end of an interpreter (logging, worker pools)
    finally:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(code)


@dataclass
class _Run:
    cwd: Path
    deadline: float
    pid: int | None = None
    rc: int | None = None
    proc: subprocess.Popen | None = None  # without the server


class Runner:
    """Runs page scripts, forked from a warm server where the platform forks (Linux), else
    each in a fresh ``python``: ``submit`` starts one, ``result`` waits for it and returns
    (exit code, stdout, stderr)."""

    def __init__(self, env: dict[str, str]) -> None:
        self.env = env
        self.runs: dict[str, _Run] = {}
        self._buf = b""
        self.server: subprocess.Popen | None = None
        if hasattr(os, "fork") and sys.platform == "linux":
            self.server = subprocess.Popen(
                [sys.executable, __file__],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                bufsize=0,
                env=env,
            )
            self._event(time.monotonic() + 600)  # ready

    def submit(self, key: str, path: Path, timeout: float = 600) -> None:
        cwd = path.parent
        run = self.runs[key] = _Run(cwd, time.monotonic() + timeout)
        out, err = cwd / "stdout.txt", cwd / "stderr.txt"
        if self.server is None:
            with out.open("w") as o, err.open("w") as e:
                run.proc = subprocess.Popen(
                    [sys.executable, "-u", str(path)], cwd=cwd, stdout=o, stderr=e, env=self.env
                )
            return
        assert self.server.stdin is not None
        req = {"id": key, "script": str(path), "cwd": str(cwd), "out": str(out), "err": str(err)}
        self.server.stdin.write(json.dumps(req).encode() + b"\n")
        self.server.stdin.flush()

    def result(self, key: str) -> tuple[int, str, str]:
        run = self.runs[key]
        if run.proc is not None:
            try:
                run.rc = run.proc.wait(timeout=max(0.0, run.deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                run.proc.kill()
                raise TimeoutError(f"{key} ran past its time limit") from None
        while run.rc is None:
            try:
                self._event(run.deadline)
            except TimeoutError:
                if run.pid is not None:
                    os.killpg(run.pid, signal.SIGKILL)
                raise TimeoutError(f"{key} ran past its time limit") from None
        out, err = run.cwd / "stdout.txt", run.cwd / "stderr.txt"
        return run.rc, out.read_text(errors="replace"), err.read_text(errors="replace")

    def _event(self, deadline: float) -> dict:
        assert self.server is not None and self.server.stdout is not None
        fd = self.server.stdout.fileno()
        while b"\n" not in self._buf:
            if not select.select([fd], [], [], max(0.0, deadline - time.monotonic()))[0]:
                raise TimeoutError("the docs runner said nothing in time")
            chunk = os.read(fd, 1 << 16)
            if not chunk:
                raise RuntimeError(f"the docs runner exited ({self.server.wait()})")
            self._buf += chunk
        line, _, self._buf = self._buf.partition(b"\n")
        event = json.loads(line)
        if (run := self.runs.get(event.get("id", ""))) is not None:
            run.pid, run.rc = event.get("pid", run.pid), event.get("rc", run.rc)
        return event

    def close(self) -> None:
        for run in self.runs.values():
            if run.rc is None and run.pid is not None:
                os.killpg(run.pid, signal.SIGKILL)
            if run.proc is not None and run.proc.poll() is None:
                run.proc.kill()
        if self.server is not None:
            assert self.server.stdin is not None
            self.server.stdin.close()
            self.server.wait(timeout=60)


class PageRuns:
    """Each selected page run once, ``jobs`` at a time: asking for one page's result also
    starts the pages selected after it, so the next ones run while this one is checked."""

    def __init__(self, runner: Runner, selected: list[Path], jobs: int, workdir) -> None:
        self.runner, self.selected, self.jobs, self.workdir = runner, selected, jobs, workdir
        self.pages: dict[Path, Page] = {}

    def _start(self, path: Path) -> None:
        if path in self.pages:
            return
        page = self.pages[path] = read_page(path)
        if page.examples and not page.problems:
            file = self.workdir(path.stem) / f"{path.stem}_examples.py"
            file.write_text(script(page))
            self.runner.submit(page.name, file)

    def result(self, path: Path) -> tuple[Page, tuple[int, str, str] | None]:
        self._start(path)
        later = self.selected[self.selected.index(path) + 1 :] if path in self.selected else []
        running = [p for p in self.pages if self._running(p)]
        for nxt in later:
            if len(running) >= self.jobs:
                break
            if nxt not in self.pages:
                self._start(nxt)
                running.append(nxt)
        page = self.pages[path]
        done = self.runner.result(page.name) if page.name in self.runner.runs else None
        return page, done

    def _running(self, path: Path) -> bool:
        run = self.runner.runs.get(self.pages[path].name)
        return run is not None and run.rc is None


if __name__ == "__main__":
    serve()
