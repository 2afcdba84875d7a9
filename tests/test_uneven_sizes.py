"""The split-information exchange (``torch_backend.uneven_type``) under LocalTensorMode:
sizes known only per rank become the global type, then the data moves exactly."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from torch_utils import from_local, local_mode, to_local  # noqa: E402

import torch_backend  # noqa: E402
from spec_lang.errors import SpecError  # noqa: E402


def test_sizes_then_data(fake_pg) -> None:
    with local_mode(fake_pg, 3) as lm:
        x = to_local(lm, [torch.arange(6.).reshape(3, 2), torch.zeros(0, 2), torch.arange(6., 16.).reshape(5, 2)])
        t = torch_backend.uneven_type(x, "ep=3", "ep")
        assert str(t) == "float32[8@ep<3,0,5>,2]"
        y = from_local(torch_backend.redistribute(x, t, "f32[8,2]", "ep=3"))
    assert all(torch.equal(b, torch.arange(16.).reshape(8, 2)) for b in y)


def test_partitioned_worked_example_both_alignments(fake_pg) -> None:
    """Splits ((4,6,4,2),(2,4,8,2)): each rank lists its own pieces in local order."""
    with local_mode(fake_pg, 2) as lm:
        x = to_local(lm, [torch.zeros(16, 3), torch.zeros(16, 3)])
        unaligned = to_local(lm, [torch.tensor([4, 6, 4, 2]), torch.tensor([2, 4, 8, 2])])
        aligned = to_local(lm, [torch.tensor([4, 2, 6, 4]), torch.tensor([4, 8, 2, 2])])
        a = torch_backend.uneven_type(x, "ep=2", "ep", partitions=unaligned)
        b = torch_backend.uneven_type(x, "ep=2", "ep", partitions=aligned, aligned=True, template="f32[0,3]")
    assert str(a) == "float32[32@ep<parts 4,6,4,2|2,4,8,2>,3]"
    assert str(b) == "float32[32@ep<aligned 4,6,4,2|2,4,8,2>,3]"


def test_template_keeps_the_other_dims_and_axes(fake_pg) -> None:
    with local_mode(fake_pg, 4) as lm:
        x = to_local(lm, [torch.zeros(n, 3) for n in (1, 1, 5, 5)])
        t = torch_backend.uneven_type(x, "ep=2,tp=2", "ep", template="f32[0,6@tp]")
    assert str(t) == "float32[6@ep<1,5>,6@tp]"


@pytest.mark.parametrize("blocks,mesh,kw,message", [
    ([(3, 2), (1, 2), (3, 2), (2, 2)], "dp=2,ep=2", {}, "ranks at ep=1 disagree"),
    ([(3, 2), (1, 2)], "ep=2", {"partitions": [[2, 2], [1, 0]]}, r"\[2, 2\] add up to 4, not its 3 rows"),
    ([(2, 3), (2, 1)], "ep=2", {"partitions": [[2, 2], [1, 0]], "dim": 1}, "add up to 4, not its 3 slices along dim 1"),
    ([(3, 2), (1, 2)], "ep=2", {"dim": 2}, "not a dim of the local tensor"),
    ([(3, 2), (1, 2)], "ep=2", {"template": "f32[0@tp,2]"}, "already shards dim"),
    ([(3, 2), (1, 2)], "tp=2", {}, "not on the mesh"),
    ([(3, 2), (1, 2)], "ep=2", {"dim": None}, "dim None is not a dim of the local tensor"),
    # every rank's own sizes, read where the exchange tells every rank about a bad one
    ([(3, 2), (1, 2)], "ep=2", {"partitions": "ab"}, "partition sizes must be a sequence of ints, got 'ab'"),
    ([(3, 2), (1, 2)], "ep=2", {"partitions": [[2.5, 0.5], [1.0, 0.0]]}, "partition sizes must hold ints, got 2.5"),
])
def test_bad_input_is_a_spec_error(fake_pg, blocks, mesh, kw, message) -> None:
    world = len(blocks)
    with local_mode(fake_pg, world) as lm:
        x = to_local(lm, [torch.zeros(s) for s in blocks])
        if isinstance(kw.get("partitions"), list):
            kw = dict(kw, partitions=to_local(lm, [torch.tensor(p) for p in kw["partitions"]]))
        with pytest.raises(SpecError, match=message):
            torch_backend.uneven_type(x, mesh, "ep", **kw)
