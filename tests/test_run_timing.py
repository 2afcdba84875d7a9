"""``shardc run --bench`` and ``shardc calibrate`` time what a user's call runs: a prepared
call (``torch_backend.redistributor``'s object), with per-step figures only from the runner
loop that call itself runs (``executor.watching``), not from a second run of the interpreter."""

from __future__ import annotations

from collections.abc import Callable

import pytest

torch = pytest.importorskip("torch")

import lowering  # noqa: E402
from torch_backend import prepared  # noqa: E402


@pytest.fixture
def user_calls(monkeypatch: pytest.MonkeyPatch) -> list[object]:
    """Every prepared call a user could make that runs during the test."""
    calls: list[object] = []
    real = prepared.Redistributor.__call__

    def counted(self: prepared.Redistributor, x: torch.Tensor, **kw: object) -> object:
        calls.append(self)
        return real(self, x, **kw)

    monkeypatch.setattr(prepared.Redistributor, "__call__", counted)
    return calls


@pytest.mark.parametrize("src,dst,steps", [("f32[8@dp,4]{U:tp}", "f32[8@tp,4]", 2), ("f32[8@dp,4]", "f32[8,4]", 1)])
def test_shardc_run_bench_times_the_users_call_step_by_step_from_its_own_loop(
        fake_pg: Callable[[int], None], user_calls: list[object], src: str, dst: str, steps: int) -> None:
    from torch_backend import executor, worker
    from torch_backend.data import block, global_tensor
    from torch_backend.groups import context
    from torch_backend.run_spec import RunSpec

    fake_pg(4)
    spec = RunSpec("dp=2,tp=2", src, dst, bench=3)
    program = lowering.compile(src, dst, spec.mesh)
    assert len(program.steps) == steps
    ctx = context(program.mesh)
    boundaries: list[int] = []
    clock = worker.Clock(torch.device("cpu"))
    out = worker.bench(worker.prepared(program, ctx), block(program.src, program.mesh, global_tensor(program.src), 0),
                       spec, clock, None)  # no store: its counters are advisory
    assert len(user_calls) == 3 and all(c.program is program for c in user_calls)  # type: ignore[attr-defined]
    assert out["bench_total_s"] > 0 and len(out["bench_steps_s"]) == steps and min(out["bench_steps_s"]) > 0
    # the boundaries between steps come from inside the user's call: the runner loop's hook
    with executor.watching(lambda i, y: boundaries.append(i)):
        worker.prepared(program, ctx)(block(program.src, program.mesh, global_tensor(program.src), 0))
    assert boundaries == list(range(1, steps))


def test_calibrate_times_the_users_call(fake_pg: Callable[[int], None], user_calls: list[object]) -> None:
    from lowering.calibration import probes
    from spec_lang import parse_mesh
    from torch_backend import calibrate

    fake_pg(2)
    mesh = parse_mesh("dp=2")
    samples = calibrate.measure(mesh, (64,), 2)
    n = len(probes(mesh, (64,)))
    assert n and len(samples) == n and all(s.seconds > 0 for s in samples), samples
    assert len(user_calls) == 3 * n, len(user_calls)  # a warm-up and 2 timed calls a probe
