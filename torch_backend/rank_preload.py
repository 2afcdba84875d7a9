"""What every rank needs, loaded once by the ranks' fork server (``torch_backend.procs``)
and inherited by each rank it forks: torch, the worker, and the type grammar's parser
(built on first use, which each rank would otherwise repeat)."""

from __future__ import annotations

import atexit
import os

import torch.distributed  # noqa: F401

import torch_backend.worker  # noqa: F401
from spec_lang.parser import parse_mesh

parse_mesh("dp=1")

# The server ends when its parent does, without tearing torch down: a second or two of the
# collector and of operators leaving the dispatcher, while it still holds the parent's
# stdout, which a pipe reading ``shardc run`` waits on. (The server alone imports this
# module; the ranks it forks end with os._exit, never running its exit handlers.)
atexit.register(os._exit, 0)
