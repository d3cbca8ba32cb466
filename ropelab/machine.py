"""The machine a measurement ran on: CPU model, thread counts and library versions, for a benchmark's JSON."""

from __future__ import annotations

import os
import platform
from pathlib import Path

import torch

__all__ = ["machine_info"]


def machine_info() -> dict:
    """CPU model, thread counts and library versions, for a benchmark's JSON."""
    cpu = platform.processor() or "unknown"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    info = {
        "cpu": cpu,
        "logical_cpus": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "python": platform.python_version(),
        "platform": platform.platform(),
    }
    try:
        import transformers

        info["transformers"] = transformers.__version__
    except ImportError:
        pass
    return info
