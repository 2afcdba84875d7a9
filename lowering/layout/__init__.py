"""The layout algebra: which global elements each rank holds.

``ranges`` is the pure arithmetic (the chunk rule per dim, boxes, overlaps, rank groups);
``per_rank`` the one answer per type (``rank_layout``: a rank's blocks in local order;
``boxes``: one box a rank, its fast path for types with no uneven split). Names resolve
lazily from those modules.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from spec_lang.lazy import lazy_exports

if TYPE_CHECKING:  # what a type checker sees of the lazy names
    from lowering.layout.per_rank import LocalLayout as LocalLayout
    from lowering.layout.per_rank import block_indices as block_indices
    from lowering.layout.per_rank import boxes as boxes
    from lowering.layout.per_rank import layouts as layouts
    from lowering.layout.per_rank import local_indices as local_indices
    from lowering.layout.per_rank import local_numel as local_numel
    from lowering.layout.per_rank import local_shape as local_shape
    from lowering.layout.per_rank import local_shapes as local_shapes
    from lowering.layout.per_rank import local_slices as local_slices
    from lowering.layout.per_rank import own_overlap_numel as own_overlap_numel
    from lowering.layout.per_rank import rank_layout as rank_layout
    from lowering.layout.per_rank import stacked_blocks as stacked_blocks
    from lowering.layout.ranges import all_groups as all_groups
    from lowering.layout.ranges import box_numel as box_numel
    from lowering.layout.ranges import box_slices as box_slices
    from lowering.layout.ranges import chunk_range as chunk_range
    from lowering.layout.ranges import dim_lengths as dim_lengths
    from lowering.layout.ranges import dim_overlap as dim_overlap
    from lowering.layout.ranges import dim_ranges as dim_ranges
    from lowering.layout.ranges import flat_run_boxes as flat_run_boxes
    from lowering.layout.ranges import group_arrays as group_arrays
    from lowering.layout.ranges import group_ranks as group_ranks
    from lowering.layout.ranges import meet_numel as meet_numel
    from lowering.layout.ranges import mesh_coords as mesh_coords
    from lowering.layout.ranges import overlap as overlap
    from lowering.layout.ranges import overlap_numel as overlap_numel

_RANGES = ("mesh_coords", "chunk_range", "dim_ranges", "dim_lengths", "dim_overlap", "box_slices", "overlap",
           "box_numel", "overlap_numel", "meet_numel", "flat_run_boxes", "group_ranks", "all_groups", "group_arrays")
_PER_RANK = ("LocalLayout", "rank_layout", "layouts", "boxes", "local_shapes", "local_shape", "local_numel",
             "own_overlap_numel", "stacked_blocks", "block_indices", "local_indices", "local_slices")
_EXPORTS = {**dict.fromkeys(_RANGES, "lowering.layout.ranges"), **dict.fromkeys(_PER_RANK, "lowering.layout.per_rank")}

__all__ = sorted(n for n in _EXPORTS if not n.startswith("_"))


__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
