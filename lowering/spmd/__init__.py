"""The SPMD type system, torch-free: local types per mesh axis, which (src, dst) pairs each
typed collective takes and its backward, each call as a Program of step kinds, and how
types flow through ordinary ops (local rules, the global-SPMD einsum rule).

The torch side is ``torch_backend.spmd``; the user guide is docs/spmd_types.md.
"""

from __future__ import annotations

from lowering.spmd.programs import backward_program, program_for
from lowering.spmd.propagate import combine, einsum_types, propagate
from lowering.spmd.rules import ALLOWED, BACKWARD, TRANSITIONS, backward_of, check_pair
from lowering.spmd.types import S, resolve
from spec_lang.local_type import I, LocalType, P, R, V
from spec_lang.parser import parse_local_type as as_local_type

__all__ = [
    "ALLOWED", "BACKWARD", "I", "LocalType", "P", "R", "S", "TRANSITIONS", "V", "as_local_type", "backward_of",
    "backward_program", "check_pair", "combine", "einsum_types", "program_for", "propagate", "resolve",
]
