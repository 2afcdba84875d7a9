"""The layout algebra: which global elements each rank holds.

``ranges`` is the pure arithmetic (the chunk rule per dim, boxes, overlaps, rank groups);
``per_rank`` the one answer per type (``rank_layout``: a rank's blocks in local order;
``boxes``: one box a rank, its fast path for types with no uneven split). Names resolve
lazily from those modules.
"""

from __future__ import annotations

from spec_lang.lazy import lazy_exports

_RANGES = ("mesh_coords", "chunk_range", "dim_ranges", "dim_lengths", "dim_overlap", "box_slices", "overlap",
           "box_numel", "overlap_numel", "meet_numel", "flat_run_boxes", "group_ranks", "all_groups", "group_arrays")
_PER_RANK = ("LocalLayout", "rank_layout", "layouts", "boxes", "local_shapes", "local_shape", "local_numel",
             "own_overlap_numel", "stacked_blocks", "block_indices", "local_indices", "local_slices")
_EXPORTS = {**dict.fromkeys(_RANGES, "lowering.layout.ranges"), **dict.fromkeys(_PER_RANK, "lowering.layout.per_rank")}

__all__ = sorted(n for n in _EXPORTS if not n.startswith("_"))


__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
