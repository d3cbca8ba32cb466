"""The machine a measurement runs on: CPU model, thread counts and library versions for a benchmark's JSON,
and ``one_thread`` for work made of tiny tensors."""

from __future__ import annotations

import os
import platform
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import torch

__all__ = ["machine_info", "gpu_driver", "one_thread"]


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


@contextmanager
def one_thread() -> Iterator[None]:
    """Run torch on one intra-op thread inside the block, then restore the thread count. For work made of
    tiny tensors (diagnose's probes, the explorers, notebook 08's grid task): on a busy 2-core machine the
    OpenMP barriers of a second thread made such ops 10 to 100 times slower (measured: a 256 x 256
    ``masked_fill`` 40 ms on 2 threads, under 1 ms on one; a diagnosis 7 s against 0.2 s at load 9)."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(n)


def gpu_driver() -> str | None:
    """The NVIDIA driver version ``nvidia-smi`` reports, for a GPU benchmark's JSON; None where it cannot tell."""
    try:
        return subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                              capture_output=True, text=True, timeout=20).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
