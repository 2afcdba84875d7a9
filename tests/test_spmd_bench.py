"""bench/spmd_overhead.py runs, and each typed call issues one collective (none for a
convert), also over a tuple of axes."""

from __future__ import annotations

import io
from contextlib import redirect_stdout

from bench.spmd_overhead import main


def test_spmd_overhead_bench_counts_one_collective_per_call(fake_pg) -> None:
    fake_pg(6)
    with redirect_stdout(io.StringIO()):
        result = main(["--reps", "2", "--json", "-"])
    assert result["overhead"]["ops"] == 50 and result["overhead"]["typecheck_us"] > 0
    for row in result["calls"]:
        assert row["collectives"] == (0 if row["call"].startswith("convert") else 1), row
