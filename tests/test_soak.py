"""A CI-sized slice of the soak (``bench/soak.py`` runs the full one): fuzzed strings through
every parser entry point, malformed Python objects in every argument of every public call,
and random redistributions under LocalTensorMode (the real-gloo slice is
``tests/test_gloo_random.py``)."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from soak_cases import check_local, fuzz_parsers, malformed_calls, random_redistributions


def test_fuzzed_strings_only_raise_spec_errors() -> None:
    for name, res in fuzz_parsers(1500, seed=7).items():
        assert not res["escapes"], (name, res["escapes"][:5])
        assert res["accepted"] > 0, name  # the mutations keep some strings valid


def test_random_redistributions_under_local_tensor_mode(fake_pg: Callable[[int], None]) -> None:
    pytest.importorskip("torch")
    cases = random_redistributions(120, seed=11)
    assert len({m for m, _, _ in cases}) > 4
    assert not check_local(cases, fake_pg)



def test_malformed_objects_only_raise_spec_errors(fake_pg: Callable[[int], None]) -> None:
    pytest.importorskip("torch")
    pytest.importorskip("jax")
    res = malformed_calls(fake_pg, every=3)  # a third of the (argument, value) pairs; bench/soak.py runs all
    assert not res["bad_baselines"], res["bad_baselines"]
    assert res["calls"] >= 60 and res["tried"] > 2000
    assert not res["escapes"], res["escapes"][:10]
