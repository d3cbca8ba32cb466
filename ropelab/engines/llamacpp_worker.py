"""The child process of :mod:`ropelab.engines.llamacpp_run`: one llama.cpp run, isolated (an abort in llama.cpp
ends this process, not the caller's).

Run as a script (``python -I llamacpp_worker.py``), it imports only numpy and llama-cpp-py-sync's CFFI declarations:
no ropelab, no torch. It reads one JSON request on stdin (``path``, ``tokens``, ``n_ctx``, ``n_threads``,
``lib_dir``, ``out``, ``version``, ``shim``, ``max_logits``), loads the model, allocates the context, decodes the
tokens in one batch, saves every position's float32 logits to ``out`` (``.npy``) and prints one JSON line: the
model's numbers as llama.cpp reports them, or ``{"error": ...}``. Exit 0, 1 (an error), or 3 (llama.cpp refused
the file or the context).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np

EXIT_REFUSED = 3


def _worker(request: dict) -> int:
    """Runs in the child: load, allocate, decode, write the logits; prints one JSON status line on stdout."""
    import ctypes

    lib_dir = Path(request["lib_dir"])
    shim = lib_dir / request["shim"]
    if shim.is_file():
        ctypes.CDLL(str(shim), mode=ctypes.RTLD_GLOBAL)
    from llama_cpp_py_sync._cffi_bindings import get_ffi
    from llama_cpp_py_sync._version import __version__

    if __version__ != request["version"]:
        print(json.dumps({"error": f"llama-cpp-py-sync {__version__} is installed, "
                                   f"{request['version']} is pinned: `pip install "
                                   f"llama-cpp-py-sync=={request['version']}`."}))
        return 1
    ffi = get_ffi()
    try:
        lib = ffi.dlopen(str(lib_dir / "libllama.so"))
    except OSError as e:
        print(json.dumps({"error": f"cannot load {lib_dir / 'libllama.so'}: {e}"}))
        return 1
    lib.llama_backend_init()
    mparams = lib.llama_model_default_params()
    mparams.n_gpu_layers = 0
    model = lib.llama_model_load_from_file(request["path"].encode(), mparams)
    if model == ffi.NULL:
        print(json.dumps({"error": "llama_model_load_from_file returned NULL"}), flush=True)
        return EXIT_REFUSED
    tokens = request["tokens"]
    n = len(tokens)
    n_ctx = request["n_ctx"] or int(lib.llama_model_n_ctx_train(model))  # 0: llama.cpp's default, n_ctx_train
    if not max(n, 1) <= n_ctx <= request["max_ctx"]:
        print(json.dumps({"error": f"a context of {n_ctx} tokens (the file's context_length when n_ctx is 0) must "
                                   f"lie in [{max(n, 1)}, {request['max_ctx']}]; pass n_ctx."}), flush=True)
        lib.llama_model_free(model)
        return 1
    cparams = lib.llama_context_default_params()
    cparams.n_ctx = n_ctx
    cparams.n_batch = cparams.n_ubatch = max(n, 1)
    cparams.n_seq_max = 1
    cparams.n_threads = cparams.n_threads_batch = request["n_threads"]
    cparams.flash_attn_type = lib.LLAMA_FLASH_ATTN_TYPE_DISABLED
    cparams.type_k = cparams.type_v = lib.GGML_TYPE_F32
    cparams.no_perf = True
    records: list = []
    if request.get("record") and tokens:
        callback = _recorder(ffi, lib_dir, records)  # kept alive until the context is freed
        cparams.cb_eval = callback
    ctx = lib.llama_init_from_model(model, cparams)
    if ctx == ffi.NULL:
        print(json.dumps({"error": "llama_init_from_model returned NULL (the context could not be made)"}))
        lib.llama_model_free(model)
        return EXIT_REFUSED
    vocab = lib.llama_model_get_vocab(model)
    n_vocab = lib.llama_vocab_n_tokens(vocab)
    info = {"n_ctx": int(lib.llama_n_ctx(ctx)), "n_ctx_train": int(lib.llama_model_n_ctx_train(model)),
            "n_layer": int(lib.llama_model_n_layer(model)), "n_embd": int(lib.llama_model_n_embd(model)),
            "n_head": int(lib.llama_model_n_head(model)), "n_head_kv": int(lib.llama_model_n_head_kv(model)),
            "n_swa": int(lib.llama_model_n_swa(model)), "rope_type": int(lib.llama_model_rope_type(model)),
            "rope_freq_scale_train": float(lib.llama_model_rope_freq_scale_train(model)), "n_vocab": int(n_vocab)}
    status = 0
    if n:
        bad = [t for t in tokens if not 0 <= t < n_vocab]
        if bad or n * n_vocab > request["max_logits"]:
            info["error"] = (f"tokens must lie in [0, n_vocab = {n_vocab}), got {bad[:5]}" if bad
                             else f"{n} x {n_vocab} logits exceed {request['max_logits']}")
            status = 1
        else:
            batch = lib.llama_batch_init(n, 0, 1)
            try:
                for i, t in enumerate(tokens):
                    batch.token[i] = t
                    batch.pos[i] = i
                    batch.n_seq_id[i] = 1
                    batch.seq_id[i][0] = 0
                    batch.logits[i] = 1
                batch.n_tokens = n
                rc = lib.llama_decode(ctx, batch)
                if rc != 0:
                    info["error"] = f"llama_decode returned {rc}"
                    status = 1
                else:
                    out = np.empty((n, n_vocab), np.float32)
                    for i in range(n):
                        row = lib.llama_get_logits_ith(ctx, i)
                        if row == ffi.NULL:
                            raise RuntimeError(f"llama_get_logits_ith({i}) returned NULL")
                        out[i] = np.frombuffer(ffi.buffer(row, 4 * n_vocab), np.float32)
                    np.save(request["out"], out)
                    if request.get("record"):
                        np.savez(request["record"], **{f"{i}:{name}:{op}": a for i, (name, op, a) in
                                                        enumerate(records)})
            finally:
                lib.llama_batch_free(batch)
    lib.llama_free(ctx)
    lib.llama_model_free(model)
    print(json.dumps(info), flush=True)
    return status


# The head of ggml's struct ggml_tensor (ggml/include/ggml.h): its type, buffer, sizes ne and strides nb, in that
# order since ggml's first releases; the rest of the struct is not read.
_TENSOR_HEAD = """
struct ropelab_tensor_head { int type; void * buffer; int64_t ne[4]; size_t nb[4]; };
const char * ggml_get_name(const void * tensor);
const char * ggml_op_desc(const void * tensor);
size_t ggml_nbytes(const void * tensor);
bool ggml_is_contiguous(const void * tensor);
void ggml_backend_tensor_get(const void * tensor, void * data, size_t offset, size_t size);
"""


def _recorder(ffi, lib_dir: Path, records: list):
    """A ``cb_eval`` (ggml_backend_sched_eval_callback) that asks for every tensor named ``Qcur...-<layer>`` or
    ``Kcur...-<layer>`` (llama.cpp's graph names q and k so after each step: projection, reshape, a q/k norm as
    ``Qcur_normed``, RoPE) and appends
    ``(name, op, float32 array (ne[3], ne[2], ne[1], ne[0]))`` of each as it is computed."""
    from cffi import FFI

    gffi = FFI()
    gffi.cdef(_TENSOR_HEAD)
    g = gffi.dlopen(str(lib_dir / "libggml-base.so.0"))

    def cb(tensor, ask, _user):
        t = gffi.cast("void *", int(ffi.cast("uintptr_t", tensor)))
        name = gffi.string(g.ggml_get_name(t)).decode(errors="replace")
        wanted = name.startswith(("Qcur", "Kcur"))  # Qcur-<il>, and steps between such as Qcur_normed-<il>
        if ask:
            return wanted
        if wanted:
            head = gffi.cast("struct ropelab_tensor_head *", t)
            if head.type == 0 and g.ggml_is_contiguous(t):  # GGML_TYPE_F32, laid out densely
                n = g.ggml_nbytes(t)
                data = np.empty(n // 4, np.float32)
                g.ggml_backend_tensor_get(t, gffi.from_buffer(data), 0, n)
                shape = tuple(int(head.ne[i]) for i in (3, 2, 1, 0))
                records.append((name, gffi.string(g.ggml_op_desc(t)).decode(errors="replace"), data.reshape(shape)))
        return True

    return ffi.callback("ggml_backend_sched_eval_callback", cb)


def _main() -> int:
    try:
        request = json.loads(sys.stdin.read())
        return _worker(request)
    except Exception as e:  # the parent reads this line; a traceback would only say the same less clearly
        print(json.dumps({"error": f"{type(e).__name__}: {e}"}), flush=True)
        return 1


if __name__ == "__main__":
    sys.exit(_main())
