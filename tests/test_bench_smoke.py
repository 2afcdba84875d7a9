"""Smoke test of bench/plan_quality.py and bench/plan_speed.py in --quick mode, and of
bench/uneven.py at a tiny scale (8 gloo ranks).

Both benchmarks run in-process (DTensor's planners on the fake process group) and the
test checks real properties of what they return, not just that they ran. The uneven
bench times its cases on the session's shared gloo ranks (``gloo_pool``) instead of
spawning its own.
"""

from __future__ import annotations

import importlib
import math
import statistics
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _bench(name: str) -> ModuleType:
    pytest.importorskip("torch.distributed")
    pytest.importorskip("rich")
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    return importlib.import_module(f"bench.{name}")


@pytest.fixture(scope="module")
def quality() -> tuple[ModuleType, dict[str, Any]]:
    mod = _bench("plan_quality")
    return mod, mod.main(["--quick"])


@pytest.fixture(scope="module")
def speed() -> tuple[ModuleType, dict[str, Any]]:
    mod = _bench("plan_speed")
    return mod, mod.main(["--quick"])


def by_id(out: dict[str, Any]) -> dict[str, Any]:
    return {r.id: r for r in out["cases"]}


# ---- plan quality ----------------------------------------------------------------------------


def test_quality_runs_the_quick_subset(quality: tuple[ModuleType, dict[str, Any]]) -> None:
    mod, out = quality
    assert sorted(by_id(out)) == sorted(mod.QUICK_IDS)
    assert out["summary"]["cases"] == len(mod.QUICK_IDS)
    assert out["failures"] == []


def test_never_more_bytes_than_the_best_anchor(quality: tuple[ModuleType, dict[str, Any]]) -> None:
    _, out = quality
    for r in out["cases"]:
        assert r.best_anchor_bytes is not None, r.id
        assert r.bytes <= r.best_anchor_bytes, (r.id, r.bytes, r.best_anchor, r.best_anchor_bytes)
        assert r.bytes <= min(r.anchors.values()), r.id
    assert out["summary"]["worse_than_best_anchor"] == []


def test_sr_cases_sit_at_a_bound(quality: tuple[ModuleType, dict[str, Any]]) -> None:
    mod, out = quality
    sr = [r for r in out["cases"] if r.sr]
    assert len(sr) >= 8
    for r in sr:
        assert r.send_bound is not None and r.sent_bound is not None
        assert r.bytes >= r.sent_bound >= math.ceil(r.lb_sent_avg - 1e-9), r.id  # a valid bound on sent bytes
        assert not r.spare_traffic, r.id  # so the spare-slice bound applies to the plan
        assert r.bytes >= r.slice_bound >= r.sent_bound, r.id
        if r.id in mod.KNOWN_GAPS:
            assert r.bytes <= mod.KNOWN_GAPS[r.id][0], r.id  # regression guard
        else:
            assert r.bytes in (r.lb, r.sent_bound, r.slice_bound), (r.id, r.bytes, r.lb, r.sent_bound)
    cases = by_id(out)
    # d is spare: inside each d-slice one pair of ranks alone holds rows 4-5 of columns 0-7,
    # which 4 ranks need 2x2 of each (16 elements, 64 B), whatever the global bounds say
    c48 = cases["rd-pub-048"]
    assert c48.spare == ["d"] and c48.slice_bound == 64 == c48.bytes > c48.lb == 56
    # the sole holder of 2 rows must send them to the 7 ranks that need 14 of 16 columns
    # (the lower bound's holder-set term counts it too)
    assert cases["rd-pub-022"].send_bound == 2 * 14 * 4 == cases["rd-pub-022"].bytes == cases["rd-pub-022"].lb
    # an uneven 2-D exchange where max sent is below the recorded recv-based bound
    assert cases["rd-pub-023"].bytes == cases["rd-pub-023"].send_bound == 36 < cases["rd-pub-023"].lb_anchor == 48


def test_partial_cases_never_beat_the_lower_bound(quality: tuple[ModuleType, dict[str, Any]]) -> None:
    _, out = quality
    partial = [r for r in out["cases"] if not r.sr]
    assert partial
    for r in partial:
        assert r.send_bound is None
        assert r.bytes >= r.lb == r.lb_anchor, r.id


