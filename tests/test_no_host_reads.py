"""No program reads tensor values on the host: the CPU side of "no host synchronisation
inside a program" (on CUDA, ``tests/test_pack.py`` runs under ``set_sync_debug_mode``).

On real gloo ranks, every call that runs a program (a prepared ``redistributor``, a
repeated ``redistribute``, ``redistribute_many``, an async handle's ``wait`` and the
backward) runs under a TorchFunctionMode that records each tensor method which hands a
value to Python (``item``, ``tolist``, ``__bool__``, ...) or copies to the host (``cpu``,
``numpy``). On a GPU each of those would stall the stream until the device catches up;
here each one is a failure. The detector is checked first: a ``tolist`` inside it is seen.

Uneven placements are in, once their type is known: ``torch_backend.uneven_type``, which
builds the type of a split that only the ranks know, reads the exchanged sizes on the host
before any program runs, by design.
"""

from __future__ import annotations

from typing import Any

import pytest

torch = pytest.importorskip("torch")
import torch.distributed as dist  # noqa: E402

pytestmark = pytest.mark.skipif(not dist.is_gloo_available(), reason="torch built without gloo")

MESH = "a=2,b=2,c=2"
PAIRS = [  # every collective kind the executor runs, even and uneven, one step and several
    ("f32[8@a,6]", "f32[8,6]"),  # even all_gather straight into the output
    ("f32[5@(a,b),3]", "f32[5,3]"),  # uneven: a ring of point-to-point sends
    ("f32[4,8@c]", "f32[4,8]"),  # gathered along dim 1: packed and unpacked
    ("f32[8,4]{U:(b,c)}", "f32[8@(b,c),4]"),  # reduce_scatter
    ("f32[6,3]{P(avg):a}", "f32[6@a,3]"),  # a mean: reduce_scatter of the sum, then a division
    ("f32[5,3]{U:(a,b,c)}", "f32[5,3]"),  # all_reduce
    ("f32[8@(a,b),4]", "f32[8,4@(a,b)]"),  # all_to_all
    ("f32[8@a,4@b]", "f32[8@b,4@a]"),  # permute (each rank sends to one peer)
    ("f32[8@(a,b)]", "f32[8@(b,a)]"),  # permute within a dim
    ("f32[7@a,5]{U:c}", "f32[7,5@(a,b)]"),  # slice, all_reduce, uneven all_to_all
    ("f32[8,6]", "f32[8@(c,a),6]"),  # a local slice
    ("f32[10@a<3,7>,4]", "f32[10,4]"),  # explicit sizes: all_gatherv
    ("f32[10,4]{U:b}", "f32[10@a<3,7>,4]"),  # reduce_scatterv
    ("f32[10@a<3,7>,4]", "f32[10@(a,b),4]"),  # all_to_allv
    ("f32[24@b<ragged 1,2>,3]", "f32[24@c,3]"),  # ragged runs: all_to_allv
    ("f32[16@c<parts 4,4|2,6>]", "f32[16]"),  # partitions: all_gatherv
]
# tensor methods that give a value to Python or copy to the host (each syncs on a GPU)
HOST_READS = frozenset({"item", "tolist", "__bool__", "__int__", "__float__", "__index__", "numpy", "cpu",
                        "nonzero", "equal", "__format__", "__repr__"})


def _detector() -> Any:
    from torch.overrides import TorchFunctionMode

    class HostReads(TorchFunctionMode):
        def __init__(self) -> None:
            super().__init__()
            self.seen: list[str] = []
            self.calls = 0  # every torch call it saw: the program's ops do pass through it

        def __torch_function__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
            name = getattr(func, "__name__", "")
            self.calls += 1
            if name in HOST_READS:
                self.seen.append(name)
            return func(*args, **(kwargs or {}))

    return HostReads()


def host_reads(rank: int, world: int) -> dict[str, tuple[list[str], int]]:
    import torch_backend
    from spec_lang import parse, parse_mesh
    from torch_backend.data import block, global_tensor

    mesh = parse_mesh(MESH)
    out: dict[str, tuple[list[str], int]] = {}
    probe = _detector()
    with probe:
        torch.zeros(2).tolist()
    out["the detector itself"] = (probe.seen, probe.calls)

    xs = []
    for src, dst in PAIRS:
        s = parse(src)
        x = block(s, mesh, global_tensor(s), rank)
        prepared = torch_backend.redistributor(src, dst, MESH)
        torch_backend.redistribute(x, src, dst, MESH)  # the first call binds the program
        xg = x.clone().requires_grad_(True)
        mode = _detector()
        with mode:
            prepared(x)
            torch_backend.redistribute(x, src, dst, MESH)
            torch_backend.redistribute(x, src, dst, MESH, async_op=True).wait()
            y = prepared(xg)
            torch.autograd.grad(y, xg, grad_outputs=torch.ones_like(y))
        out[f"{src} -> {dst}"] = (mode.seen, mode.calls)
        xs.append(x)
    srcs, dsts = [s for s, _ in PAIRS], [d for _, d in PAIRS]
    torch_backend.redistribute_many(xs, srcs, dsts, MESH)
    mode = _detector()
    with mode:
        torch_backend.redistribute_many(xs, srcs, dsts, MESH)
        torch_backend.redistribute_many(xs, srcs, dsts, MESH, async_op=True).wait()
    out["redistribute_many"] = (mode.seen, mode.calls)
    return out


@pytest.mark.timeout(300)
def test_programs_read_no_tensor_values_on_the_host(gloo_pool: Any) -> None:
    results = gloo_pool.run(host_reads, timeout_s=180)
    for rank, res in results.items():
        assert res.pop("the detector itself")[0] == ["tolist"], rank
        assert set(res) == {f"{s} -> {d}" for s, d in PAIRS} | {"redistribute_many"}
        assert all(calls > 0 for _, calls in res.values()), rank
        assert not any(seen for seen, _ in res.values()), (rank, {k: v for k, (v, _) in res.items() if v})
