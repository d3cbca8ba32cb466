"""Shared fixtures (helpers live in _helpers.py)."""

from __future__ import annotations

import pytest
import torch


@pytest.fixture
def gen():
    return torch.Generator().manual_seed(1234)
