"""A fresh hostile campaign against ropelab-check, written apart from tests/test_check_hostile.py's corpus (issue
31's "Done when"): GGUF files from gguf-py's own writer for seven architectures, mutated (8-byte overwrites with
extreme values, deletions, insertions, bit flips, doubled, prefixed), special files (a FIFO, /dev/zero, a symlink
loop, a directory, a 3 GiB sparse file), hostile config.json files (BOM, UTF-16, non-object tops, 400-digit ints,
1e400, NaN, 5000-deep text_config, 200000-deep arrays, 10^6 layer types, 3*10^6-long LongRoPE lists, ...), hostile
safetensors headers and odd flags. Each runs `python -m ropelab.engines.check` in a subprocess (60 s timeout) and
is checked for exit in {0, 1, 2}, no traceback, strict JSON with the same exit code; prints the breaks, the
slowest run and the largest child RSS.

    .venv/bin/python scripts/hostile_campaign.py [OUT_DIR]   # inputs under OUT_DIR (default /tmp/hostile/inputs)
"""
import json, os, random, resource, stat, struct, subprocess, sys, time
from pathlib import Path
import numpy as np
import gguf as G

OUT = Path(sys.argv[1] if len(sys.argv) > 1 else "/tmp/hostile/inputs"); OUT.mkdir(parents=True, exist_ok=True)
rng = random.Random(20261202)

def writer_file(path, arch, extra=None):
    w = G.GGUFWriter(str(path), arch)
    w.add_block_count(3); w.add_context_length(128); w.add_embedding_length(64); w.add_head_count(4)
    w.add_head_count_kv(2); w.add_rope_freq_base(5e5); w.add_rope_dimension_count(16)
    if extra: extra(w)
    w.add_tensor("rope_freqs.weight", np.linspace(1, 4, 8, dtype=np.float32))
    w.add_tensor("token_embd.weight", np.zeros((4, 64), dtype=np.float16))
    w.write_header_to_file(); w.write_kv_data_to_file(); w.write_tensors_to_file(); w.close()

bases = {}
def yarn(w):
    w.add_rope_scaling_type(G.RopeScalingType.YARN); w.add_rope_scaling_factor(4.0)
    w.add_rope_scaling_orig_ctx_len(32)
for arch, extra in [("llama", None), ("qwen2", yarn), ("phi3", None), ("gemma3", None), ("deepseek2", None),
                    ("cohere2", None), ("qwen2vl", None)]:
    p = OUT / f"base_{arch}.gguf"
    try:
        writer_file(p, arch, extra); bases[arch] = p.read_bytes()
    except Exception as e:
        print("writer failed", arch, e)

cases = {}
for arch, data in bases.items():
    cases[f"valid_{arch}"] = data
    n = len(data)
    for i in range(8):  # random 8-byte overwrites with extreme values
        b = bytearray(data); off = rng.randrange(0, n - 8)
        b[off:off + 8] = struct.pack("<Q", rng.choice([2**63 - 1, 2**64 - 1, 2**32, 2**31 - 1, 0, 1 << 48, rng.getrandbits(64)]))
        cases[f"{arch}_ow8_{i}"] = bytes(b)
    for i in range(4):  # deletions / insertions in the header area
        b = bytearray(data); off = rng.randrange(4, min(n, 600)); k = rng.randrange(1, 40)
        cases[f"{arch}_del_{i}"] = bytes(b[:off] + b[off + k:])
        cases[f"{arch}_ins_{i}"] = bytes(b[:off] + os.urandom(k) + b[off:])
    for i in range(4):  # random byte flips anywhere
        b = bytearray(data)
        for _ in range(rng.randrange(1, 6)):
            off = rng.randrange(0, n); b[off] ^= 1 << rng.randrange(8)
        cases[f"{arch}_flip_{i}"] = bytes(b)
    cases[f"{arch}_double"] = data + data
    cases[f"{arch}_prefix_junk"] = b"\0" * 7 + data

for name, data in cases.items():
    (OUT / f"{name}.gguf").write_bytes(data)

