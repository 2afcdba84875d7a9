"""What every rank needs, loaded once by the ranks' fork server (``torch_backend.procs``)
and inherited by each rank it forks: torch, the worker, and the type grammar's parser
(built on first use, which each rank would otherwise repeat)."""

from __future__ import annotations

import torch.distributed  # noqa: F401

import torch_backend.worker  # noqa: F401
from spec_lang.parser import parse_mesh

parse_mesh("dp=1")
