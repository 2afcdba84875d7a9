"""``shardc plan`` through the CLI entry point main(argv): text, JSON, cost-model flags, errors."""

from __future__ import annotations

import json

import pytest

from torch_backend.cli import main

MESH = "dp=2,tp=4"


def _run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    rc = main(list(argv))
    out, err = capsys.readouterr()
    return rc, out, err


def test_plan_text_shows_steps_cost_and_bound(capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, _ = _run(capsys, "plan", "--mesh", MESH, "f32[8@(dp,tp)]", "f32[8@(tp,dp)]")
    assert rc == 0
    assert "1. permute(dp,tp) dim 0  -> float32[8@(tp,dp)]   [4 B/rank]" in out
    assert "cost: 4 B (busiest rank, sent or received), 4 B sent (max rank), 1 collective(s)" in out
    assert "lower bound: 4 B   ratio: 1.00x" in out


def test_plan_json_has_cost_and_lower_bound(capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, _ = _run(capsys, "plan", "--mesh", MESH, "f32[8,16]{U:tp}", "f32[8@tp,16]", "--json")
    assert rc == 0
    data = json.loads(out)
    assert data["cost"]["bytes_max"] == data["cost"]["bytes_sent_max"] == 384 and data["cost"]["collectives"] == 1
    assert data["cost"]["peak_bytes_max"] == 640
    assert data["lower_bound"] == 256 and data["ratio_to_lower_bound"] == pytest.approx(1.5)
    assert [s["kind"] for s in data["steps"]] == ["reduce_scatter"]


def test_a_destination_partial_over_new_axes_has_the_bound_of_what_must_move(
        capsys: pytest.CaptureFixture[str]) -> None:
    # a convert into new partial axes is local, but the ranks differing only on them must
    # between them receive what none of them holds: moving a pending sum from dp to tp, each
    # group of 4 tp ranks receives the 8 sums (one element each at least, 8 B with 2 of 8
    # elements each); resharding a 64 MiB matrix onto a sum over cp, each cp pair receives
    # the 12 MiB of its 16 MiB block it lacks, 6 MiB a rank
    rc, out, _ = _run(capsys, "plan", "--mesh", MESH, "f32[8]{U:dp}", "f32[8]{U:tp}", "--json")
    assert rc == 0
    data = json.loads(out, parse_constant=lambda c: pytest.fail(f"non-JSON constant {c}"))
    assert data["lower_bound"] == 8 and data["cost"]["bytes_max"] >= 8
    mesh6 = "dp=2,fsdp=2,cp=2,tp=2,ep=2,pp=2"
    rc, out, _ = _run(capsys, "plan", "--mesh", mesh6, "bf16[4096@(dp,fsdp),8192]", "bf16[4096,8192@(fsdp,tp)]{U:cp}")
    assert rc == 0 and "lower bound: 6291456 B   ratio: 1.33x" in out
    assert "cost: 8388608 B (busiest rank, sent or received)" in out and "zero_pad(cp)" in out


def test_spare_axis_bytes_zero_is_the_pure_bytes_plan(capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, _ = _run(capsys, "plan", "--mesh", MESH, "f32[8,16]{U:tp}", "f32[8@tp,16]", "--json",
                      "--spare-axis-bytes", "0")
    assert rc == 0
    data = json.loads(out)
    assert [s["kind"] for s in data["steps"]] == ["slice", "reduce_scatter", "all_gather"]
    assert data["cost"]["bytes_max"] == data["lower_bound"] == 256


def test_per_axis_alpha_changes_the_plan(capsys: pytest.CaptureFixture[str]) -> None:
    # gathering 2 dims: one flattened all_gather either way; a huge latency on both
    # axes cannot make it cheaper than one collective, so the plan stays one step
    rc, out, _ = _run(capsys, "plan", "--mesh", MESH, "f32[8@dp,16@tp]", "f32[8,16]", "--json",
                      "--alpha", "dp=1e-3,tp=1e-6", "--beta", "2e-10")
    assert rc == 0
    data = json.loads(out)
    assert data["cost"]["collectives"] == 1
    assert data["cost"]["time_s"] == pytest.approx(1e-3 + 2e-10 * 448)


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        (["--alpha", "dp=fast"], "bad --alpha value"),
        (["--alpha", "pp=1e-6"], "not on the mesh"),
        (["--spare-axis-bytes", "-1"], "--spare-axis-bytes must be >= 0"),
        (["--budget", "0"], "bad --budget value: it must be a positive, finite number"),
        (["--budget", "soon"], "bad --budget value: not a number"),
        (["--gap-bytes", "-1"], "bad --gap-bytes value: it must be a whole number of bytes >= 0"),
        (["--gap-bytes", "1.5"], "bad --gap-bytes value: it must be a whole number of bytes >= 0"),
    ],
)
def test_bad_cost_flags_exit_2_with_a_hint(capsys: pytest.CaptureFixture[str], argv: list[str],
                                          needle: str) -> None:
    rc, out, err = _run(capsys, "plan", "--mesh", MESH, "f32[8@dp]", "f32[8]", *argv)
    assert rc == 2 and out == ""
    assert needle in err


def test_unreachable_destination_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, err = _run(capsys, "plan", "--mesh", MESH, "f32[8@tp]", "f32[8]{P(max):tp}")
    assert rc == 2 and out == ""
    assert "convert(S, P) only for sum" in err and "hint:" in err


def test_budget_buys_a_proof_and_a_cheaper_program(capsys: pytest.CaptureFixture[str]) -> None:
    # a sum pending over 3 of 6 axes, searched without a gap: the default budget runs out
    # on the one all_reduce; four times the budget finds the reduce_scatter before it and
    # proves it
    case = ("--mesh", "a=2,b=2,c=2,d=2,e=2,f=2", "f32[8@c]{U:(b,d,e)}", "f32[8@(b,f,d)]", "--gap-bytes", "0",
            "--json")
    rc, out, _ = _run(capsys, "plan", *case)
    assert rc == 0
    default = json.loads(out)
    rc, out, _ = _run(capsys, "plan", *case, "--budget", "0.2")
    assert rc == 0
    more = json.loads(out)
    assert not default["optimal"] and default["gap_bytes"] is None
    assert more["optimal"] and more["gap_bytes"] == 0
    assert more["cost"]["bytes_max"] == 16 < default["cost"]["bytes_max"] == 24
    assert [s["kind"] for s in more["steps"]] == ["slice", "reduce_scatter", "all_reduce", "all_to_allv"]
    rc, out, _ = _run(capsys, "plan", *case[:-1])
    assert "not proven optimal" in out and "a larger --budget than 0.05 s searches further" in out
    rc, out, _ = _run(capsys, "plan", *case[:-1], "--budget", "0.2")
    assert "not proven" not in out and "--budget" not in out


def test_the_default_gap_trades_a_few_bytes_for_a_collective(capsys: pytest.CaptureFixture[str]) -> None:
    # the same pair at the default gap (1 KiB): the search sets aside the 3-collective plan,
    # which saves 8 B, keeps the 2-collective one and says how close it proved it
    case = ("--mesh", "a=2,b=2,c=2,d=2,e=2,f=2", "f32[8@c]{U:(b,d,e)}", "f32[8@(b,f,d)]")
    rc, out, _ = _run(capsys, "plan", *case, "--json")
    assert rc == 0
    prog = json.loads(out)
    assert not prog["optimal"] and 8 <= prog["gap_bytes"] <= 1024
    assert (prog["cost"]["bytes_max"], prog["cost"]["collectives"]) == (24, 2)
    rc, out, _ = _run(capsys, "plan", *case)
    assert f"proven within {prog['gap_bytes']} B of the cheapest" in out
    assert "--gap-bytes 0 searches on" in out and "a larger --budget" not in out
