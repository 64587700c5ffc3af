"""The registry: typed options, pass lists with index insertion, enable/disable, plug-ins."""

from __future__ import annotations

import sys
import textwrap
from typing import Literal

import pytest
import torch

import fxpass as fp
from fxpass.core.pass_registry import Registry
from fxpass.core.pipeline import register_pipelines


@pytest.fixture
def reg() -> Registry:
    return Registry(entry_points=False)


def _passes(reg: Registry) -> None:
    @reg.register("strip")
    def strip(gm, *, eps: float = 1e-6, mode: Literal["fast", "exact"] = "fast") -> bool:
        """Strip things.

        Longer description that is not part of the summary.
        """
        return False

    @reg.register
    def fold(gm, sample_inputs, *, limit: int | None = None):
        """Fold constants (a lowering pass)."""
        return gm

    @reg.register("renamed")
    class Canon(fp.Pass):
        """Canonicalize."""

        def __init__(self, *, names: list[str] | None = None) -> None:
            self.names = names

        def call(self, gm):
            return False


def test_options_summary_and_source_come_from_the_definition(reg):
    _passes(reg)
    info = reg.get("strip")
    assert info.summary == "Strip things."
    assert list(info.options) == ["eps", "mode"]
    assert info.options["eps"].default == 1e-6 and info.options["eps"].type_name == "float"
    assert info.options["mode"].type_name == "one of fast|exact"
    assert info.source.endswith(f"test_pass_registry.py:{info.source.rsplit(':', 1)[1]}")
    assert list(reg.get("fold").options) == ["limit"]
    assert reg.get("renamed").options["names"].type_name == "list of str | none"
    assert reg.names() == ["fold", "renamed", "strip"]


def test_create_validates_option_types(reg):
    _passes(reg)
    p = reg.create("strip", eps=1e-5, mode="exact")
    assert p.spec == "strip{eps=1e-05 mode=exact}"
    assert reg.create("strip", eps=1).options["eps"] == 1.0  # ints widen to float
    with pytest.raises(fp.core.OptionError, match="option 'eps' expects float, got 'x'"):
        reg.create("strip", eps="x")
    with pytest.raises(fp.core.OptionError, match="one of fast|exact"):
        reg.create("strip", mode="slow")
    with pytest.raises(fp.core.OptionError, match="has no option 'epz'; did you mean 'eps'"):
        reg.create("strip", epz=1.0)
    assert reg.create("renamed", names=["a", "b"]).names == ["a", "b"]
    assert reg.create("renamed").name == "renamed"


def test_unknown_name_suggests_close_names(reg):
    _passes(reg)
    with pytest.raises(fp.core.UnknownPassError, match="did you mean 'strip'"):
        reg.get("strp")
    with pytest.raises(KeyError):  # also a KeyError, for dict-like code
        reg.get("nothing-like-it")


def test_duplicate_names_are_refused_unless_replaced(reg):
    _passes(reg)
    with pytest.raises(ValueError, match="already registered"):
        reg.register("strip")(lambda gm: None)
    reg.register("strip", replace=True)(lambda gm: None)


def test_index_insertion_listing_and_removal_like_torch_tensorrt(reg, llama_gm):
    _passes(reg)
    order = []

    @reg.register("first", index=0, pass_list="lowering")
    def first(gm, sample_inputs):
        """Runs first."""
        order.append("first")
        return gm

    @reg.register("last", pass_list="lowering")
    def last(gm, sample_inputs):
        """Runs last."""
        order.append("last")
        return gm

    @reg.register("middle", index=1, pass_list="lowering")
    def middle(gm, sample_inputs):
        """Runs in the middle."""
        order.append("middle")
        return gm

    lowering = reg.pass_list("lowering")
    assert lowering.names() == ["first", "middle", "last"]
    dump = lowering.dump()
    assert "0  first" in dump and "1  middle" in dump and "Runs in the middle." in dump
    with pytest.raises(LookupError, match="register_pipelines"):
        lowering.apply(llama_gm, [torch.zeros(1)])  # a bare registry makes no pipelines
    register_pipelines(reg)
    lowering.apply(llama_gm, [torch.zeros(1)])
    assert order == ["first", "middle", "last"]
    assert lowering.remove(1) == "middle"
    lowering.remove("first")
    assert lowering.names() == ["last"]
    with pytest.raises(IndexError, match="no index 5"):
        lowering.remove(5)
    with pytest.raises(KeyError, match="has no pass 'first'"):
        lowering.remove("first")


