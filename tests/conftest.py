"""Shared fixtures (helpers live in _helpers.py), and the Triton mode for the whole test process."""

from __future__ import annotations

import os

import pytest
import torch
from _helpers import EXTRA_MODELS

# Triton reads TRITON_INTERPRET when it is first imported, and any test module may import ropelab.kernels
# (hence triton) first: so the mode is set here, before every test module. Without CUDA the kernels run in
# Triton's CPU interpreter; on a GPU the caller's setting stands (scripts/gpu_check*.sh set it to 0).
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")


@pytest.fixture
def gen():
    return torch.Generator().manual_seed(1234)


@pytest.fixture(scope="module")
def converted(tmp_path_factory):
    """Every tiny family of ropelab.engines.tiny and EXTRA_MODELS, saved and converted by llama.cpp's converter once
    per session (pytest-xdist workers share the parent of their base temp dirs and a lock):
    {name: (hf model dir, gguf path)}."""
    import fcntl

    from ropelab.engines.tiny import FAMILIES

    shared = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        shared = shared.parent  # the session's temp dir, above each worker's popen-gwN
    root = shared / "engines-gguf"
    with open(shared / "engines-gguf.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (root / ".done").is_file():
            _convert_all(root)
            (root / ".done").write_text("ok")
    return {f: (root / f / "model", root / f"{f}.gguf") for f in [*FAMILIES, *EXTRA_MODELS]}


def _convert_all(root):
    from ropelab.engines import converter
    from ropelab.engines.tiny import FAMILIES, save_tiny_model

    # Each model in <name>/model: the converter names the model after its directory (general.name), and llama.cpp's
    # vocab loader looks up "<|endoftext|>" in any model whose name contains "phi3" (src/llama-vocab.cpp:3118-3126),
    # which the tiny tokenizer does not have: it refuses the file ("error loading model vocabulary").
    root.mkdir(parents=True, exist_ok=True)
    dirs = {f: save_tiny_model(f, root / f / "model") for f in FAMILIES}
    for name, (family, overrides) in EXTRA_MODELS.items():
        dirs[name] = save_tiny_model(family, root / name / "model", **overrides)
    # unknown_bpe_pre: the tiny tokenizer of the BPE-vocabulary families (cohere2) is no real model's.
    converter.convert_many([(d, root / f"{f}.gguf") for f, d in dirs.items()], unknown_bpe_pre="default")
