"""Linear and embedding sites are found in every IR spelling, from the graph alone."""

from __future__ import annotations

import torch
from torch import nn

from fxpass.distributed.sites import Params, find_sites

from _models import exported


class _Biased(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(16, 8)
        self.up = nn.Linear(8, 12)
        self.down = nn.Linear(12, 8)

    def forward(self, ids):
        return self.down(torch.relu(self.up(self.emb(ids))))


def _sites(ep):
    params = Params(ep.graph_module, ep.graph_signature)
    return [
        (s.kind, params.name(s.weight), s.bias is not None)
        for s in find_sites(ep.graph_module, params)
    ]


def test_export_and_core_aten_spellings_give_the_same_sites():
    ids = torch.randint(0, 16, (2, 3))
    ep = torch.export.export(_Biased(), (ids,))
    expected = [("embedding", "emb.weight", False), ("linear", "up.weight", True),
                ("linear", "down.weight", True)]  # fmt: skip
    assert _sites(ep) == expected  # aten.linear
    assert _sites(ep.run_decompositions()) == expected  # addmm(b, x, permute(W))


def test_decoder_sites_in_graph_order():
    sites = _sites(exported(dtype=torch.float32))
    names = [name.split(".")[-2] for _, name, _ in sites]
    layer = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
    assert names == ["embed_tokens", *layer, *layer, "lm_head"]


def test_user_inputs_are_not_weights():
    ep = exported(dtype=torch.float32)
    params = Params(ep.graph_module, ep.graph_signature)
    ids = next(n for n in ep.graph.nodes if n.name == "input_ids")
    assert not params.is_weight(ids)
    assert params.name(ep.graph_module.graph.find_nodes(op="placeholder")[0]) == (
        "embed_tokens.weight"
    )
