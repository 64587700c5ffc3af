from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

# Every pipeline run in the tests checks the analyses its passes declare preserved: computed
# again after each pass that changed the graph and compared (fxpass.core.analysis_manager).
os.environ.setdefault("FXPASS_VERIFY_ANALYSES", "1")

import _models

ARTIFACTS = Path(
    os.environ.get("FXPASS_TEST_ARTIFACTS", Path(__file__).parent.parent / "test-artifacts")
)


@pytest.fixture
def llama_ep() -> torch.export.ExportedProgram:
    """A fresh core-ATen ExportedProgram of the 2-layer tiny decoder (asserts kept)."""
    return _models.exported()


@pytest.fixture
def llama_gm() -> torch.fx.GraphModule:
    """A fresh GraphModule of the exported core-ATen 2-layer decoder (asserts kept)."""
    return _models.exported_gm()


@pytest.fixture
def llama_model() -> torch.nn.Module:
    return _models.decoder()


@pytest.fixture(scope="session")
def artifacts_dir() -> Path:
    """Where tests keep files worth looking at after a run (screenshots, reports)."""
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    return ARTIFACTS
