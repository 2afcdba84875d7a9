"""Every layout of ``bench/cases/layouts.jsonl``: ``local_slices`` gives exactly its slices.

Even cases were measured with JAX's ``devices_indices_map``; uneven ones follow the
chunk rule. Empty ranges are compared only as being empty (their start is arbitrary).
"""

from __future__ import annotations

from typing import Any

import pytest
from _cases import case_params, load_cases

from lowering import local_slices

CASES = case_params("layouts.jsonl")


def _norm(box: list[list[int]]) -> tuple[tuple[int, int], ...] | str:
    """A box with any empty range is just 'empty'."""
    if any(hi <= lo for lo, hi in box):
        return "empty"
    return tuple((lo, hi) for lo, hi in box)


@pytest.mark.parametrize("case", CASES)
def test_local_slices_match_the_anchors(case: dict[str, Any]) -> None:
    got = local_slices(case["type"], case["mesh"])
    assert len(got) == len(case["slices"])
    for rank, (sl, want) in enumerate(zip(got, case["slices"], strict=True)):
        mine = _norm([[s.start, s.stop] for s in sl])
        assert mine == _norm(want), f"{case['id']} rank {rank}: {mine} != {want}"


def test_layout_cases_are_not_trivial() -> None:
    """Guard against a silently empty or truncated case file: it covers even and uneven cases."""
    cases = load_cases("layouts.jsonl")
    assert len(cases) >= 60
    sources = {c["source"].split()[0] for c in cases}
    assert {"jax.devices_indices_map", "chunk-rule"} <= sources
    assert any(any(hi <= lo for box in c["slices"] for lo, hi in box) for c in cases), "no empty ranges"


@pytest.mark.parametrize("case", CASES)
def test_placements_match_dtensor(case: dict[str, Any]) -> None:
    """The DTensor forms the case file lists (torch-free text: S(d), _S(d,sf), R, P(op))."""
    from lowering.checks import resolve
    from lowering.placements import format_placements, parse_placements, placement_specs

    want = case["dtensor"]
    t, mesh = resolve(case["type"], case["mesh"])
    specs, order = placement_specs(t, mesh)
    strided, _ = placement_specs(t, mesh, strided=True)
    assert format_placements(specs) == format_placements(parse_placements(want["placements"]))
    assert order == {int(k): v for k, v in (want["shard_order"] or {}).items()}
    assert format_placements(strided) == format_placements(
        parse_placements(want["strided_placements"] or want["placements"])
    )
