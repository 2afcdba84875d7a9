"""One world of gloo ranks for a benchmark: spawned on this machine with a FileStore in a
temporary directory (no port another process could take), and the ranks' rows merged on
rank 0 into one JSON row that the parent reads back."""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any


def run_world(rank_main: Callable[..., None], world: int, *args: Any) -> Any:
    """``rank_main(rank, store_path, *args, out_path)`` on ``world`` spawned ranks; what
    rank 0 wrote to ``out_path`` (see ``report``)."""
    import torch.multiprocessing as mp

    os.environ.setdefault("OMP_NUM_THREADS", "1")
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "row.json")
        mp.spawn(rank_main, args=(os.path.join(tmp, "store"), *args, out), nprocs=world, join=True)
        return json.loads(Path(out).read_text())


def report(row: Any, out_path: str, merge: Callable[[list[Any]], Any]) -> None:
    """Every rank's ``row`` gathered, ``merge`` of them written by rank 0 (e.g. the slowest
    rank's times), then the world taken down."""
    import torch.distributed as dist

    gathered: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, row)
    if dist.get_rank() == 0:
        Path(out_path).write_text(json.dumps(merge(gathered)))
    dist.barrier()
    dist.destroy_process_group()