def test_live_dtensor_matches_the_record(quality: tuple[ModuleType, dict[str, Any]]) -> None:
    _, out = quality
    for r in out["cases"]:
        for d in (r.dt_default, r.dt_min_cost):
            assert d["error"] is None, r.id
            assert (d["bytes"], d["collectives"]) == (d["recorded_bytes"], d["recorded_collectives"]), r.id
    assert out["summary"]["dtensor_live_vs_recorded_disagreements"] == []


def test_peak_memory_and_send_bound_checks(quality: tuple[ModuleType, dict[str, Any]]) -> None:
    _, out = quality
    for r in out["cases"]:
        assert r.peak <= r.peak_limit, r.id
    s = out["summary"]
    assert s["send_bound_violations"] == [] and s["send_bound_checked_plans"] > 0


def test_never_more_collectives_than_dtensor_best(quality: tuple[ModuleType, dict[str, Any]]) -> None:
    _, out = quality
    assert out["summary"]["more_collectives_than_dtensor_best"] == []
    for r in out["cases"]:
        best = r.dt_default if r.dt_best == "default" else r.dt_min_cost
        assert r.collectives <= best["collectives"], r.id


def test_pure_bytes_pass_shows_the_reduction_split(quality: tuple[ModuleType, dict[str, Any]]) -> None:
    _, out = quality
    pure = {c["id"]: c for c in out["summary"]["pure_bytes_pass"]}
    # {U:tp} -> 8@tp on dp=2,tp=4: slice over dp, reduce_scatter(tp), all_gather(dp)
    assert pure["rd-pub-018"] == {"id": "rd-pub-018", "bytes": [384, 256], "collectives": [1, 2]}
    for c in pure.values():
        assert c["bytes"][1] < c["bytes"][0] and c["collectives"][1] > c["collectives"][0], c
    for r in out["cases"]:
        assert r.pure_bytes["bytes"] <= r.bytes, r.id


def test_latency_pass_trades_bytes_for_fewer_collectives(quality: tuple[ModuleType, dict[str, Any]]) -> None:
    _, out = quality
    lat = out["summary"]["latency_pass"]
    assert lat["slower_than_bytes_plan"] == []
    for r in out["cases"]:
        assert r.latency["time_s"] <= r.latency["bytes_plan_time_s"] * (1 + 1e-9), r.id
        assert r.latency["bytes"] >= r.bytes, r.id  # the bytes-first plan is byte-optimal in the search
    r18 = by_id(out)["rd-pub-018"]
    assert (r18.latency["bytes"], r18.latency["collectives"]) == (384, 1)


# ---- plan speed -------------------------------------------------------------------------------------


def test_speed_reports_every_case_and_both_planners(speed: tuple[ModuleType, dict[str, Any]]) -> None:
    mod, out = speed
    ids = [r.id for r in out["cases"]]
    assert ids == list(mod.QUICK_CASE_IDS) + list(mod.QUICK_LARGE_IDS)
    for r in out["cases"]:
        # what is reported is what was measured: the cold figure is the median of its repetitions
        assert r.shardc_cold_all_s and all(t > 0 for t in r.shardc_cold_all_s), r.id
        assert r.shardc_cold_s == statistics.median(r.shardc_cold_all_s), r.id
        assert r.shardc_cached_s > 0, r.id
        for p in ("default", "min_cost"):
            d = r.dtensor[p]
            assert d["error"] is None, (r.id, p, d["error"])
            assert d["cold_s"] > 0 and d["cached_s"] > 0
    assert any(r.large and r.ranks == 1024 for r in out["cases"])


def test_speed_cached_figure_times_a_cache_hit(speed: tuple[ModuleType, dict[str, Any]]) -> None:
    """The "cached" column times a cache hit: the second compile hands back the first's program."""
    mod, out = speed
    for r in out["cases"]:
        first = mod.shardc_compile(r.src, r.dst, r.mesh)
        assert mod.shardc_compile(r.src, r.dst, r.mesh) is first, r.id


