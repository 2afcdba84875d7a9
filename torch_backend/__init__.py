"""shardc's PyTorch backend: run compiled redistribution programs on real tensors.

``redistribute`` / ``distribute`` (``torch_backend.api``) are the entry points; the
executor, process groups, autograd and launcher live in their own modules. Names
resolve lazily, so ``import torch_backend`` (and ``shardc parse``) does not import torch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from spec_lang.lazy import lazy_exports

if TYPE_CHECKING:  # what a type checker (and an IDE) sees of the lazy names
    from spec_lang.ir import TensorType
    from torch_backend import spmd as spmd
    from torch_backend.api import distribute as distribute
    from torch_backend.api import redistribute as redistribute
    from torch_backend.autograd import backward_program as backward_program
    from torch_backend.coalesce import redistribute_many as redistribute_many
    from torch_backend.dtensor_switch import dtensor_engine as dtensor_engine
    from torch_backend.dtensor_switch import dtensor_engine_stats as dtensor_engine_stats
    from torch_backend.dtensor_switch import use_dtensor_engine as use_dtensor_engine
    from torch_backend.executor import execute as execute
    from torch_backend.faults import CollectiveError as CollectiveError
    from torch_backend.groups import MeshContext as MeshContext
    from torch_backend.groups import clear_caches as clear_caches
    from torch_backend.groups import context as context
    from torch_backend.prepared import Redistributor as Redistributor
    from torch_backend.prepared import redistributor as redistributor
    from torch_backend.sizes import uneven_type as uneven_type

_EXPORTS = {
    "redistribute": "torch_backend.api",
    "distribute": "torch_backend.api",
    "uneven_type": "torch_backend.sizes",
    "redistributor": "torch_backend.prepared",
    "spmd": "torch_backend.spmd",
    "redistribute_many": "torch_backend.coalesce",
    "Redistributor": "torch_backend.prepared",
    "execute": "torch_backend.executor",
    "context": "torch_backend.groups",
    "MeshContext": "torch_backend.groups",
    "clear_caches": "torch_backend.groups",
    "CollectiveError": "torch_backend.faults",
    "backward_program": "torch_backend.autograd",
    "dtensor_engine": "torch_backend.dtensor_switch",
    "use_dtensor_engine": "torch_backend.dtensor_switch",
    "dtensor_engine_stats": "torch_backend.dtensor_switch",
}

__all__ = sorted([*_EXPORTS, "dual_type"])


def dual_type(t: TensorType | str) -> TensorType:
    """The gradient's type under the SPMD type system (R <-> P); a string is parsed first."""
    from spec_lang.dual import dual_type
    from spec_lang.parser import parse

    return dual_type(parse(t))


__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS, ["dual_type"])