def test_register_with_index_alone_uses_the_default_list(reg):
    _passes(reg)
    reg.register("zeroth", index=0)(lambda gm: None)
    assert reg.pass_list("default").names() == ["zeroth"]


def test_disable_and_enable(reg):
    _passes(reg)
    reg.disable("strip")
    assert not reg.is_enabled("strip")
    reg.pass_list("x").insert("strip")
    assert "[disabled]" in reg.pass_list("x").dump()
    reg.enable("strip")
    assert reg.is_enabled("strip")


def test_unregister_drops_from_pass_lists(reg):
    _passes(reg)
    reg.pass_list("x").insert("strip")
    reg.unregister("strip")
    assert "strip" not in reg.names() and reg.pass_list("x").names() == []


def test_global_registry_names_and_builtins():
    names = fp.registry.names()
    assert {"fixpoint", "pipeline", "default"} <= set(names)
    assert names == sorted(names)


def test_entry_point_plugins_are_discovered(tmp_path, monkeypatch):
    pkg = tmp_path / "fxpass_test_plugin_pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text(
        textwrap.dedent(
            '''
            def plugin_noop(gm, *, level: int = 1):
                """A pass from a plug-in."""
                return False
            '''
        )
    )
    (pkg / "registers.py").write_text(
        textwrap.dedent(
            '''
            import fxpass

            @fxpass.register("plugin_from_module")
            def plugin_from_module(gm):
                """Registered by importing the module."""
                return False
            '''
        )
    )
    dist = tmp_path / "fxpass_test_plugin-0.1.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: fxpass-test-plugin\nVersion: 0.1\n"
    )
    (dist / "entry_points.txt").write_text(
        "[fxpass.passes]\n"
        "plugin_noop = fxpass_test_plugin_pkg:plugin_noop\n"
        "plugin_module = fxpass_test_plugin_pkg.registers\n"
        "plugin_broken = fxpass_test_plugin_pkg:does_not_exist\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    registry = fp.registry.REGISTRY
    monkeypatch.setattr(registry, "_infos", dict(registry._infos))
    monkeypatch.setattr(registry, "_plugins_loaded", False)
    monkeypatch.setattr(registry, "plugin_errors", [])
    assert registry.get("fuse_add_rmsnorm").origin == "fxpass"  # a pass of fxpass's own:
    assert not registry._plugins_loaded  # found without scanning the installed distributions
    with pytest.warns(UserWarning, match="could not load pass plug-in 'plugin_broken'"):
        names = registry.names()
    assert "plugin_noop" in names and "plugin_from_module" in names
    info = registry.get("plugin_noop")
    assert info.origin == "plugin fxpass-test-plugin"
    assert info.summary == "A pass from a plug-in."
    assert fp.Pipeline.parse("plugin_noop{level=2},plugin_from_module").passes[0].options == {
        "level": 2
    }
    assert "distribution 'fxpass-test-plugin'" in registry.plugin_errors[0]
    sys.modules.pop("fxpass_test_plugin_pkg", None)
    sys.modules.pop("fxpass_test_plugin_pkg.registers", None)


def test_statistics_are_declared_in_the_decorator(reg, llama_gm):
    @reg.register("count_mm", statistics={"mm": "matrix products seen"})
    def count_mm(gm) -> bool:
        """Count the matrix products."""
        for node in gm.graph.nodes:
            if node.target in (torch.ops.aten.mm.default, torch.ops.aten.addmm.default):
                fp.stat("mm")
        return False

    assert reg.get("count_mm").statistics == {"mm": "matrix products seen"}
    assert reg.create("count_mm").statistics == count_mm.statistics
    stats = fp.Pipeline.parse("count_mm", registry=reg).run(llama_gm).report.stats()
    assert stats["count_mm.mm"] > 0

    @reg.register("old_style")
    def old_style(gm) -> None:
        """Statistics set the old way, after the decorator."""

    old_style.statistics = {"n": "still read"}
    assert reg.create("old_style").statistics == {"n": "still read"}


def test_a_rule_set_registers_directly(reg, llama_gm):
    x, neg = fp.P.var("x"), torch.ops.aten.neg.default
    fold = reg.register(fp.rules("fold_neg_neg", [(fp.P(neg, fp.P(neg, x)), lambda x: x)]))
    assert isinstance(fold, fp.RuleSet) and reg.create("fold_neg_neg") is fold
    assert reg.get("fold_neg_neg").statistics["rewrites"]
    pipe = fp.Pipeline.parse("fold_neg_neg", registry=reg)
    assert str(pipe) == "fold_neg_neg" and pipe.passes == [fold]
    assert not pipe.run(llama_gm).modified  # no neg in the graph: nothing to fold
