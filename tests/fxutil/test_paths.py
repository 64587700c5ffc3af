import pytest
import torch

from fxpass.fxutil.paths import del_path, find_path, get_path, has_path


def _nested():
    root = torch.nn.Module()
    root.block = torch.nn.Module()
    root.block.register_buffer("scale", torch.ones(2))
    return root


def test_attribute_paths_walk_nested_modules():
    root = _nested()
    assert get_path(root, "block.scale") is root.block.scale
    with pytest.raises(AttributeError):
        get_path(root, "block.missing")
    assert find_path(root, "block.scale") is root.block.scale
    assert find_path(root, "nope.scale") is None and find_path(root, "nope", 7) == 7
    assert has_path(root, "block.scale") and not has_path(root, "block.scale.nope.x")
    del_path(root, "block.scale")
    assert not has_path(root, "block.scale") and has_path(root, "block")
    del_path(root, "block")
    assert not has_path(root, "block")