# special files
special = []
fifo = OUT / "fifo.gguf"
if not fifo.exists(): os.mkfifo(fifo)
special.append(fifo)
z = OUT / "zero.gguf"
if not z.exists(): os.symlink("/dev/zero", z)
special.append(z)
loop = OUT / "loop.gguf"
if not loop.is_symlink(): os.symlink(loop, loop)
special.append(loop)
d = OUT / "dir.gguf"; d.mkdir(exist_ok=True); special.append(d)
sparse = OUT / "sparse.gguf"
with open(sparse, "wb") as f: f.write(bases["llama"][:200]); f.truncate(3 * 2**30)
special.append(sparse)

# configs
cfg_dir = OUT / "cfg"; cfg_dir.mkdir(exist_ok=True)
base = {"model_type": "llama", "num_hidden_layers": 2, "hidden_size": 64, "num_attention_heads": 4,
        "max_position_embeddings": 128, "rope_theta": 1e4}
cfgs = {
    "bom": "\ufeff" + json.dumps(base),
    "utf16": None,
    "top_list": json.dumps([base]),
    "top_string": json.dumps("llama"),
    "top_null": "null",
    "big_int_400": json.dumps(base)[:-1] + ', "rope_theta": ' + "9" * 400 + "}",
    "float_1e400": json.dumps(base)[:-1] + ', "rope_theta": 1e400}',
    "nan_literal": json.dumps(base)[:-1] + ', "rope_theta": NaN}',
    "neg_inf_layers": json.dumps(base)[:-1] + ', "num_hidden_layers": -Infinity}',
    "dup_keys": json.dumps(base)[:-1] + ', "num_hidden_layers": "two"}',
    "deep_text_config": '{"model_type": "llava", "text_config": ' * 5000 + "{}" + "}" * 5000,
    "deep_array": json.dumps(base)[:-1] + ', "layer_types": ' + "[" * 200000 + "]" * 200000 + "}",
    "layer_types_1e6": json.dumps({**base, "num_hidden_layers": 2, "layer_types": ["full_attention"] * 10**6}),
    "rope_params_nested_junk": json.dumps({**base, "rope_parameters": {"full_attention": {"rope_type": {"x": 1}}}}),
    "rope_scaling_list": json.dumps({**base, "rope_scaling": [1, 2]}),
    "yarn_factor_str": json.dumps({**base, "rope_scaling": {"rope_type": "yarn", "factor": "4"}}),
    "yarn_factor_huge": json.dumps({**base, "rope_scaling": {"rope_type": "yarn", "factor": 1e308,
                                                              "original_max_position_embeddings": 64}}),
    "longrope_long": json.dumps({**base, "model_type": "phi3", "rope_scaling": {"rope_type": "longrope",
        "short_factor": [1.0] * 3 * 10**6, "long_factor": [1.0] * 3 * 10**6, "original_max_position_embeddings": 64}}),
    "mrope_negative": json.dumps({**base, "model_type": "qwen2_vl", "rope_scaling": {"rope_type": "default",
                                   "mrope_section": [-4, 8, 4]}}),
    "model_type_unicode": json.dumps({**base, "model_type": "llama\u202e\u0000"}),
    "model_type_long": json.dumps({**base, "model_type": "x" * 10**6}),
    "head_dim_neg": json.dumps({**base, "head_dim": -16}),
    "heads_float": json.dumps({**base, "num_attention_heads": 4.0}),
    "max_pos_huge": json.dumps({**base, "max_position_embeddings": 2**62}),
    "partial_zero": json.dumps({**base, "model_type": "phi", "partial_rotary_factor": 0.0}),
    "theta_zero": json.dumps({**base, "rope_theta": 0}),
    "theta_negative": json.dumps({**base, "rope_theta": -1e4}),
    "theta_one": json.dumps({**base, "rope_theta": 1}),
    "empty_obj": "{}",
    "empty_file": "",
    "invalid_utf8": b"\xff\xfe\xfd{",
}
paths = []
for name, text in cfgs.items():
    p = cfg_dir / f"{name}.json"
    if name == "utf16":
        p.write_bytes(json.dumps(base).encode("utf-16"))
    elif isinstance(text, bytes):
        p.write_bytes(text)
    else:
        p.write_text(text)
    paths.append(p)
