"""The fusions inside control flow: RMSNorms in ``torch.cond`` branches and ``torch.map``
bodies of exported programs are fused where they are, nested conditionals included, and the
program computes what the eager model does on either branch."""

from __future__ import annotations

import operator

import pytest
import torch
from _fusion_helpers import LlamaRMSNorm, PowRMSNorm, assert_close, count
from torch import fx
from torch._higher_order_ops.map import map as torch_map
from torch.fx.experimental.proxy_tensor import make_fx

import fxpass as fp
from fxpass.fxutil.subgraphs import control_flow_subgraphs

F = torch.ops.fxpass


class CondNorms(torch.nn.Module):
    """An RMSNorm in each branch of a ``torch.cond`` (another spelling in each), a residual
    add and norm after it."""

    def __init__(self, hidden=16):
        super().__init__()
        self.a, self.b, self.c = LlamaRMSNorm(hidden), PowRMSNorm(hidden), LlamaRMSNorm(hidden)

    def forward(self, x, r, flag):
        y = torch.cond(flag.sum() > 0, lambda x: self.a(x), lambda x: self.b(x) * 2.0, (x,))
        return self.c(y + r)


class MapNorm(torch.nn.Module):
    def __init__(self, hidden=16):
        super().__init__()
        self.norm = LlamaRMSNorm(hidden)

    def forward(self, xs):
        return torch_map(lambda x: self.norm(x), xs)


def _sites(gm, op) -> int:
    return count(gm, op) + sum(count(sub, op) for _, sub in control_flow_subgraphs(gm))


_X = torch.randn(3, 16, dtype=torch.bfloat16)
_R = torch.randn(3, 16, dtype=torch.bfloat16)


@pytest.mark.parametrize("decompose", [False, True])
def test_norms_in_both_branches_of_a_cond_are_fused(decompose):
    torch.manual_seed(0)
    model = CondNorms().to(torch.bfloat16).eval()
    flags = (torch.ones(2), -torch.ones(2))
    ep = torch.export.export(model, (_X, _R, flags[0]))
    if decompose:
        ep = ep.run_decompositions()
    result = fp.Pipeline(["fuse_add_rmsnorm", "fuse_rmsnorm"]).run(ep.graph_module)
    assert result.report.find("fuse_rmsnorm").stats["rewrites"] == 2  # one in each branch
    assert count(ep.graph_module, F.fused_add_rmsnorm.default) == 1
    branches = dict(control_flow_subgraphs(ep.graph_module))
    assert sorted(branches) == ["false_graph_0", "true_graph_0"]
    assert all(count(g, F.rms_norm.default) == 1 for g in branches.values())
    for flag in flags:  # each branch taken, against the eager model
        assert_close(ep.module()(_X, _R, flag), model(_X, _R, flag), torch.bfloat16)


def test_norms_in_the_branches_of_a_dynamo_graph_are_fused():
    from _captures import dynamo_capture

    torch.manual_seed(0)
    model = CondNorms().eval()
    args = (_X.float(), _R.float(), torch.ones(2))
    gm, real = dynamo_capture(model, args, "dynamo")
    result = fp.Pipeline(["fuse_rmsnorm"]).run(gm)
    assert result.report.stats()["fuse_rmsnorm.rewrites"] == 3
    assert _sites(gm, F.rms_norm.default) == 3 and count(gm, F.rms_norm.default) == 1
    gm.recompile()
    torch.testing.assert_close(gm(*real)[0], model(*args), rtol=1e-5, atol=1e-5)


def test_norm_in_a_map_body_is_fused():
    torch.manual_seed(0)
    model = MapNorm().eval()
    xs = torch.randn(4, 3, 16)
    ep = torch.export.export(model, (xs,))
    assert fp.Pipeline(["fuse_rmsnorm"]).run(ep.graph_module).modified
    ((name, body),) = control_flow_subgraphs(ep.graph_module)
    assert count(body, F.rms_norm.default) == 1, name
    assert_close(ep.module()(xs), model(xs), torch.float32)


