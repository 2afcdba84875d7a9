"""``shardc parse`` offers a ``_StridedShard`` form only where torch's ``distribute_tensor``
takes it, checked against torch itself on 8 real gloo ranks.

LocalTensorMode is no oracle here: it simulates the scatter of a ``_StridedShard`` with
the default ``src_data_rank=0`` wrongly (every rank along the axis gets coordinate 0's
piece), and ``src_data_rank=None`` skips the check that refuses uneven pieces.
"""

from __future__ import annotations

from typing import Any

import pytest

torch = pytest.importorskip("torch")
import torch.distributed as dist  # noqa: E402

from lowering import local_slices, to_placements  # noqa: E402
from lowering.placements import format_placements  # noqa: E402
from spec_lang import parse, parse_mesh  # noqa: E402
from torch_backend.cli.parse_cmd import describe  # noqa: E402

pytestmark = pytest.mark.skipif(not dist.is_gloo_available(), reason="torch built without gloo")

# (mesh, type): even strided dims, uneven ones, a size-1 axis in the order, a mesh-order dim
CASES = [
    ("dp=4,tp=2", "f32[16@(tp,dp),3]"),
    ("dp=4,tp=2", "f32[9@(tp,dp)]"),
    ("dp=4,tp=2", "f32[12@(tp,dp),3]"),
    ("a=2,b=2,c=2", "f32[16@(c,b,a)]"),
    ("a=2,b=2,c=2", "f32[8@(c,a),2,4@b]"),
    ("a=2,b=2,c=2", "f32[10@(b,c,a),3]"),
    ("a=2,b=2,c=2", "f32[5@c,13@(b,a)]"),
    ("a=2,b=2,c=2", "f32[24@(b,c,a)]"),
]


def distribute_each(rank: int, world: int, cases: list[tuple[str, str]]) -> list[Any]:
    """Per case, this rank's block from ``distribute_tensor`` (default src_data_rank) given
    the type's ``_StridedShard`` form, or "AssertionError" where torch refused it."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import distribute_tensor

    meshes: dict[str, Any] = {}
    out: list[Any] = []
    for mesh_text, type_text in cases:
        m = parse_mesh(mesh_text)
        if mesh_text not in meshes:
            meshes[mesh_text] = init_device_mesh("cpu", m.sizes, mesh_dim_names=m.names)
        t = parse(type_text)
        full = torch.arange(float(t.numel)).reshape(t.shape)
        placements, _ = to_placements(type_text, mesh_text, strided=True)
        try:
            out.append(distribute_tensor(full, meshes[mesh_text], placements).to_local().tolist())
        except AssertionError:
            out.append("AssertionError")
    return out


@pytest.mark.timeout(300)
def test_parse_offers_only_a_strided_form_torch_takes(gloo_pool: Any) -> None:
    offered = {}
    for mesh, text in CASES:
        info = describe(text, mesh)
        offered[mesh, text] = info["strided_placements"]
        assert info["shard_order"], "every case has a dim in a non-mesh order"
        if info["strided_placements"] is not None:
            assert info["strided_placements"] == format_placements(to_placements(text, mesh, strided=True)[0])
    # torch is asked to take the _StridedShard form of every case, offered or not
    results = gloo_pool.run(distribute_each, CASES, timeout_s=240)
    for i, (mesh, text) in enumerate(CASES):
        got = [results[r][i] for r in range(8)]
        full = torch.arange(float(parse(text).numel)).reshape(parse(text).shape)
        want = [full[s].tolist() for s in local_slices(text, mesh)]
        if offered[mesh, text] is not None:
            assert got == want, f"{text} on {mesh}: torch's blocks differ from the type's"
        else:
            # torch refuses it, or (never seen) takes it and gives other blocks than the type's
            assert got == ["AssertionError"] * 8 or got != want, f"{text} on {mesh}: torch takes it"
    assert offered["dp=4,tp=2", "f32[16@(tp,dp),3]"] == "_S(0,2),S(0)"
    assert offered["dp=4,tp=2", "f32[9@(tp,dp)]"] is None


def test_parse_says_why_torch_takes_no_strided_form(capsys: pytest.CaptureFixture[str]) -> None:
    from torch_backend.cli import main

    assert main(["parse", "f32[9@(tp,dp)]", "--mesh", "dp=4,tp=2"]) == 0
    out = capsys.readouterr().out
    assert "_S(0,2)" not in out
    assert ("strided:      none that distribute_tensor takes: dim 0 (size 9) does not divide evenly over "
            "(tp,dp) (8 shards)") in out
    # a size-1 axis makes no _StridedShard: the plain placements are the form, even when uneven
    info = describe("f32[9@(tp,dp)]", "dp=4,tp=1")
    assert info["strided_placements"] == "S(0),S(0)" and info["strided_refusal"] is None
    assert to_placements("f32[9@(tp,dp)]", "dp=4,tp=1", strided=True)[0] == to_placements(
        "f32[9@(tp,dp)]", "dp=4,tp=1")[0]
