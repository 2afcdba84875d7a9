"""Differentiable redistribute: the backward of ``src -> dst`` is ``compile(dual(dst), dual(src))``
(the SPMD type system's duality, ``spec_lang.dual``; docs/running.md, "Autograd"), which
``torch_backend.bound`` runs as a bound call's ``dual()``.
"""

from __future__ import annotations

from lowering.planner import compile_gradient

backward_program = compile_gradient  # the program that computes a program's gradient (cached by the planner)
