"""The design's worked examples of uneven placements as redistribution cases, shared by the
LocalTensorMode tests and the real gloo ranks (world size -> cases), and what one rank
checks: its block after the conversion, and the start back after the reverse one."""

from __future__ import annotations

from typing import Any

import numpy as np
from planner_oracle import local_array

from spec_lang import parse, parse_mesh

UNALIGNED = "f64[32@ep<parts 4,6,4,2|2,4,8,2>,3]"
ALIGNED = "f64[32@ep<aligned 4,6,4,2|2,4,8,2>,3]"
# (name, mesh, src, dst) per world size: each runs src -> dst and back
WORKED: dict[int, list[tuple[str, str, str, str]]] = {
    2: [("partitioned", "ep=2", UNALIGNED, ALIGNED),
        ("sizes-zero-rank", "dp=2", "f64[8@dp<0,8>,2]", "f64[8,2]"),
        ("ragged-flat", "dp=2", "f64[3@dp<ragged 1,2 over 2>,4]", "f64[3,4]")],
    3: [("sizes", "dp=3", "f64[8@dp<3,0,5>,2]", "f64[8,2]")],
    4: [("partitioned", "dp=2,ep=2", "f64[32@ep<parts 4,6,4,2|2,4,8,2>,4@dp]",
         "f64[32@ep<aligned 4,6,4,2|2,4,8,2>,4@dp]"),
        ("sizes", "dp=4", "f64[8@dp<3,0,5,0>,2]", "f64[8,2]"),
        ("ragged-fsdp", "dp=4", "f64[5@dp<ragged 1,2,1,1 over 2>,4]", "f64[5,4]")],
}
# skewed MoE-like token counts: the bytes handed to the collective are the program's price
SKEWED = [("dp=4", "f32[16@dp<0,13,1,2>,8]", "f32[16@dp,8]"),
          ("dp=4", "f32[16@dp<0,13,1,2>,8]", "f32[16@dp<4,0,12,0>,8]"),
          ("dp=4", "f32[16,8]{U:dp}", "f32[16@dp<0,13,1,2>,8]"),
          ("dp=4", "f32[24@dp<parts 0,5,1,2|4,0,0,1|1,2,0,0|2,1,3,2>,2]",
           "f32[24@dp<aligned 0,5,1,2|4,0,0,1|1,2,0,0|2,1,3,2>,2]")]


def global_array(t: Any) -> np.ndarray:
    """Distinct values for every element (its flat index), float64: exact comparisons."""
    return np.arange(t.numel, dtype=np.float64).reshape(t.shape)


def case_types(mesh: str, src: str, dst: str) -> tuple[Any, Any, Any]:
    return parse_mesh(mesh), parse(src), parse(dst)


def block(t: Any, mesh: Any, rank: int) -> np.ndarray:
    return local_array(global_array(t), t, mesh, rank)
