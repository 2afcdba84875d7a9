"""Start-up hook for ``bench/pytorch_dtensor_tests.py``: the runner puts this folder on
PYTHONPATH of the pytest process it starts, so Python imports it in that process and in every
rank process torch's test harness spawns (DTensorTestBase starts its ranks with ``spawn``, so
a pytest plugin alone would not reach them).

- ``SHARDC_DTENSOR_ENGINE=1``: ``torch_backend.use_dtensor_engine()`` for the whole process.
- ``SHARDC_ENGINE_STATS=<folder>``: at exit, ``dtensor_engine_stats()`` goes to
  ``<folder>/<pid>.json`` (the runner sums them).
- The compatibility shim (both modes, nothing under test): the public test files name
  ``MaskPartial``, which torch 2.13 names ``_MaskPartial`` (the same class; only the name moved).
"""

import atexit
import json
import os

if os.environ.get("SHARDC_PYTORCH_TESTS") == "1":
    from torch.distributed.tensor import placement_types as _placement_types

    if not hasattr(_placement_types, "MaskPartial"):
        _placement_types.MaskPartial = _placement_types._MaskPartial  # type: ignore[attr-defined]

    if os.environ.get("SHARDC_DTENSOR_ENGINE") == "1":
        import torch_backend

        torch_backend.use_dtensor_engine(True)
        _stats_dir = os.environ.get("SHARDC_ENGINE_STATS")
        if _stats_dir:

            def _dump() -> None:
                with open(os.path.join(_stats_dir, f"{os.getpid()}.json"), "w") as f:
                    json.dump(torch_backend.dtensor_engine_stats(), f)

            atexit.register(_dump)
