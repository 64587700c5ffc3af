from __future__ import annotations

import sys
from pathlib import Path

# The test-only passes with planted bugs live beside the verify tests.
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "verify"))
