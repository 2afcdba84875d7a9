"""The full soak: fuzzed strings through every parser entry point, malformed Python objects
in every argument of every public call, random redistributions under LocalTensorMode, and
random redistributions on 8 real gloo processes.

    python bench/soak.py                       # 100,000 strings each, every object, 10,000 local, 1,000 gloo
    python bench/soak.py --strings 1000 --local 100 --gloo 40    # a quick pass
    python bench/soak.py --strings 100000 --local 0 --gloo 0     # strings and objects alone

Prints each part's counts and what went wrong (nothing, when all is well); exits 1 if
anything escaped, hung or came out wrong. ``tests/test_soak.py`` runs a CI-sized slice.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from soak_cases import check_local, fuzz_parsers, gloo_cases, malformed_calls, random_redistributions


def fake_world(world: int) -> None:
    import torch.distributed as dist
    from torch.testing._internal.distributed.fake_pg import FakeStore

    if dist.is_initialized():
        if dist.get_world_size() == world:
            return
        dist.destroy_process_group()
    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=world)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--strings", type=int, default=100_000, help="fuzzed strings per parser entry point")
    ap.add_argument("--local", type=int, default=10_000, help="random redistributions under LocalTensorMode")
    ap.add_argument("--gloo", type=int, default=1_000, help="random redistributions on 8 gloo processes")
    ap.add_argument("--seed", type=int, default=2026)
    ap.add_argument("--no-objects", action="store_true", help="skip the malformed Python objects")
    args = ap.parse_args()
    failed = False

    t0 = time.perf_counter()
    for name, res in fuzz_parsers(args.strings, args.seed).items():
        print(f"fuzz {name:18s} {res['strings']:>7} strings, {res['accepted']:>6} accepted, "
              f"{len(res['escapes'])} escapes, slowest {res['slowest_s'] * 1e3:.1f} ms")
        for e in res["escapes"][:10]:
            print("   ", e)
        failed |= bool(res["escapes"])
    print(f"fuzz: {time.perf_counter() - t0:.1f} s")

    if not args.no_objects:
        t0 = time.perf_counter()
        res = malformed_calls(fake_world)
        print(f"objects: {res['calls']} public calls, {res['tried']} calls with one argument malformed "
              f"({res['refused']} refused with a SpecError, {res['accepted']} accepted), "
              f"{len(res['escapes'])} escapes, {time.perf_counter() - t0:.1f} s")
        for e in [*res["bad_baselines"], *res["escapes"]][:20]:
            print("   ", e)
        failed |= bool(res["escapes"] or res["bad_baselines"])

    t0 = time.perf_counter()
    cases = random_redistributions(args.local, args.seed)
    bad = check_local(cases, fake_world)
    from lowering import local_shapes
    from spec_lang import parse, parse_mesh

    uneven = sum(1 for m, s, d in cases if any(len(set(local_shapes(parse(t), parse_mesh(m)))) > 1 for t in (s, d)))
    print(f"local: {len(cases)} redistributions ({uneven} with uneven blocks), {len(bad)} wrong, "
          f"{time.perf_counter() - t0:.1f} s")
    for b in bad[:10]:
        print("   ", b)
    failed |= bool(bad)

    if args.gloo:
        from torch_utils import GlooPool

        t0 = time.perf_counter()
        pool = GlooPool(8, collective_timeout_s=60)
        try:
            results = pool.run(gloo_cases, args.gloo, args.seed, timeout_s=3600)
        finally:
            pool.close()
        bad_g = {r: res for r, res in results.items() if res}
        print(f"gloo: {args.gloo} redistributions on 8 processes, {sum(map(len, bad_g.values()))} wrong, "
              f"{time.perf_counter() - t0:.1f} s")
        for r, res in sorted(bad_g.items()):
            print(f"    rank {r}: {res[:5]}")
        failed |= bool(bad_g)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
