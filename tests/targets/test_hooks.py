"""Every hook point: named pipelines at each place torch.compile offers, in torch's order,
configured from Python, a config file or FXPASS_PIPELINES, each reported on its own."""

from __future__ import annotations

import json

import pytest
import torch
from _target_models import convnet
from test_backend import relu_to_clamp

import fxpass as fp
from fxpass.targets.hooks import (
    HOOKS,
    INDUCTOR_HOOKS,
    PipelinesConfigError,
    Placement,
    load_pipelines,
    parse_pipelines,
    pipelines_from_env,
)

SEEN: list[str] = []


def seen_at(gm, *, hook: str = "") -> bool:
    """Changes nothing; notes where it ran."""
    SEEN.append(hook)
    return False


@pytest.fixture(autouse=True)
def _fresh():
    torch._dynamo.reset()
    SEEN.clear()
    yield
    torch._dynamo.reset()


def _at(hook: str) -> fp.Pass:
    return fp.FunctionPass(seen_at, options={"hook": hook})


def _no_caches():
    return torch._inductor.config.patch(fx_graph_cache=False), torch._functorch.config.patch(
        enable_autograd_cache=False
    )


def test_pipelines_run_at_every_inductor_hook_in_torchs_order():
    model = convnet()
    (x,) = model.example_inputs()
    hooks = ["dynamo", *INDUCTOR_HOOKS]
    be = fp.backend(pipelines=[Placement(f"p_{h}", h, [_at(h)]) for h in reversed(hooks)])
    graph_cache, autograd_cache = _no_caches()
    with torch.no_grad(), graph_cache, autograd_cache:
        torch.testing.assert_close(torch.compile(model, backend=be)(x), model(x))
    assert hooks == SEEN  # the order torch runs them, whatever order they were given in
    for hook in hooks:
        (report,) = be.reports_for(f"p_{hook}")
        assert report.where == {"pipeline": f"p_{hook}", "hook": hook}


def test_aot_hook_sees_forward_and_backward_graphs_of_another_compiler():
    model = convnet()
    (x,) = model.example_inputs()
    be = fp.backend(pipelines={"dynamo": [_at("dynamo")], "aot": [relu_to_clamp]}, compiler="eager")
    torch.compile(model, backend=be)(x).sum().backward()
    assert SEEN == ["dynamo"]
    graphs = [r.where.get("graph") for r in be.reports_for("aot")]
    assert graphs == ["forward", "backward"]
    assert be.reports_for("aot")[0].find("relu_to_clamp").stats == {"relu_rewritten": 2}


def test_fxpass_pipelines_names_them_from_the_environment(monkeypatch, tmp_path):
    text = "cleanup@dynamo=test_hooks:seen_at{hook=d};fuse@post_grad_custom_post_pass=cse"
    monkeypatch.setenv("FXPASS_PIPELINES", text)
    be = fp.backend()
    assert [(p.name, p.hook) for p in be.settings.pipelines] == [
        ("cleanup", "dynamo"),
        ("fuse", "post_grad_custom_post_pass"),
    ]
    model = convnet()
    graph_cache, autograd_cache = _no_caches()
    with torch.no_grad(), graph_cache, autograd_cache:
        torch.compile(model, backend=be)(*model.example_inputs())
    assert SEEN == ["d"] and len(be.reports_for("fuse")) == 1
    config = tmp_path / "pipelines.toml"
    config.write_text('[pipelines.fusion]\nhook = "post_grad_custom_post_pass"\nspec = "cse,dce"\n')
    monkeypatch.setenv("FXPASS_PIPELINES", str(config))
    assert [(p.name, str(p.pipeline)) for p in pipelines_from_env()] == [("fusion", "cse,dce")]
    monkeypatch.setenv("FXPASS_PIPELINES", " ")
    assert pipelines_from_env() is None
    assert fp.backend("cse").settings.pipelines is None  # a pipeline given wins


@pytest.mark.parametrize(
    ("text", "at", "message"),
    [
        ("a@post_grad=cse", "post_grad", "unknown hook 'post_grad'"),
        ("dynamo=cse;a@aot=cse,,dce", ",dce", "expected a pass name"),
        ("dynamo=cse; aot", "aot", "expected name@hook=spec"),
    ],
)
def test_bad_environment_entries_point_at_their_column(text, at, message):
    with pytest.raises(fp.SpecError, match=message) as err:
        parse_pipelines(text)
    assert err.value.column == text.rindex(at) + 1


def test_config_files_and_their_errors(tmp_path):
    good = tmp_path / "p.json"
    good.write_text(json.dumps({"pipelines": {"x": {"hook": "aot", "spec": "cse"}}}))
    assert load_pipelines(good) == [Placement("x", "aot", "cse")]
    cases = {
        "nohook.json": ({"pipelines": {"x": {"spec": "cse"}}}, "has the keys hook and spec"),
        "badhook.json": ({"pipelines": {"x": {"hook": "late", "spec": "cse"}}}, "unknown hook"),
        "badspec.json": ({"pipelines": {"x": {"hook": "aot", "spec": "cse,,"}}}, "column 5"),
        "empty.json": ({"pipelines": {}}, "expected a 'pipelines' table"),
    }
    for name, (data, message) in cases.items():
        (tmp_path / name).write_text(json.dumps(data))
        with pytest.raises((PipelinesConfigError, fp.SpecError), match=message):
            load_pipelines(tmp_path / name)
    (tmp_path / "broken.toml").write_text("[pipelines.x\n")
    with pytest.raises(PipelinesConfigError, match="is not valid toml"):
        load_pipelines(tmp_path / "broken.toml")
    with pytest.raises(PipelinesConfigError, match="no pipelines config file"):
        load_pipelines(tmp_path / "missing.toml")


def test_bad_placements_are_refused():
    with pytest.raises(PipelinesConfigError, match="inside Inductor, but the compiler is 'eager'"):
        fp.backend(pipelines={"post_grad_custom_post_pass": "cse"}, compiler="eager")
    with pytest.raises(PipelinesConfigError, match="'aot', which is for compilers other than"):
        fp.backend(pipelines={"aot": "cse"})
    with pytest.raises(PipelinesConfigError, match="two pipelines are called 'a'"):
        fp.backend(pipelines=[("a", "dynamo", "cse"), ("a", "aot", "cse")], compiler="eager")
    with pytest.raises(PipelinesConfigError, match="unknown hook 'joint'; the hooks, in the order"):
        fp.backend(pipelines={"joint": "cse"})
    with pytest.raises(ValueError, match="either pipeline .* or pipelines"):
        fp.backend("cse", pipelines={"dynamo": "cse"})
    with pytest.raises(KeyError, match="no pipeline called 'x'"):
        fp.backend(pipelines={"dynamo": "cse"}).reports_for("x")
    assert HOOKS[0] == "dynamo" and HOOKS[-1] == "aot"
