"""Without the extras, the Python API names the extra to install, as the CLI does: a
ModuleNotFoundError (an ImportError) whose message says ``pip install 'shardc[torch]'``
or ``'shardc[jax]'``, not the bare "No module named 'torch'"."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

# torch and jax made unimportable, as on an install without the extras
_CALLS = """
import json, sys
sys.modules["torch"] = None
sys.modules["jax"] = None
import lowering, spec_lang, torch_backend
calls = {
    "lowering.to_placements": lambda: lowering.to_placements("f32[8@dp]", "dp=2"),
    "spec_lang.to_jax": lambda: spec_lang.to_jax("f32[8@dp]", "dp=2"),
    "torch_backend.redistribute": lambda: torch_backend.redistribute,
    "torch_backend.spmd": lambda: __import__("torch_backend", fromlist=["spmd"]).spmd,
}
out = {}
for what, call in calls.items():
    try:
        call()
        out[what] = None
    except ImportError as e:
        out[what] = [type(e).__name__, e.name, str(e)]
print(json.dumps(out))
"""


@pytest.mark.timeout(120)
def test_the_python_api_names_the_extra_to_install() -> None:
    env = dict(os.environ, PYTHONPATH=str(REPO))
    p = subprocess.run([sys.executable, "-c", _CALLS], cwd=REPO, env=env, capture_output=True, text=True,
                       timeout=100)
    assert p.returncode == 0, p.stderr
    got = json.loads(p.stdout)
    for what, err in got.items():
        extra = "jax" if "jax" in what else "torch"
        assert err is not None, f"{what} needs {extra} but raised nothing"
        kind, name, message = err
        assert kind == "ModuleNotFoundError" and name.partition(".")[0] == extra, (what, err)
        assert message.startswith(f"{what} needs {extra}, which is not installed"), (what, message)
        assert f"pip install 'shardc[{extra}]'" in message, (what, message)


def test_a_missing_module_that_is_no_extra_stays_as_it_was() -> None:
    from spec_lang.lazy import needs_extra

    with pytest.raises(ModuleNotFoundError, match="^No module named 'nothere'$"):
        with needs_extra("spec_lang.to_jax"):
            import nothere  # type: ignore[import-not-found]  # noqa: F401