def test_speed_summary_follows_from_the_cases(speed: tuple[ModuleType, dict[str, Any]]) -> None:
    mod, out = speed
    s = out["summary"]
    assert s["targets"] == {"cold_s": mod.COLD_TARGET_S, "cached_s": mod.CACHED_TARGET_S}
    for group, large in (("cases", False), ("large", True)):
        rs = [r for r in out["cases"] if r.large == large]
        g = s[group]
        cold, cached = [r.shardc_cold_s for r in rs], [r.shardc_cached_s for r in rs]
        assert g["cases"] == len(rs)
        assert g["shardc_cold_median_s"] == statistics.median(cold)
        assert g["shardc_cached_median_s"] == statistics.median(cached)
        assert g["shardc_cold_max_s"] == max(cold)
        assert g["cold_target_met"] == (statistics.median(cold) < mod.COLD_TARGET_S)
        assert g["cached_target_met"] == (statistics.median(cached) < mod.CACHED_TARGET_S)
        assert g["shardc_cold_cases_over_target"] == sum(c >= mod.COLD_TARGET_S for c in cold)
        for p in ("default", "min_cost"):
            assert g[f"dtensor_{p}_cold_median_s"] == statistics.median(float(r.dtensor[p]["cold_s"]) for r in rs)
            assert g[f"dtensor_{p}_errors"] == []


# ---- uneven placements (8 gloo ranks, tiny tensors) -----------------------------------------


def _bench_job(rank: int, world: int, module: str, name: str, *args: Any) -> Any:
    """``module.name(rank, world, *args)`` on a pool rank: the ranks may have started
    before the repository root was on the test's path, so the bench is found by name."""
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    return getattr(importlib.import_module(module), name)(rank, world, *args)


def test_uneven_bench_is_exact_and_at_a_bound(gloo_pool: Any) -> None:
    import contextlib
    import io

    mod = _bench("uneven")

    def on_pool(fn: Any, *args: Any) -> dict[int, Any]:  # the bench's timing on the shared 8 gloo ranks
        return gloo_pool.run(_bench_job, fn.__module__, fn.__name__, *args, timeout_s=240)

    with contextlib.redirect_stdout(io.StringIO()):
        out = mod.main(["--scale", "1", "--hidden", "8", "--iters", "2", "--json", "-"], run_ranks=on_pool)
    rows = {c["name"]: c["stats"] for c in out["cases"]}
    assert len(rows) == 10 and out["summary"]["all_ok"]
    for name, s in rows.items():
        assert s["ok"] and s["shardc_s"] > 0 and s["padded_s"] > 0 and s["through_r_s"] > 0, name
        # the bound holds for the larger of sent and received; the floors for sent (and, with
        # a pending reduction, received) bytes of a plan without relays
        assert max(s["bytes_sent_max"], s["bytes_recv_max"]) >= s["lower_bound"], name
        if "all_gatherv" not in s["steps"]:  # the ring relays: below the direct floor
            assert max(s["bytes_sent_max"], s["bytes_recv_max"]) >= s["direct_floor"], name
        if s["sole_holder_floor"] is not None:
            assert s["bytes_sent_max"] >= s["sole_holder_floor"], name
    assert out["summary"]["above_every_bound"] == []
    assert set(out["summary"]["at_bound"]) == {"moe gather", "moe to experts", "fsdp unshard", "fsdp reshard",
                                               "fsdp flat to even", "quant gather", "quant to even"}
    assert out["summary"]["sole_holder_at_a_floor"] == out["summary"]["sole_holder_cases"]
    # a skewed gather to Replicate goes around the ring: at the bound, below the direct
    # exchange, in which the largest holder would send its rows to all 7 others
    g = rows["moe gather"]
    assert g["steps"] == ["all_gatherv"]
    assert g["bytes_sent_max"] == g["lower_bound"] == 512 * 8 * 4 < g["direct_floor"] == 7 * 154 * 8 * 4
    assert rows["fsdp reshard"]["bytes_sent_max"] == 0  # Replicate -> ragged is a local slice