# a model dir with hostile safetensors header
md = OUT / "mlxdir"; md.mkdir(exist_ok=True)
(md / "config.json").write_text(json.dumps(base))
(md / "model.safetensors").write_bytes(struct.pack("<Q", 2**63 - 5) + b"{}")
md2 = OUT / "mlxdir2"; md2.mkdir(exist_ok=True)
(md2 / "config.json").write_text(json.dumps(base))
hdr = json.dumps({"w": {"dtype": "F32", "shape": [2**40, 2**40], "data_offsets": [0, 2**62]}}).encode()
(md2 / "model.safetensors").write_bytes(struct.pack("<Q", len(hdr)) + hdr)
md3 = OUT / "cfgdir_is_dir"; md3.mkdir(exist_ok=True); (md3 / "config.json").mkdir(exist_ok=True)

runs = [[str(OUT / f"{n}.gguf")] for n in cases] + [[str(p)] for p in special] + [[str(p)] for p in paths]
runs += [[str(md)], [str(md2)], [str(md3)], ["mlx:" + str(md)], ["hf:" + str(OUT / "base_llama.gguf")],
         ["gguf:" + str(cfg_dir / "bom.json")], ["hf:"], ["gguf:"], ["mlx:"], [""], ["-"], ["--", "-x"],
         [str(OUT / "base_llama.gguf"), str(cfg_dir / "empty_obj.json")] ,
         [str(OUT / "base_llama.gguf")] * 200,
         [str(OUT / "base_llama.gguf"), "--position", "nan"], [str(OUT / "base_llama.gguf"), "--position", "-0"],
         [str(OUT / "base_llama.gguf"), "--position", "0x10"], [str(OUT / "base_llama.gguf"), "--samples", "1e3"],
         [str(OUT / "base_llama.gguf"), "--heads", "٣"], [str(OUT / "base_llama.gguf"), "--seed", "-1"],
         [str(OUT / "base_llama.gguf"), "--write-config", "/proc/x/y"],
         [str(OUT / "base_llama.gguf"), "--write-config", str(OUT / "dir.gguf")],
         [str(OUT / "base_qwen2.gguf"), "--write-config", "/dev/full"],
         [str(OUT / "base_llama.gguf"), "--position", "9007199254740993"]]

bad = []
maxrss = 0; maxt = 0
for args in runs:
    for js in ((True,) if args[0].endswith('.gguf') and '_' in Path(args[0]).stem and not Path(args[0]).stem.startswith(('valid','base')) else (False, True)):
        argv = [sys.executable, "-m", "ropelab.engines.check", *args] + (["--json"] if js else [])
        t0 = time.time()
        try:
            p = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL)
            out, err = p.communicate(timeout=60)
            code = p.returncode
        except subprocess.TimeoutExpired:
            p.kill(); out, err = p.communicate(); code = "TIMEOUT"
        dt = time.time() - t0; maxt = max(maxt, dt)
        rss = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
        maxrss = max(maxrss, rss)
        o, e = out.decode("utf-8", "replace"), err.decode("utf-8", "replace")
        problem = None
        if code not in (0, 1, 2): problem = f"exit {code}"
        elif "Traceback" in o + e: problem = "traceback"
        elif js:
            try:
                doc = json.loads(o, parse_constant=lambda c: (_ for _ in ()).throw(ValueError(c)))
                if doc.get("exit_code") != code: problem = f"json exit {doc.get('exit_code')} != {code}"
            except Exception as ex:
                if code != 2 or o.strip():
                    problem = f"json: {ex}"
        if problem:
            bad.append((args[:2], js, problem, (e or o)[-300:]))
print(f"runs {2 * len(runs)}; breaks {len(bad)}; max wall {maxt:.1f} s; max child RSS {maxrss:.0f} MiB")
for b in bad: print(b)
