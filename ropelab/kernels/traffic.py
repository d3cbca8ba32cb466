r"""Where the bytes go: the memory traffic of each RoPE implementation, counted op by op (a model).

RoPE does a few flops per element, so on a GPU its time is bounded below by the bytes it moves divided
by the memory bandwidth. This module counts those bytes on any machine, CPU included:

- **eager paths** (Hugging Face's ``apply_rotary_pos_emb``, :func:`ropelab.rotate`): a
  ``TorchDispatchMode`` sees every aten op; each op is charged the distinct bytes of its tensor inputs
  (an expanded table counts once: stride-0 dims are not re-read) plus the bytes of its outputs.
  View ops (slice, view, permute, expand, ...) move nothing and are charged nothing.
- **compiled paths** (``torch.compile``): the dispatch mode does not see inside a compiled graph, so
  the code Inductor generates is read instead (:func:`count_compiled`): graph inputs read once, each
  buffer it allocates written once, intermediates read back once.
- **the fused Triton kernel** (:mod:`ropelab.kernels.rope_triton`): from its loads and stores, by
  hand: q and k read once and written once, plus the cos/sin rows of the positions used.
- **the reference**: a copy of q and k (read once, write once); it bounds a RoPE kernel's time from below only
  for DRAM-bound kernels whose working set is well above the last-level cache.
- **QK-RMSNorm + RoPE + KV-cache write** (:func:`qk_norm_rope_traffic`, :mod:`ropelab.kernels.qk_norm_rope`): the
  norm alone, the unfused sequence (norm, RoPE, cache write: three passes) and the fused op (the norm's own
  pass, plus reading v and writing k and v into the cache, which any cache write must do), by hand.

The model assumes each op's or launch's inputs come from memory (no reuse between ops through a cache), while
within one op or launch a table that several heads share is charged once (an eager op's broadcast table, the fused
kernel's cos/sin rows, which :func:`fused_table_loads` says how many programs load). On a GPU
whose L2 is smaller than the working set this is close; for small tensors that fit in L2 it
overstates eager traffic. It says nothing about launch overhead. Label it as a model wherever it is
drawn.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

__all__ = ["OpTraffic", "Traffic", "count_eager", "count_compiled", "count_fused", "fused_table_loads", "count_copy",
           "rope_traffic", "bytes_view", "BYTES_DTYPES", "qk_norm_rope_traffic"]

# aten ops that only make a new view of the same storage: no data moves.
_VIEW_OPS = {
    "view", "_unsafe_view", "slice", "select", "permute", "expand", "unsqueeze", "squeeze", "t", "transpose",
    "as_strided", "alias", "detach", "reshape", "unbind", "split", "split_with_sizes", "narrow", "movedim",
    "view_as_real", "view_as_complex", "lift_fresh", "diagonal",
    # allocations and dtype queries: nothing read or written yet
    "empty", "empty_like", "empty_strided", "promote_types", "result_type",
}


def distinct_bytes(t: torch.Tensor) -> int:
    """Bytes of the distinct elements a tensor addresses: stride-0 (broadcast) dims count once."""
    n = 1
    for size, stride in zip(t.shape, t.stride()):
        if stride != 0:
            n *= size
    return n * t.element_size() if t.numel() else 0


@dataclass
class OpTraffic:
    op: str
    read: int
    written: int


@dataclass
class Traffic:
    """Bytes read and written by one implementation, and by which ops (or kernels)."""

    name: str
    ops: list[OpTraffic] = field(default_factory=list)
    note: str = ""

    @property
    def read(self) -> int:
        return sum(o.read for o in self.ops)

    @property
    def written(self) -> int:
        return sum(o.written for o in self.ops)

    @property
    def total(self) -> int:
        return self.read + self.written


class _Counter(TorchDispatchMode):
    def __init__(self, traffic: Traffic):
        super().__init__()
        self.traffic = traffic

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        name = func.overloadpacket.__name__
        if name in _VIEW_OPS:
            return out
        ins = [a for a in tree_flatten((args, kwargs or {}))[0] if isinstance(a, torch.Tensor)]
        outs = [o for o in tree_flatten(out)[0] if isinstance(o, torch.Tensor)]
        # an in-place or out= op writes into one of its inputs: count that write once
        self.traffic.ops.append(OpTraffic(name, sum(distinct_bytes(t) for t in ins),
                                          sum(distinct_bytes(t) for t in outs)))
        return out


def count_eager(name: str, fn: Callable[[], object]) -> Traffic:
    """Run ``fn()`` under the counting mode: one entry per aten op that moves data."""
    traffic = Traffic(name, note="aten ops seen by a TorchDispatchMode")
    with torch.no_grad(), _Counter(traffic):
        fn()
    return traffic


_BUF = re.compile(r"(buf\d+) = empty_strided_\w+\(\(([^)]*)\), \(([^)]*)\), torch\.(\w+)\)")


def count_compiled(name: str, fn: Callable, *args) -> Traffic:
    """Compile ``fn`` afresh and count the buffers of the code Inductor generated for ``args``.

    The graph's tensor inputs are read once (distinct bytes); every buffer Inductor allocates is written
    once; a buffer it does not return (an intermediate, e.g. ``rotate_half``'s concatenation) is also
    read back once. Counted from the generated wrapper code (its ``empty_strided`` calls and its
    ``return``), so it describes the code Inductor made on *this* machine (C++ on a CPU; a GPU build
    generates Triton and may keep intermediates in registers).
    """
    import torch._dynamo
    from torch._inductor import config
    from torch._inductor.utils import run_and_get_code

    torch._dynamo.reset()
    with config.patch({"fx_graph_cache": False}), torch.no_grad():
        _, codes = run_and_get_code(torch.compile(fn, dynamic=False), *args)
    torch._dynamo.reset()
    src = "\n".join(codes)
    call = src[src.index("def call"):]
    call = call[:call.index("\n        return") + 1 + call[call.index("\n        return") + 1:].index("\n")]
    returned = set(re.findall(r"buf\d+", call.splitlines()[-1]))
    ins = [a for a in tree_flatten(args)[0] if isinstance(a, torch.Tensor)]
    kernels = len(re.findall(r"^\s+(?:cpp_fused|triton_)\w*(?:\(|\.run\()", call, flags=re.M))
    traffic = Traffic(name, note=f"buffers of Inductor's generated code: {kernels} kernel(s)")
    traffic.ops.append(OpTraffic("read graph inputs", sum(distinct_bytes(t) for t in ins), 0))
    for buf, shape, _stride, dtype in _BUF.findall(call):
        n = math.prod(int(v) for v in shape.replace(" ", "").split(",") if v) * getattr(torch, dtype).itemsize
        kind = "output" if buf in returned else "intermediate"
        traffic.ops.append(OpTraffic(f"{buf} ({kind})", n if kind == "intermediate" else 0, n))
    return traffic


def count_fused(q: torch.Tensor, k: torch.Tensor, n_positions: int, half: int, table_itemsize: int = 4,
                table_loads: int = 1) -> Traffic:
    """The fused kernel's loads and stores: q, k read and written once, cos/sin rows of the positions used.

    ``table_loads`` is how many times each cos/sin row is charged. 1 (the default) is this module's rule for every
    implementation: within one kernel launch a table that several heads share is charged once, as an eager op's
    table broadcast over the heads is (its distinct bytes), i.e. it stays in L2 after its first load; between
    launches nothing is reused. :func:`fused_table_loads` gives the loads the kernel *issues* instead (one per
    program that shares a token block, per sequence)."""
    t = Traffic("fused Triton kernel (ropelab.kernels)" if table_loads == 1 else
                f"fused Triton kernel, cos/sin as issued ({table_loads} loads per row)",
                note="from the kernel's loads and stores" + ("" if table_loads == 1 else
                                                             "; cos/sin charged once per program"))
    t.ops.append(OpTraffic("load q, k", distinct_bytes(q) + distinct_bytes(k), 0))
    t.ops.append(OpTraffic("load cos, sin rows", 2 * n_positions * half * table_itemsize * table_loads, 0))
    t.ops.append(OpTraffic("store q', k'", 0, distinct_bytes(q) + distinct_bytes(k)))
    return t


def fused_table_loads(shape_q, heads_k: int, half: int) -> int:
    """How many times the fused kernel loads each cos/sin row at q's shape [b, h, s, d] and ``heads_k`` k heads: the
    programs that share one token block (each loads the block's rows once for all of its heads), times the
    sequences. From :func:`ropelab.kernels.fused_rope.launch_tiles`, the launch's own tiling."""
    from .fused_rope import launch_tiles

    b, h, s, _ = shape_q
    _, _, _, grid = launch_tiles(s, b, h, heads_k, half)
    return grid[1] * grid[2]


def count_copy(q: torch.Tensor, k: torch.Tensor) -> Traffic:
    t = Traffic("copy of q and k (reference)", note="read once, write once")
    t.ops.append(OpTraffic("copy", distinct_bytes(q) + distinct_bytes(k), distinct_bytes(q) + distinct_bytes(k)))
    return t


def rope_traffic(shape_q=(1, 32, 512, 128), heads_k: int = 8, dtype=torch.bfloat16, compile: bool = True
                 ) -> list[Traffic]:
    """Traffic of every implementation on q [b, h, s, d] and k with ``heads_k`` heads (Llama-3-8B-like).

    Hugging Face's tables are [b, s, d] (cos repeated over both halves, as ``LlamaRotaryEmbedding``
    returns them); ropelab's are [s, d/2] float32.
    """
    from ..core import cos_sin, rotate
    from ..scaling import frequencies

    b, h, s, d = shape_q
    q = torch.randn(b, h, s, d).to(dtype)
    k = torch.randn(b, heads_k, s, d).to(dtype)
    inv, _ = frequencies(d)
    c, si = cos_sin(torch.arange(s), inv)
    hf_cos = torch.cat([c, c], -1)[None].to(dtype)
    hf_sin = torch.cat([si, si], -1)[None].to(dtype)
    out = [count_copy(q, k)]
    try:
        from transformers.models.llama.modeling_llama import apply_rotary_pos_emb
    except ImportError:
        apply_rotary_pos_emb = None
    if apply_rotary_pos_emb is not None:
        out.append(count_eager("HF apply_rotary_pos_emb, eager", lambda: apply_rotary_pos_emb(q, k, hf_cos, hf_sin)))
    out.append(count_eager("ropelab.rotate, eager", lambda: (rotate(q, c[None, None], si[None, None]),
                                                             rotate(k, c[None, None], si[None, None]))))
    if compile and apply_rotary_pos_emb is not None:
        try:
            out.append(count_compiled("torch.compile(HF apply_rotary_pos_emb)", apply_rotary_pos_emb,
                                      q, k, hf_cos, hf_sin))
        except Exception as e:  # no C++ toolchain: say so rather than fail
            out.append(Traffic("torch.compile(HF apply_rotary_pos_emb)", note=f"not counted: {type(e).__name__}"))
    out.append(count_fused(q, k, s, d // 2))
    return out


BYTES_DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}


def bytes_view(batch: int = 1, heads_q: int = 32, heads_k: int = 8, seq: int = 2048, head_dim: int = 128,
               dtype: str = "bfloat16") -> dict:
    """Section 1's byte model of notebook 06 at one shape, for its explorer: ``(read, written)`` in bytes under
    ``"copy"`` (of q and k: the reference), ``"hf_eager"`` (Hugging Face's eager ``apply_rotary_pos_emb``, traced by
    :func:`count_eager` on meta tensors, so a large shape allocates nothing), ``"fused"`` (the fused kernel, its
    cos/sin rows charged once: this module's rule) and ``"fused_issued"`` (the rows charged as the kernel issues
    them, :func:`fused_table_loads`), and ``"table_loads"``, that count. Without transformers ``"hf_eager"`` is
    absent.

    Args:
        batch: sequences in the batch.
        heads_q: query heads.
        heads_k: key heads (fewer than ``heads_q`` under grouped-query attention).
        seq: tokens per sequence.
        head_dim: d, every dim of which rotates (the tables hold d/2 float32 pairs per token).
        dtype: the dtype of q, k and Hugging Face's tables: a key of :data:`BYTES_DTYPES`.
    """
    for name, v in (("batch", batch), ("heads_q", heads_q), ("heads_k", heads_k), ("seq", seq)):
        if not isinstance(v, int) or isinstance(v, bool) or v < 1:
            raise ValueError(f"{name} must be a positive int, got {v!r}.")
    if not isinstance(head_dim, int) or isinstance(head_dim, bool) or head_dim < 2 or head_dim % 2:
        raise ValueError(f"head_dim must be an even int >= 2 (RoPE rotates pairs), got {head_dim!r}.")
    if dtype not in BYTES_DTYPES:
        raise ValueError(f"dtype must be one of {list(BYTES_DTYPES)}, got {dtype!r}.")
    dt, meta = BYTES_DTYPES[dtype], {"device": "meta"}
    q = torch.empty(batch, heads_q, seq, head_dim, dtype=dt, **meta)
    k = torch.empty(batch, heads_k, seq, head_dim, dtype=dt, **meta)
    loads = fused_table_loads((batch, heads_q, seq, head_dim), heads_k, head_dim // 2)
    counted = {"copy": count_copy(q, k), "hf_eager": _hf_eager(q, k, seq, head_dim, dt),
               "fused": count_fused(q, k, seq, head_dim // 2),
               "fused_issued": count_fused(q, k, seq, head_dim // 2, table_loads=loads)}
    out = {key: (t.read, t.written) for key, t in counted.items() if t is not None}
    out["table_loads"] = loads
    return out


def _hf_eager(q, k, seq, head_dim, dt):
    try:
        from transformers.models.llama.modeling_llama import apply_rotary_pos_emb
    except ImportError:
        return None
    table = torch.empty(1, seq, head_dim, dtype=dt, device="meta")  # [1, s, d], as LlamaRotaryEmbedding returns it
    return count_eager("HF apply_rotary_pos_emb, eager", lambda: apply_rotary_pos_emb(q, k, table, table))


def qk_norm_rope_traffic(tokens: int, num_heads: int, num_kv_heads: int, head_dim: int, rotary_dim: int | None = None,
                         itemsize: int = 2, table_itemsize: int = 4, cache: bool = True) -> list[Traffic]:
    r"""Bytes of QK-RMSNorm, of the unfused norm -> RoPE -> cache-write sequence and of the fused op, by hand.

    With ``Q = T Hq D``, ``K = V = T Hkv D`` elements of ``itemsize`` bytes, weights ``2 D``, tables
    ``2 T r/2`` elements of ``table_itemsize`` (cos and sin rows of each token's position):

    - **RMSNorm alone**: read q, k and the weights; write q, k: :math:`(2(Q + K) + 2D)\,s`.
    - **unfused**: the norm as above; RoPE reads q, k and the tables, writes q, k; the cache write reads k, v
      and writes them into the cache: :math:`(4(Q+K) + 2D + 4K)\,s + T r\,s_t`. Three passes over k.
    - **fused**: read q, k, v, the weights and the tables once; write q, k and k, v into the cache:
      :math:`(2(Q + K) + 2D + 3K)\,s + T r\,s_t` (``3K``: v read, k and v written to the cache).

    ``cache=False`` drops the cache write (and v) from the unfused and fused counts. The fused op's bytes
    beyond the norm alone are then only the tables: RoPE adds no pass over the projection output.
    """
    r = head_dim if rotary_dim is None else rotary_dim
    s, st = itemsize, table_itemsize
    Q, K = tokens * num_heads * head_dim, tokens * num_kv_heads * head_dim
    W, tab = 2 * head_dim * s, tokens * r * st  # two weight vectors; cos and sin rows, r/2 each
    norm = Traffic("RMSNorm alone (q, k)", note="by hand: read q, k, weights; write q, k")
    norm.ops += [OpTraffic("norm: load q, k, weights", (Q + K) * s + W, 0),
                 OpTraffic("norm: store q, k", 0, (Q + K) * s)]
    unfused = Traffic("unfused: norm -> RoPE -> cache write", note="by hand: one pass per op")
    unfused.ops += list(norm.ops)
    unfused.ops.append(OpTraffic("rope: load q, k, cos/sin rows", (Q + K) * s + tab, 0))
    unfused.ops.append(OpTraffic("rope: store q, k", 0, (Q + K) * s))
    if cache:
        unfused.ops.append(OpTraffic("cache write: load k, v; store into the cache", 2 * K * s, 2 * K * s))
    fused = Traffic("fused qk_norm_rope", note="by hand: from the kernel's loads and stores")
    fused.ops.append(OpTraffic("load q, k" + (", v" if cache else "") + ", weights, cos/sin rows",
                               (Q + K + (K if cache else 0)) * s + W + tab, 0))
    fused.ops.append(OpTraffic("store q, k" + (" and k, v into the cache" if cache else ""), 0,
                               (Q + K + (2 * K if cache else 0)) * s))
    return [norm, unfused, fused]
