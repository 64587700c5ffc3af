"""Read back what an HTML report draws (tests of the passes whose changes it shows)."""

from __future__ import annotations

import json
import re
from pathlib import Path

_NODES = re.compile(r"<script type='application/json' id='fxpass-nodes'>(.*?)</script>", re.S)


def drawn_nodes(path: str | Path) -> list[dict]:
    """The nodes the report's change list draws: the details its pictures' tooltips show
    (``name``, ``status`` — ``new``, ``removed``, ... — ``target``, ``provenance``,
    ``from_node``)."""
    found = _NODES.search(Path(path).read_text())
    assert found, f"{path} has no drawn nodes"
    return list(json.loads(found.group(1)).values())
