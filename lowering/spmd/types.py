"""The local SPMD types under the names the SPMD API uses (one class: ``spec_lang.local_type``)."""

from __future__ import annotations

from spec_lang.local_type import REDUCE_OPS, I, LocalType, P, R, S, V
from spec_lang.parser import parse_local_type as as_local_type

__all__ = ["REDUCE_OPS", "I", "LocalType", "P", "R", "S", "V", "as_local_type"]
