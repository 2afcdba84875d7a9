"""``shardc parse TYPE [--mesh M] [--json]``: one type, every form it has (docs/dsl.md,
"Command line"). Neither torch nor jax is imported: placements are printed in their
textual form (``S(0),R,P(sum)``)."""

from __future__ import annotations

import argparse
from typing import Any

from spec_lang.errors import SpecError
from torch_backend.cli.output import json_text
from torch_backend.cli.ranks import blocks_text, box_text, cat_text, rank_line, ranks_text


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("type", help="a type, e.g. 'f32[8@(dp,tp),16]{U:cp}' (quote it in the shell)")
    parser.add_argument("--mesh", help="a mesh, e.g. dp=2,tp=4 (needed for placements and local shapes)")
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of text")
    parser.add_argument("--all", action="store_true",
                        help=f"list every rank's slice even on a mesh of more than {LIST_RANKS} ranks "
                        "(by default a big mesh is summarised: each distinct local shape, its count and ranks)")


LIST_RANKS = 64  # meshes up to this size list every rank; bigger ones are summarised


def describe(type_text: str, mesh_text: str | None, all_ranks: bool = False) -> dict[str, Any]:
    """Everything ``parse`` prints, as plain data (the --json output): ``ranks`` lists every
    rank up to LIST_RANKS ranks or with ``all_ranks`` (else None); ``local_shapes`` always
    summarises them: each distinct local shape, how many ranks hold it and which."""
    from spec_lang.ir import DTYPES
    from spec_lang.jax_interop import jax_refusal, partition_spec_text
    from spec_lang.parser import parse

    if mesh_text is not None:
        from lowering.checks import resolve

        t, mesh = resolve(type_text, mesh_text)
    else:
        t, mesh = parse(type_text), None
    refusal = jax_refusal(t, mesh)
    out: dict[str, Any] = {
        "type": str(t),
        "short": t.format(short_dtype=True),
        "dtype": t.dtype,
        "dtype_bytes": DTYPES[t.dtype][1],
        "shape": list(t.shape),
        "jax": None if refusal else partition_spec_text(t),
        "jax_refusal": refusal,
    }
    if mesh is None:
        return out
    import numpy as np

    from lowering.layout import boxes, layouts
    from lowering.placements import format_placements, placement_specs, strided_refusal

    out["mesh"] = str(mesh)
    try:
        specs, order = placement_specs(t, mesh)
        strided, _ = placement_specs(t, mesh, strided=True)
        out["placements"] = format_placements(specs)
        out["shard_order"] = {str(d): axes for d, axes in order.items()}
        # only a form torch's distribute_tensor takes (an uneven strided dim it refuses)
        out["strided_refusal"] = strided_refusal(t, mesh) if order else None
        out["strided_placements"] = format_placements(strided) if order and not out["strided_refusal"] else None
        out["dtensor_refusal"] = None
    except SpecError as e:
        out.update(placements=None, shard_order=None, strided_placements=None, strided_refusal=None,
                   dtensor_refusal=e.message)
    out["ranks"] = None
    lays = layouts(t, mesh) if t.is_uneven else None
    if lays is None:
        b = boxes(t, mesh)
        sizes = b[:, :, 1] - b[:, :, 0]
    else:
        sizes = np.array([lay.shape for lay in lays], dtype=np.int64)
    # one small int per rank naming its shape: per-dim distinct sizes in mixed radix (a 1-d
    # unique per dim is fast; a row-wise unique over millions of ranks is not)
    key = np.zeros(mesh.size, dtype=np.int64)
    for d in range(sizes.shape[1]):
        values, idx = np.unique(sizes[:, d], return_inverse=True)
        key = key * len(values) + idx.reshape(-1)
    out["local_shapes"] = []
    for first in sorted(np.unique(key, return_index=True)[1].tolist()):  # each shape, from its first rank on
        holders = np.flatnonzero(key == key[first])
        out["local_shapes"].append({"shape": sizes[first].tolist(), "count": len(holders),
                                    "ranks": ranks_text(holders, max_runs=16)})
    if mesh.size <= LIST_RANKS or all_ranks:
        out["ranks"] = [{"rank": r, "coords": dict(zip(mesh.names, mesh.coords(r), strict=True)),
                         **({"slices": b[r].tolist(), "shape": sizes[r].tolist()} if lays is None else
                            {"blocks": lays[r].blocks.tolist(), "cat": lays[r].cat, "shape": list(lays[r].shape)})}
                        for r in range(mesh.size)]
    return out


def _text(info: dict[str, Any]) -> str:
    lines = [
        f"type:         {info['type']}",
        f"short:        {info['short']}",
        f"jax:          {info['jax'] or 'not representable: ' + str(info['jax_refusal'])}",
    ]
    if "mesh" not in info:
        lines.append("placements:   (give --mesh to see DTensor placements and local shapes)")
        return "\n".join(lines)
    if info["placements"] is None:
        lines.append(f"placements:   not representable: {info['dtensor_refusal']}")
    else:
        order = info["shard_order"]
        lines.append(f"placements:   {info['placements']}")
        lines.append(
            "shard_order:  " + ("{" + ", ".join(f"{d}: {axes}" for d, axes in order.items()) + "}"
                                if order else "{} (mesh order)")
        )
        if info["strided_placements"]:
            lines.append(f"strided:      {info['strided_placements']}  (the distribute_tensor form)")
        elif info["strided_refusal"]:
            lines.append(f"strided:      none that distribute_tensor takes: {info['strided_refusal']} "
                         "(torch_backend.distribute gives each rank its block)")
    lines.append(f"mesh:         {info['mesh']}")
    if info["ranks"] is None:
        n = sum(s["count"] for s in info["local_shapes"])
        lines.append(f"local:        {n:,} ranks, {len(info['local_shapes'])} distinct local shape(s) "
                     "(--all lists every rank):")
        for s in info["local_shapes"]:
            lines.append(f"  shape {tuple(s['shape'])} on {s['count']:,} rank(s): {s['ranks']}")
        return "\n".join(lines)
    if info["ranks"] and "blocks" in info["ranks"][0]:
        lines.append(f"local:        each rank's blocks in local order ({cat_text(info['ranks'][0]['cat'])}):")
    else:
        lines.append("local:")
    for r in info["ranks"]:
        held = blocks_text(r["blocks"]) if "blocks" in r else box_text(r["slices"])
        lines.append(rank_line(r["rank"], r["coords"].items(), held, r["shape"]))
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    info = describe(args.type, args.mesh, all_ranks=args.all)
    if args.json:
        print(json_text({"ok": True, **info}))
    else:
        print(_text(info))
    return 0
