"""Differentiable redistribute: the backward of ``src -> dst`` is ``compile(dual(dst), dual(src))``.

(This module holds the rule; ``torch_backend.bound`` runs it: a bound call's backward is
its ``dual()``, the bound gradient programs, on one autograd Function.)

The SPMD type system's forward/backward table on the types (``spec_lang.dual``): the gradient of Replicate is Partial,
of Partial is Replicate, of Invariant Invariant, of Varying Varying, and a dim sharded
by an axis stays sharded by it. So the gradient of a redistribution is again a
redistribution, between the dual types, and the compiler plans it like any other::

    forward                      backward (compile(dual(dst), dual(src)))
    f32[8@dp] -> f32[8]          f32[8]        -> f32[8@dp]      slice      (convert(I,S))
    f32[8@dp] -> f32[8]{R:dp}    f32[8]{U:dp}  -> f32[8@dp]      reduce_scatter
    f32[8]{U:dp} -> f32[8]{R:dp} f32[8]{U:dp}  -> f32[8]{R:dp}   all_reduce
    f32[8]{U:dp} -> f32[8]       f32[8]        -> f32[8]{R:dp}   reinterpret(I,R)
    f32[8]{R:dp} -> f32[8]       f32[8]        -> f32[8]{U:dp}   zero_fill  (convert(I,P))

Gradients are *global*: the tensors flowing backward are blocks of the dual type whose
denotation is the gradient of the forward value's denotation (what the SPMD type
system's tables and DTensor both use). Hence the adjoint identity the tests check exactly,
``<F x, y>_dst == <x, B y>_src``, with ``<a, b>_T`` the inner product of denotations:
the sum over ranks of local inner products, divided by the size of every I axis (the
value and its gradient are both replicated there, and count once).

Reduce ops other than sum:

* ``P(avg)``: the dual is R, as in DTensor (``Partial('avg') -> Replicate`` keeps the
  gradient replicated, unscaled): the gradient of the mean's denotation, G, is held by
  every rank. (The per-rank derivative would be G/n; the global convention keeps one
  gradient value, as for I.)
* ``P(max)`` / ``P(min)``: the reduction is not linear and its gradient needs the arg-max,
  which no type carries; backward raises a SpecError (forward works, and so does a
  backward-free use under ``torch.no_grad``).
"""

from __future__ import annotations

from lowering.planner import compile_gradient

backward_program = compile_gradient  # the program that computes a program's gradient (cached by the planner)