def test_subgraphs_are_left_alone_when_asked():
    from fxpass.passes.fusion.fuse_rmsnorm import RULES
    from fxpass.rewrite import rewrite

    torch.manual_seed(0)
    ep = torch.export.export(CondNorms().eval(), (_X.float(), _R.float(), torch.ones(2)))
    assert rewrite(ep.graph_module, RULES, once=True, subgraphs=False).rewrites == 1
    assert _sites(ep.graph_module, F.rms_norm.default) == 1  # only the norm outside the cond


def test_a_failed_pass_restores_the_branches_too():
    torch.manual_seed(0)
    ep = torch.export.export(CondNorms().eval(), (_X.float(), _R.float(), torch.ones(2)))
    branches = dict(control_flow_subgraphs(ep.graph_module))
    before = {name: str(g.graph) for name, g in branches.items()}

    def boom(gm):
        raise RuntimeError("fails after the fusion")

    with pytest.raises(fp.PassFailedError):
        fp.Pipeline(["fuse_rmsnorm", boom]).run(ep.graph_module)
    assert {name: str(g.graph) for name, g in branches.items()} == before


# ----- nesting, hand-built (export takes seconds per level) ------------------------------------
def _leaf(x, w, p):
    return (w * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6)),)


def _doubled(x, w, p):
    return (x * 2.0,)


def nested_conds(depth: int, x, w, p) -> fx.GraphModule:
    """``depth`` conditionals, each true branch the next one, the innermost an RMSNorm; every
    false branch doubles ``x`` (one shared module)."""
    gm = make_fx(_leaf, tracing_mode="fake")(x, w, p)
    other = make_fx(_doubled, tracing_mode="fake")(x, w, p)
    vals = [n.meta["val"] for n in gm.graph.find_nodes(op="placeholder")]
    for _ in range(depth):
        g = fx.Graph()
        ins = [g.placeholder(name) for name in ("x", "w", "p")]
        for node, val in zip(ins, vals):
            node.meta["val"] = val
        root = torch.nn.Module()
        root.true_graph_0, root.false_graph_0 = gm, other
        branches = g.get_attr("true_graph_0"), g.get_attr("false_graph_0")
        cond = g.call_function(torch.ops.higher_order.cond, (ins[2], *branches, tuple(ins)))
        out = g.call_function(operator.getitem, (cond, 0))
        out.meta["val"] = vals[0]
        g.output((out,))
        gm = fx.GraphModule(root, g)
    return gm


def test_deeply_nested_conds_are_walked_without_recursion():
    import sys

    x, w, p = torch.randn(6, 8), torch.randn(8), torch.tensor(True)
    depth = 40
    gm = nested_conds(depth, x, w, p)
    limit = sys.getrecursionlimit()
    here = len(__import__("inspect").stack(0))
    sys.setrecursionlimit(here + depth // 2)  # too few frames to walk 40 levels recursively
    try:
        found = list(control_flow_subgraphs(gm))
    finally:
        sys.setrecursionlimit(limit)
    assert len(found) == depth + 1  # the true branch of each level, one shared false branch
    assert found[-1][0] == ".".join(["true_graph_0"] * depth)
    result = fp.Pipeline(["fuse_rmsnorm"]).run(gm)
    assert result.report.stats()["fuse_rmsnorm.rewrites"] == 1
    innermost = found[-1][1]
    assert count(innermost, F.rms_norm.default) == 1
    torch.testing.assert_close(innermost(x, w, p)[0], _leaf(x, w, p)[0])
    shallow = nested_conds(3, x, w, p)  # torch runs a few levels eagerly: the same numbers
    fp.Pipeline(["fuse_rmsnorm"]).run(shallow)
    torch.testing.assert_close(shallow(x, w, p)[0], _leaf(x, w, p)[0])
