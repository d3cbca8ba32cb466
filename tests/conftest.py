"""Shared fixtures (helpers live in _helpers.py), and the Triton mode for the whole test process."""

from __future__ import annotations

import os

import pytest
import torch

# Triton reads TRITON_INTERPRET when it is first imported, and any test module may import ropelab.kernels
# (hence triton) first: so the mode is set here, before every test module. Without CUDA the kernels run in
# Triton's CPU interpreter; on a GPU the caller's setting stands (scripts/gpu_check*.sh set it to 0).
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")


@pytest.fixture
def gen():
    return torch.Generator().manual_seed(1234)
