"""Loading .pt2 files: damaged archives are refused by member, unknown output types load as
faithful stand-ins (or as the real type from an allowed package), failures name the cause."""

from __future__ import annotations

import dataclasses
import functools
import json
import struct
import sys
import textwrap
import zipfile
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from fxpass.targets.pt2 import Pt2Error, StandIn, check_archive, load, stand_in_types


@dataclasses.dataclass
class Out:
    y: torch.Tensor
    z: torch.Tensor


torch.export.register_dataclass(Out, serialized_type_name="fxpass_tests.pt2.Out")
TYPE = "fxpass_tests.pt2.Out"


class Tiny(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(8, 16)
        self.register_buffer("scale", torch.linspace(1, 2, 16))

    def forward(self, x):
        y = self.lin(x)
        return Out(y=y, z=y * self.scale)


X = torch.randn(2, 8)


@functools.cache
def _saved(folder: Path) -> Path:
    torch.manual_seed(0)
    ep = torch.export.export(Tiny(), (X,))
    path = folder / "tiny.pt2"
    torch.export.save(ep, path)
    return path


@pytest.fixture
def good(tmp_path_factory) -> Path:
    return _saved(tmp_path_factory.getbasetemp())


def rewrite(src: Path, dst: Path, edit: Callable[[str, bytes], bytes]) -> Path:
    """A copy of the archive ``src`` with members edited (their checksums updated)."""
    with zipfile.ZipFile(src) as zin, zipfile.ZipFile(dst, "w", zipfile.ZIP_STORED) as zout:
        for item in zin.infolist():
            zout.writestr(item, edit(item.filename, zin.read(item.filename)))
    return dst


def renamed(src: Path, dst: Path, old: str, new: str) -> Path:
    """``src`` with a name replaced in the program's JSON (a type or an operator)."""

    def edit(name: str, data: bytes) -> bytes:
        return data.replace(old.encode(), new.encode()) if name.endswith("model.json") else data

    return rewrite(src, dst, edit)


def _weight_member(path: Path, fqn: str) -> str:
    with zipfile.ZipFile(path) as zf:
        config = next(n for n in zf.namelist() if n.endswith("model_weights_config.json"))
        entry = json.loads(zf.read(config))["config"][fqn]
    return f"{config.rsplit('/', 1)[0]}/{entry['path_name']}"


# ----- integrity ------------------------------------------------------------------------------
def test_a_good_archive_passes_and_loads(good):
    check_archive(good)
    out = load(good).module()(X)
    assert isinstance(out, Out)


def test_flipped_bytes_in_a_weight_are_refused_naming_the_member(good, tmp_path):
    member = _weight_member(good, "lin.weight")
    raw = bytearray(good.read_bytes())
    with zipfile.ZipFile(good) as zf:
        info = zf.getinfo(member)
    name_len, extra_len = struct.unpack(
        "<HH", raw[info.header_offset + 26 : info.header_offset + 30]
    )
    start = info.header_offset + 30 + name_len + extra_len
    for i in range(start + 100, start + 300):  # 200 bytes inside the weight's data
        raw[i] ^= 0xFF
    bad = tmp_path / "flipped.pt2"
    bad.write_bytes(bytes(raw))
    with pytest.raises(Pt2Error, match=f"member {member} fails its checksum") as err:
        load(bad)
    assert err.value.member == member


def test_a_truncated_weight_is_refused(good, tmp_path):
    member = _weight_member(good, "lin.weight")
    bad = rewrite(good, tmp_path / "short.pt2", lambda n, d: d[: len(d) // 2] if n == member else d)
    with pytest.raises(Pt2Error, match=f"member {member} holds 256 bytes, but tensor 'lin.weight'"):
        load(bad)


def test_a_size_that_disagrees_with_the_stored_bytes_is_refused(good, tmp_path):
    def bigger(name: str, data: bytes) -> bytes:
        if not name.endswith("model_weights_config.json"):
            return data
        config = json.loads(data)
        config["config"]["lin.bias"]["tensor_meta"]["sizes"] = [{"as_int": 64}]
        return json.dumps(config).encode()

    bad = rewrite(good, tmp_path / "bigger.pt2", bigger)
    with pytest.raises(Pt2Error, match=r"tensor 'lin.bias' \(float32 \[64\]\) needs 256"):
        load(bad)


def test_a_tensor_whose_shape_disagrees_with_the_graph_is_refused(good, tmp_path):
    def reshaped(name: str, data: bytes) -> bytes:
        if not name.endswith("model_weights_config.json"):
            return data
        config = json.loads(data)
        meta = config["config"]["lin.weight"]["tensor_meta"]
        meta["sizes"], meta["strides"] = (
            [{"as_int": 8}, {"as_int": 16}],
            [{"as_int": 16}, {"as_int": 1}],
        )
        return json.dumps(config).encode()

    bad = rewrite(good, tmp_path / "reshaped.pt2", reshaped)
    with pytest.raises(Pt2Error, match=r"'lin.weight' is stored as float32 \[8, 16\], but the "):
        load(bad)


def test_a_cut_file_is_called_truncated(good, tmp_path):
    bad = tmp_path / "cut.pt2"
    bad.write_bytes(good.read_bytes()[: good.stat().st_size // 2])
    with pytest.raises(Pt2Error, match="is truncated: the zip directory at its end is missing"):
        load(bad)


# ----- types the process does not know --------------------------------------------------------
def _out_spec(path: Path) -> str:
    with zipfile.ZipFile(path) as zf:
        model = next(n for n in zf.namelist() if n.endswith("models/model.json"))
        return json.loads(zf.read(model))["graph_module"]["module_call_graph"][0]["signature"][
            "out_spec"
        ]


def test_an_unknown_output_type_runs_as_a_stand_in_and_is_saved_back_unchanged(good, tmp_path):
    unknown = "nowhere.outputs.ModelOutput"
    path = renamed(good, tmp_path / "unknown.pt2", TYPE, unknown)
    ep = load(path)
    assert stand_in_types(ep) == [unknown]
    out, want = ep.module()(X), Tiny.forward(_tiny(), X)
    assert isinstance(out, StandIn) and out.type_name == unknown and out.keys() == ("y", "z")
    torch.testing.assert_close(out.z, want.z)
    torch.testing.assert_close(out["y"], out[0])
    again = tmp_path / "again.pt2"
    torch.export.save(ep, again)
    assert _out_spec(again) == _out_spec(path)
    # the saved file is the original again once the name is known: the real type comes back
    back = renamed(again, tmp_path / "back.pt2", unknown, TYPE)
    assert isinstance(torch.export.load(back).module()(X), Out)


def _tiny() -> Tiny:
    torch.manual_seed(0)
    return Tiny()


def test_allowed_packages_give_the_real_type(good, tmp_path, monkeypatch):
    package = tmp_path / "fxp_late_types"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "outputs.py").write_text(
        textwrap.dedent("""
        import dataclasses, torch

        @dataclasses.dataclass
        class Out:
            y: torch.Tensor
            z: torch.Tensor

        torch.export.register_dataclass(Out, serialized_type_name="fxp_late_types.outputs.Out")
        """)
    )
    path = renamed(good, tmp_path / "late.pt2", TYPE, "fxp_late_types.outputs.Out")
    monkeypatch.chdir(tmp_path)  # the one import rule: the current folder is on the path
    monkeypatch.setattr(sys, "path", list(sys.path))
    assert "fxp_late_types.outputs" not in sys.modules
    out = load(path, imports=["fxp_late_types"]).module()(X)
    assert type(out).__module__ == "fxp_late_types.outputs"


def test_a_missing_module_to_import_is_one_clear_error(good):
    with pytest.raises(Pt2Error, match="cannot import no_such_module_here: ModuleNotFoundError"):
        load(good, imports=["no_such_module_here"])


def test_an_unregistered_operator_names_the_op_and_the_fix(good, tmp_path):
    path = renamed(
        good, tmp_path / "op.pt2", "torch.ops.aten.mul.Tensor", "torch.ops.nowhere.mul.Tensor"
    )
    with pytest.raises(Pt2Error) as err:
        load(path)
    message = str(err.value)
    assert "calls torch.ops.nowhere.mul.Tensor, which no loaded module registers" in message
    assert "no installed Python module's source registers nowhere::mul" in message
    assert "--import" in message and "warnings above" not in message


LATE_OPS = """
import torch

@torch.library.custom_op("fxp_late_ops::times", mutates_args=())
def times(self: torch.Tensor, other: torch.Tensor) -> torch.Tensor:
    return self * other

times.register_fake(lambda self, other: torch.empty_like(self))
"""


def test_an_unregistered_operator_names_the_installed_module_that_registers_it(
    good, tmp_path, monkeypatch
):
    """Found by reading the sources on the import path (nothing is imported to find it)."""
    (tmp_path / "fxp_late_ops.py").write_text(LATE_OPS)
    monkeypatch.setattr(sys, "path", [str(tmp_path), *sys.path])
    path = renamed(
        good,
        tmp_path / "op.pt2",
        "torch.ops.aten.mul.Tensor",
        "torch.ops.fxp_late_ops.times.default",
    )
    with pytest.raises(Pt2Error) as err:
        load(path)
    assert "fxp_late_ops" not in sys.modules
    message = str(err.value)
    assert "fxp_late_ops registers it (found in its source)" in message
    assert "--import fxp_late_ops" in message
    ep = load(path, imports=["fxp_late_ops"])
    torch.testing.assert_close(ep.module()(X).z, load(good).module()(X).z)
