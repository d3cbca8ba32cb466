"""RoPE across engines: read a model's RoPE from each format it crosses, per layer, and compare.

- :mod:`ropelab.engines.reading`: :class:`Reading`, one source's per-layer specs; :class:`ReadError`.
- :mod:`ropelab.engines.hf`: transformers ``config.json`` (v4 and v5 schema), both directions.
- :mod:`ropelab.engines.gguf`: GGUF files as llama.cpp reads them (the ``gguf`` package), both directions; the
  per-architecture conventions in :mod:`ropelab.engines.llamacpp_table`, generated from llama.cpp's source by
  :mod:`ropelab.engines.llamacpp_parse`.
- :mod:`ropelab.engines.converter`: llama.cpp's own ``convert_hf_to_gguf.py``, from the llama-cpp-python sdist.
- :mod:`ropelab.engines.tiny`: tiny Hugging Face models saved in code, one per RoPE family (the parity tests' inputs).
- :mod:`ropelab.engines.mlx`: ``mlx.core.fast.rope`` and mlx-lm's rope classes.
- :mod:`ropelab.engines.ggml`: ggml's RoPE itself: a GGUF run through llama.cpp (llama-cpp-python, ``make ggml``),
  its logits, and ggml's RoPE op.
- :mod:`ropelab.engines.llamacpp_run`: llama.cpp itself, running (the llama-cpp-py-sync wheel's ``libllama.so``, in a
  child process): a GGUF file's logits at an allocated context; :mod:`ropelab.engines.parity`: those logits against
  transformers' float64 forward, within a float32 bound.
- :mod:`ropelab.engines.vllm`: vLLM running (``make vllm``: its own environment, reached through a subprocess running
  :mod:`ropelab.engines.vllm_runner`): each layer's rotary module as vLLM builds it, and its logits.
- :mod:`ropelab.engines.check`: the ``ropelab-check`` console script.
- :mod:`ropelab.engines.matrix`: the conformance matrix, every tiny family read by each engine against transformers
  (``data/engines/matrix.json``).
"""

from .reading import FORMATS, ReadError, Reading

__all__ = ["FORMATS", "ReadError", "Reading"]
