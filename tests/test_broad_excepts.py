"""No silent failure (docs/architecture.md, "Broad excepts"): every handler in src/fxpass that
catches everything — ``except:``, ``except Exception``, ``except BaseException`` (alone or in
a tuple), ``contextlib.suppress(Exception)`` — raises, reports (``warnings.warn`` or a log
record at info level or above), or says on its ``except`` line why swallowing is right there,
in a ``# broad: <why>`` comment."""

from __future__ import annotations

import ast
import io
import tokenize
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "src" / "fxpass"
BROAD = {"Exception", "BaseException"}
LOG_METHODS = {"info", "warning", "error", "exception", "critical"}
TAG = "# broad:"


def _names(node: ast.expr | None) -> set[str]:
    if node is None:
        return {"BaseException"}  # a bare except
    parts = node.elts if isinstance(node, ast.Tuple) else [node]
    return {p.id if isinstance(p, ast.Name) else getattr(p, "attr", "") for p in parts}


def _own_nodes(body: list[ast.stmt]):
    """The handler's statements and expressions, not those of functions defined in it."""
    stack: list[ast.AST] = list(body)
    while stack:
        node = stack.pop()
        yield node
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            stack.extend(ast.iter_child_nodes(node))


def _reports(node: ast.AST) -> bool:
    if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Attribute):
        return False
    owner = node.func.value
    if node.func.attr == "warn" and isinstance(owner, ast.Name) and owner.id == "warnings":
        return True
    return node.func.attr in LOG_METHODS and isinstance(owner, ast.Name) and "log" in owner.id


def _handled(handler: ast.ExceptHandler) -> bool:
    return any(isinstance(n, ast.Raise) or _reports(n) for n in _own_nodes(handler.body))


def _justified(comments: dict[int, str], line: int) -> bool:
    text = comments.get(line, "")
    return text.startswith(TAG) and len(text) > len(TAG) + 3


def _suppresses_everything(node: ast.AST) -> bool:
    return (
        isinstance(node, ast.Call)
        and getattr(node.func, "attr", getattr(node.func, "id", "")) == "suppress"
        and any(_names(a) & BROAD for a in node.args)
    )


def silent_handlers(source: str) -> list[int]:
    """Lines of the broad handlers in ``source`` that neither raise, report nor say why."""
    comments = {
        tok.start[0]: tok.string
        for tok in tokenize.generate_tokens(io.StringIO(source).readline)
        if tok.type == tokenize.COMMENT
    }
    silent = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ExceptHandler) and _names(node.type) & BROAD:
            if not _handled(node) and not _justified(comments, node.lineno):
                silent.append(node.lineno)
        elif _suppresses_everything(node) and not _justified(comments, node.lineno):
            silent.append(node.lineno)
    return sorted(silent)


def test_every_broad_except_raises_reports_or_says_why():
    silent = [
        f"src/fxpass/{p.relative_to(PACKAGE)}:{line}"
        for p in sorted(PACKAGE.rglob("*.py"))
        for line in silent_handlers(p.read_text())
    ]
    assert not silent, (
        "broad excepts that swallow silently (raise, warn, log at info or above, or write "
        f"'{TAG} <why>' on the except line): " + ", ".join(silent)
    )


def test_the_walk_tells_silent_handlers_from_the_others():
    source = """
import contextlib, warnings
try: f()
except Exception: pass
try: f()
except (ValueError, BaseException) as e: return None
try: f()
except: x = 1
try: f()
except Exception as e: raise RuntimeError("clearer") from e
try: f()
except Exception as e: warnings.warn(str(e))
try: f()
except Exception as e: log.warning("%s", e)
try: f()
except Exception as e: log.debug("%s", e)
try: f()
except Exception:  # broad: a comparison that cannot decide means different
    same = False
try: f()
except Exception:  # broad:
    pass
try: f()
except Exception:
    def later(): raise
try: f()
except ValueError: pass
with contextlib.suppress(Exception): g()
with contextlib.suppress(Exception):  # broad: the picture works without the module name
    g()
with contextlib.suppress(KeyError): g()
"""
    assert silent_handlers(source) == [4, 6, 8, 16, 21, 24, 28]
