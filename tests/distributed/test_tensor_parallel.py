"""The sharding rewrite: weights sliced to 1/N, head counts rewritten, collectives inserted
through the editor (provenance, the report's changes, the debug counter), meta['val']
consistent; plans that do not fit are one-line errors; the pass is a pass."""

from __future__ import annotations

import pytest
import torch
from _shard_helpers import C10D, assert_vals_consistent, count, sharded

import fxpass as fp
from fxpass.distributed import PlanError, ShardError, analyze, weight_bytes
from fxpass.distributed.edit_script import EditScript
from fxpass.distributed.edits import Gather, MaskedLookup, Reduce, SetArg, SliceWeight
from fxpass.distributed.placement import Shard
from fxpass.distributed.strategy import Survey
from fxpass.distributed.tensor_parallel import rank_edits, rank_key, tensor_script
from fxpass.targets.inductor import inductor_pass

from _models import exported

aten = torch.ops.aten


class _MLP(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.up = torch.nn.Linear(16, 32)
        self.down = torch.nn.Linear(32, 16, bias=False)

    def forward(self, x):
        return self.down(torch.relu(self.up(x)))


def _script(ep, world_size: int = 2):
    planned = fp.distributed.plan_shards(ep, world_size)
    survey = Survey.of(ep, planned.mesh)
    return survey.gm, tensor_script(survey.gm, survey.params, planned.plan), planned.mesh


def _graph_state(gm) -> list:
    return [
        (n, n.name, n.target, n.args, dict(n.kwargs), n.meta.get("val")) for n in gm.graph.nodes
    ]


def test_a_ranks_edits_are_data_worked_out_without_touching_the_graph():
    torch.manual_seed(0)
    gm, script, mesh = _script(torch.export.export(_MLP(), (torch.randn(4, 16),)))
    state, code = _graph_state(gm), gm.code
    assert rank_edits(gm, script, mesh.place(1)) == EditScript(
        [Reduce("linear_1", "0")],  # the row-parallel down projection's partial sums
        [
            SliceWeight("p_up_weight", Shard(0), 1, 2),  # column-parallel, with its bias
            SliceWeight("p_up_bias", Shard(0), 1, 2),
            SliceWeight("p_down_weight", Shard(1), 1, 2),
        ],
    )
    assert _graph_state(gm) == state and gm.code == code


def test_the_decoders_edits_hold_the_ranks_numbers():
    gm, script, mesh = _script(exported(dtype=torch.float32))
    edits = rank_edits(gm, script, mesh.place(1))
    kinds = [type(e).__name__ for e in edits.edits]
    assert kinds.count("Reduce") == 4 and kinds.count("MaskedLookup") == 1  # 5 all-reduces
    assert SetArg("view_30", ("args", 1), [1, 8, 2, 16]) in edits.edits  # 2 of the 4 heads
    assert MaskedLookup("embedding", 64, 128, "0") in edits.edits  # the second half's rows
    assert Gather("view_49", 2, (1, 8, 64), 2, "0") in edits.edits  # the logits, whole
    assert {w.index for w in edits.weights} == {1} and len(edits.weights) == len(script.layouts)
    assert rank_edits(gm, script, mesh.place(0)).weights[0].index == 0


@pytest.mark.parametrize("world_size", [2, 4])
def test_sharded_weights_hold_one_nth_of_their_bytes(world_size):
    ep = exported(dtype=torch.float32)
    shards = sharded(world_size)
    plan = shards.plan
    cut = {d.param for d in plan.sharded}
    whole = sum(ep.state_dict[k].numel() * 4 for k in cut)
    rest = weight_bytes(ep) - whole
    for rank, program in enumerate(shards):
        mine = sum(program.state_dict[k].numel() * 4 for k in cut)
        assert mine * world_size == whole
        assert shards.rank_bytes(rank) == mine + rest  # replicated weights stay whole
        for k in set(ep.state_dict) - cut:
            assert torch.equal(program.state_dict[k], ep.state_dict[k])
    assert f"{weight_bytes(ep):,}" in str(shards)


def test_rank_zero_holds_the_first_rows_and_the_head_counts_are_local():
    ep = exported(dtype=torch.float32)
    r0, r1 = sharded(2)
    q = "layers.0.self_attn.q_proj.weight"
    assert torch.equal(torch.cat([r0.state_dict[q], r1.state_dict[q]]), ep.state_dict[q])
    o = "layers.0.self_attn.o_proj.weight"
    assert torch.equal(torch.cat([r0.state_dict[o], r1.state_dict[o]], 1), ep.state_dict[o])
    views = [n.args[1] for n in r0.graph.nodes if n.target is aten.view.default]
    assert [1, 8, 2, 16] in views and [1, 8, 4, 16] not in views  # 2 of the 4 heads


def test_collectives_and_metadata():
    program = sharded(2)[0]
    gm = program.graph_module
    assert count(gm, C10D.all_reduce.default) == 5  # embedding + 2 per layer
    assert count(gm, C10D.all_gather_into_tensor.default) == 1  # the logits
    assert count(gm, C10D.wait_tensor.default) == 6
    assert_vals_consistent(program)
    out = program.graph_module.graph.output_node().args[0][0]
    assert tuple(out.meta["val"].shape) == (1, 8, 128)


def test_the_pass_runs_from_a_pipeline_spec_and_reports_memory():
    ep = exported(dtype=torch.float32)
    result = fp.apply(ep, "tensor_parallel{world_size=2,rank=1}")
    stats = result.report.stats()
    assert (
        stats["tensor_parallel.weight_bytes_rank"] * 2
        == stats["tensor_parallel.weight_bytes_unsharded"]
    )
    assert torch.equal(
        result.program.state_dict["lm_head.weight"], sharded(2)[1].state_dict["lm_head.weight"]
    )
    assert "weight_bytes_rank" in str(result.report)


def test_world_size_one_is_a_no_op():
    ep = exported(dtype=torch.float32)
    assert not fp.apply(ep, "tensor_parallel{world_size=1,rank=0}").modified
    shards = fp.shard(ep, 1)
    assert shards[0] is ep and len(shards) == 1 and not shards.plan.decisions


def test_rank_must_be_in_the_world_and_known():
    ep = exported(dtype=torch.float32, layers=1)
    with pytest.raises(fp.PassFailedError, match="rank 2 is not in a world of size 2"):
        fp.apply(ep, "tensor_parallel{world_size=2,rank=2}")
    with pytest.raises(fp.PassFailedError, match="needs world_size and rank"):
        fp.apply(ep, "tensor_parallel")  # no process group here


def _edited(data, which, **changes):
    for d in data["decisions"]:
        if d["param"] == which:
            d.update(changes)
    return data


def _head_node():
    return sharded(2).plan["lm_head.weight"].node


@pytest.mark.parametrize(
    "change, message",
    [
        ({"param": "head.weight"}, "names the weight 'head.weight'"),
        ({"node": "mm_99"}, "has no node 'mm_99'"),
        ({"node": "embedding"}, "'embedding' does not use 'lm_head.weight' as a weight"),
    ],
)
def test_plans_that_do_not_fit_the_program(change, message):
    plan = _edited(sharded(2).plan.to_dict(), "lm_head.weight", **change)
    with pytest.raises(PlanError, match=message) as e:
        fp.shard(exported(dtype=torch.float32), 2, plan=plan)
    assert "\n" not in str(e.value)


def test_a_style_the_site_cannot_take():
    plan = _edited(sharded(2).plan.to_dict(), "embed_tokens.weight", style="column")
    with pytest.raises(PlanError, match="read by a embedding, which cannot be column"):
        fp.shard(exported(dtype=torch.float32), 2, plan=plan)


def test_an_inconsistent_edit_is_refused_and_the_program_left_alone():
    ep = exported(dtype=torch.float32)
    data = sharded(2).plan.to_dict()
    for d in data["decisions"]:
        if d["param"] == "layers.0.self_attn.q_proj.weight":
            d.update(style="replicate", dim=None)  # k and v still cut: attention cannot run
    with pytest.raises(PlanError, match="the plan does not fit the program: 'bmm' combines"):
        fp.shard(ep, 2, plan=data)  # core ATen's attention: q replicated, k cut


def test_a_failing_rewrite_leaves_the_program_alone():
    ep = exported(dtype=torch.float32)
    before = {k: v.clone() for k, v in ep.state_dict.items()}
    graph = str(ep.graph)
    with pytest.raises(fp.PassFailedError):
        fp.apply(ep, "tensor_parallel{world_size=2,rank=0},sequence_parallel{world_size=3,rank=0}")
    assert str(ep.graph) == graph
    assert all(torch.equal(before[k], v) for k, v in ep.state_dict.items())


def test_a_plan_for_another_world_size():
    with pytest.raises(PlanError, match=r"made for world size 2 \(tp 2\), not 4"):
        fp.shard(exported(dtype=torch.float32), 4, plan=sharded(2).plan)


def test_replicating_the_mlps_by_editing_the_plan():
    data = analyze(exported(dtype=torch.float32), 2).to_dict()
    for d in data["decisions"]:
        if ".mlp." in d["param"]:
            d.update(style="replicate", dim=None)
    program = fp.shard(exported(dtype=torch.float32), 2, plan=data)[0]
    assert count(program.graph_module, C10D.all_reduce.default) == 3  # embedding, attention
    assert program.state_dict["layers.0.mlp.up_proj.weight"].shape == (128, 64)


def test_inductor_cache_key_depends_on_the_rank():
    keys = {inductor_pass(f"tensor_parallel{{world_size=2,rank={r}}}").uuid() for r in (0, 1)}
    assert len(keys) == 2
    assert rank_key(world_size=2, rank=1) == "rank 1 of 2"
    with pytest.raises(ShardError):
        fp.distributed.tensor_parallel.resolve_rank(2, 5)


def test_a_graph_module_with_weights_as_attributes():
    gm = exported(dtype=torch.float32, layers=1).module()  # get_attr weights
    shards = fp.shard(gm, 2)
    w = shards[1].get_parameter("layers.0.mlp.down_proj.weight")
    assert w.shape == (64, 64) and isinstance(w, torch.nn.Parameter)
    assert gm.get_parameter("layers.0.mlp.down_proj.weight").shape == (64, 128)  # a copy
    assert shards.rank_bytes(0) * 2 < shards.unsharded_bytes * 1.02
    with pytest.raises(ShardError, match="save writes .pt2 files"):
        shards.save("unused")


class _Changes(fp.core.Instrumentation):
    def __init__(self) -> None:
        self.events = []

    def on_change(self, event, ctx) -> None:
        self.events.append(event)


def test_collectives_carry_provenance_and_pass_the_metadata_check():
    from fxpass.verify.invariants import check_metadata

    program = sharded(2)[0]
    assert check_metadata(program.graph_module) == []
    reduces = [n for n in program.graph.nodes if n.target is C10D.all_reduce.default]
    for node in reduces:
        assert (
            node.meta["from_node"] and node.meta["fxpass_provenance"]["pass"] == "tensor_parallel"
        )
        assert node.meta["fxpass_provenance"]["replaced"]  # the node it serves


def test_sharded_graphs_keep_what_tensor_and_sequence_parallelism_declare():
    """Rank 1 sharded with sequence parallelism: each strategy held to its declaration
    (values, stack traces, module stacks, provenance) by ``keeps_metadata``, and the graph
    passes the metadata check: every node has its value, every inserted node from_node."""
    from fxpass.verify.invariants import check_metadata, keeps_metadata

    ep = exported(dtype=torch.float32, layers=1)
    spec = "tensor_parallel{world_size=2,rank=1},sequence_parallel{world_size=2,rank=1}"
    result = fp.apply(ep, fp.Pipeline.parse(spec).add_checks(keeps_metadata()))
    gm = result.program.graph_module
    assert check_metadata(gm) == []
    made = [n for n in gm.graph.nodes if "fxpass_provenance" in n.meta]
    passes = {n.meta["fxpass_provenance"]["pass"] for n in made}
    assert passes == {"tensor_parallel", "sequence_parallel"}
    assert count(gm, C10D.reduce_scatter_tensor.default) and all(
        n.meta["from_node"] and n.meta.get("nn_module_stack") for n in made
    )


def test_every_collective_is_a_change_the_run_sees():
    changes = _Changes()
    ep = exported(dtype=torch.float32, layers=1)
    result = fp.apply(ep, "tensor_parallel{world_size=2,rank=0}", instrument=[changes])
    inserted = [n for e in changes.events if e.kind == "insert" for n in e.new]
    gm = result.program.graph_module
    assert {n.name for n in gm.graph.nodes if n.target is C10D.all_reduce.default} <= {
        n.name for n in inserted
    }
    assert all(e.rule == "tensor_parallel" for e in changes.events)


def test_the_debug_counter_stops_after_k_collectives():
    ep = exported(dtype=torch.float32, layers=1)
    result = fp.apply(ep, "tensor_parallel{world_size=2,rank=0}",
                      debug_counter=fp.core.DebugCounter(count=2))  # fmt: skip
    gm = result.program.graph_module
    made = count(gm, C10D.all_reduce.default) + count(gm, C10D.all_gather_into_tensor.default)
    assert made == 2  # of 4: embedding, two row-parallel matmuls, the logits
