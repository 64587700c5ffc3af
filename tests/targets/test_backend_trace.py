"""tlparse renders a TORCH_TRACE log of a torch.compile with fxpass: each pass is visible,
in the compile that ran it, between Dynamo's, AOT's and Inductor's own artifacts."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

HERE = Path(__file__).parent

_SCRIPT = textwrap.dedent(
    """
    import sys
    sys.path.insert(0, {here!r})
    import torch
    import fxpass as fp
    from _target_models import convnet
    from test_backend import relu_to_clamp

    model = convnet()
    be = fp.backend(pipelines=[("cleanup", "dynamo", "remove_assert_ops"),
                               ("fusion", "post_grad_custom_post_pass", [relu_to_clamp, "cse"])])
    with torch.no_grad(), torch._inductor.config.patch(fx_graph_cache=False), \\
            torch._functorch.config.patch(enable_autograd_cache=False):
        torch.compile(model, backend=be)(*model.example_inputs())
    """
)


def _tlparse() -> str:
    found = shutil.which("tlparse", path=str(Path(sys.executable).parent)) or shutil.which(
        "tlparse"
    )
    assert found, "tlparse is in the test extra: pip install -e '.[test]'"
    return found


def test_tlparse_shows_each_pass_beside_torchs_stages(tmp_path):
    script = _SCRIPT.format(here=str(HERE))
    env = {**os.environ, "TORCH_TRACE": str(tmp_path / "trace")}
    run = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True)
    assert run.returncode == 0, run.stderr[-3000:]
    (log,) = (tmp_path / "trace").iterdir()
    out = tmp_path / "tl_out"
    parsed = subprocess.run(
        [_tlparse(), str(log), "-o", str(out), "--no-browser", "--strict"],
        capture_output=True,
        text=True,
    )
    assert parsed.returncode == 0, parsed.stderr[-2000:]
    (compile_dir,) = [d for d in out.iterdir() if d.is_dir() and d.name.startswith("-_0_0")]
    files = sorted(compile_dir.iterdir(), key=lambda p: int(p.stem.rsplit("_", 1)[1]))
    names = [p.stem.rsplit("_", 1)[0] for p in files]
    order = {name: i for i, name in reversed(list(enumerate(names)))}
    assert "fxpass_cleanup_dynamo_01_remove_assert_ops" in order
    assert order["dynamo_output_graph"] < order["fxpass_cleanup_dynamo_graph_before"]
    assert order["fxpass_cleanup_dynamo_report"] < order["before_pre_grad_graph"]
    fusion = "fxpass_fusion_post_grad_custom_post_pass"
    assert order["before_post_grad_graph"] < order[f"{fusion}_01_relu_to_clamp"]
    assert order[f"{fusion}_report"] < order["inductor_post_grad_graph"]
    record = json.loads((compile_dir / _file(files, f"{fusion}_01_relu_to_clamp")).read_text())
    assert record["stats"] == {"relu_rewritten": 2} and record["changed"]
    diff = (compile_dir / _file(files, f"{fusion}_01_relu_to_clamp_changes")).read_text()
    assert "+    clamp_min" in diff and "-    relu = " in diff
    index = (out / "index.html").read_text()
    assert f"{fusion}_02_cse" in index  # listed on tlparse's page for the compile


def _file(files: list[Path], name: str) -> str:
    return next(p.name for p in files if p.stem.rsplit("_", 1)[0] == name)
