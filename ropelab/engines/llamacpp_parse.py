r"""Parse llama.cpp's own source into the per-architecture RoPE table :mod:`ropelab.engines.llamacpp_table`.

``python -m ropelab.engines.llamacpp_table --source DIR`` (DIR: a llama.cpp checkout, or the llama-cpp-python
sdist whose ``vendor/llama.cpp`` holds one) runs :func:`parse` and writes the module. Read from:

- ``src/llama-arch.cpp``: ``LLM_ARCH_NAMES`` (enum -> the ``general.architecture`` string) and ``LLM_KV_NAMES``
  (the ``{arch}.rope.*`` key names);
- ``src/llama-model.cpp``: ``llama_model_rope_type`` (the rope type each architecture implies; a case returning
  ``use_mrope() ? A : B`` becomes ``{"sections": A, "else": B}``, any other computed return ``None``), and the
  factory switch (``case LLM_ARCH_X: return new llama_model_x``) that names each architecture's class;
- ``src/models/*.cpp``: each class's graph's ``const bool use_rope = ...;``, else the condition of an
  ``if (...)`` that alone holds the graph's ``ggml_rope_ext`` calls (cohere2's ``if (is_swa)``) (the layers without
  RoPE, translated to
  Python over il, n_layer, the no-rope step and the sliding-window flags, or None), and its ``load_arch_hparams``:
  ``n_no_rope_layer_step``, the rope keys it reads (``LLM_KV_ROPE_*``), its
  sliding-window layer pattern (``load_swa_pattern(ml, n[, dense_first])`` / ``set_swa_pattern(n)``) and what
  its sliding-window layers inherit (``rope_freq_base_train_swa = hparams.rope_freq_base_train`` and the scale);
  the defaults are ``src/llama-hparams.h``'s;
- ``conversion/*.py`` (the converter's model classes): which registered Hugging Face architectures permute q/k
  (a ``permute`` / ``_reverse_hf_permute`` call reached from ``modify_tensors``, honouring ``undo_permute``).
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

__all__ = ["ROPE_TYPE_NAMES", "llama_cpp_dir", "commit_of", "parse", "render", "source_label", "main"]

ROPE_TYPE_NAMES = ("NONE", "NORM", "NEOX", "MROPE", "IMROPE", "VISION")


def llama_cpp_dir(source: str | Path) -> Path:
    """The llama.cpp tree in ``source``: itself, or ``vendor/llama.cpp`` inside a llama-cpp-python sdist."""
    source = Path(source)
    for cand in (source, source / "vendor" / "llama.cpp"):
        if (cand / "src" / "llama-model.cpp").is_file() and (cand / "conversion").is_dir():
            return cand
    raise FileNotFoundError(f"{source} holds no llama.cpp tree (src/llama-model.cpp and conversion/); pass a "
                            "llama.cpp checkout or the extracted llama-cpp-python sdist.")


def commit_of(source: str | Path) -> str | None:
    """The llama.cpp commit: the sdist ships its submodule's git dir (``.git/modules/vendor/llama.cpp/HEAD``);
    a checkout has ``.git/HEAD`` (a hash or a ref)."""
    source = Path(source)
    for head in (source / ".git" / "modules" / "vendor" / "llama.cpp" / "HEAD", source / ".git" / "HEAD"):
        if head.is_file():
            text = head.read_text().strip()
            if text.startswith("ref: "):
                ref = head.parent / text[5:]
                text = ref.read_text().strip() if ref.is_file() else text
            if re.fullmatch(r"[0-9a-f]{40}", text):
                return text
    return None


def _strip_comments(src: str) -> str:
    src = re.sub(r"/\*.*?\*/", "", src, flags=re.S)
    return re.sub(r"//[^\n]*", "", src)


def _function_body(src: str, signature: str) -> str | None:
    i = src.find(signature)
    if i < 0:
        return None
    j = src.index("{", i)
    depth = 0
    for k in range(j, len(src)):
        depth += {"{": 1, "}": -1}.get(src[k], 0)
        if depth == 0:
            return src[j + 1:k]
    raise ValueError(f"unbalanced braces after {signature!r}")


def parse_arch_names(src: str) -> dict[str, str]:
    body = src[src.index("LLM_ARCH_NAMES"):]
    body = body[:body.index("};")]
    return dict(re.findall(r"\{\s*(LLM_ARCH_\w+)\s*,\s*\"([^\"]+)\"\s*\}", body))


def parse_kv_names(src: str) -> dict[str, str]:
    body = src[src.index("LLM_KV_NAMES"):]
    body = body[:body.index("};")]
    return {k: v for k, v in re.findall(r"\{\s*(LLM_KV_\w+)\s*,\s*\"([^\"]+)\"\s*\}", body)
            if k.startswith(("LLM_KV_ROPE_", "LLM_KV_ATTENTION_SLIDING_WINDOW", "LLM_KV_ATTENTION_ROPE_PATTERN",
                             "LLM_KV_ATTENTION_KEY_LENGTH",
                             "LLM_KV_CONTEXT_LENGTH", "LLM_KV_ATTENTION_HEAD_COUNT", "LLM_KV_EMBEDDING_LENGTH",
                             "LLM_KV_BLOCK_COUNT"))}


def parse_rope_types(src: str) -> dict[str, object]:
    """{LLM_ARCH_X: "NORM" | ... | {"sections": A, "else": B} | None} from ``llama_model_rope_type``."""
    body = _strip_comments(_function_body(src, "llama_rope_type llama_model_rope_type(") or "")
    out: dict[str, object] = {}
    pending: list[str] = []
    # Split into case labels and the statements up to the next label.
    for m in re.finditer(r"case\s+(LLM_ARCH_\w+)\s*:|((?:(?!case\s+LLM_ARCH_)[^;{}])+;|\{|\})", body):
        if m.group(1):
            pending.append(m.group(1))
            continue
        stmt = m.group(2)
        if stmt is None or not pending:
            continue
        stmt = stmt.strip()
        simple = re.fullmatch(r"return\s+LLAMA_ROPE_TYPE_(\w+)\s*;", stmt)
        cond = re.fullmatch(r"return\s+model->hparams\.use_mrope\(\)\s*\?\s*LLAMA_ROPE_TYPE_(\w+)\s*:\s*"
                            r"LLAMA_ROPE_TYPE_(\w+)\s*;", stmt)
        if simple:
            value: object = simple.group(1)
        elif cond:
            value = {"sections": cond.group(1), "else": cond.group(2)}
        elif stmt.startswith("return"):
            value = None  # computed from other hparams: not modelled
        else:
            continue  # an if (...) before the final return: the case's value is computed
        for arch in pending:
            out[arch] = None if (arch in out and out[arch] is None) else value
        if not simple and not cond:
            for arch in pending:
                out[arch] = None
        pending = [] if stmt.startswith("return") else pending
    # A case whose body had an `if` before its last return: mark it computed.
    for m in re.finditer(r"((?:case\s+LLM_ARCH_\w+\s*:\s*)+)([^c]*?\bif\s*\()", body):
        seg = m.group(2)
        if "return" not in seg.split("if", 1)[0]:
            for arch in re.findall(r"LLM_ARCH_\w+", m.group(1)):
                out[arch] = None
    out.pop("LLM_ARCH_UNKNOWN", None)
    return out


def parse_classes(src: str) -> dict[str, str]:
    """{LLM_ARCH_X: llama_model_class} from the factory switch in llama-model.cpp."""
    return dict(re.findall(r"case\s+(LLM_ARCH_\w+)\s*:\s*return\s+new\s+(llama_model_\w+)\s*\(", src))


def _number(text: str) -> float | None:
    m = re.fullmatch(r"\s*([0-9.]+)f?\s*", text)
    return float(m.group(1)) if m else None


def _use_rope_py(expr: str) -> str | None:
    """A graph's ``const bool use_rope = <expr>;`` (C++) as a Python expression over ``il``, ``n_layer``, ``step``
    (``n_no_rope_layer_step``), ``swa`` (per-layer flags) and ``rope_pattern``; None if it uses anything else."""
    py = " ".join(expr.split())
    for a, b in (("hparams.is_swa(il)", "swa[il]"), ("hparams.swa_type == LLAMA_SWA_TYPE_NONE", "(not any(swa))"),
                 ("hparams.n_no_rope_layer_step", "step"), ("hparams.has_rope(il)", "rope_pattern[il]"),
                 ("hparams.n_layer()", "n_layer"), ("&&", " and "), ("||", " or "), ("!=", " NE "), ("!", " not "),
                 (" NE ", " != ")):
        py = py.replace(a, b)
    names = set(re.findall(r"[A-Za-z_]\w*", py))
    if not names <= {"swa", "il", "step", "n_layer", "rope_pattern", "not", "and", "or", "any"}:
        return None
    if re.search(r"[^\w\s()\[\]+%<>=!-]", py):
        return None
    return " ".join(py.split())


def _rope_guard(src: str) -> str | None:
    """The condition of the ``if (<cond>) { ... }`` blocks without an ``else`` that hold *every* ``ggml_rope_ext``
    call of a graph (cohere2's ``if (is_swa)``: the other layers get no RoPE), with the file's
    ``const bool <name> = <expr>;`` locals substituted; None when a RoPE call lies outside such blocks (an
    indexer's guarded RoPE beside the main one, dots3note's) or the blocks' conditions differ."""
    local = dict(re.findall(r"const\s+bool\s+(\w+)\s*=\s*([^;]+);", src))
    calls = [m.start() for m in re.finditer(r"\bggml_rope_ext\s*\(", src)]
    if not calls:
        return None
    blocks = []  # (start, end, condition) of each `if (...) { ... }` without an else
    for m in re.finditer(r"\bif\s*\(", src):
        depth, k = 1, m.end()
        while depth and k < len(src):
            depth += {"(": 1, ")": -1}.get(src[k], 0)
            k += 1
        cond = " ".join(src[m.end():k - 1].split())
        j = k + len(src[k:]) - len(src[k:].lstrip())
        if j >= len(src) or src[j] != "{":
            continue
        body = _function_body(src[j:], "")
        end = j + len(body) + 2
        if not src[end:].lstrip().startswith("else"):
            blocks.append((j, end, cond))
    conds = set()
    for c in calls:
        inside = [b for b in blocks if b[0] < c < b[1]]
        if not inside:
            return None
        conds.add(inside[-1][2])  # the innermost block around the call
    if len(conds) != 1:
        return None
    (cond,) = conds
    return " ".join(re.sub(r"\b(\w+)\b", lambda w: f"({local[w.group(1)].strip()})" if w.group(1) in local
                           else w.group(1), cond).split())


def parse_hparams(llama_dir: Path) -> dict[str, dict]:
    """{llama_model_class: {reads, swa_pattern, swa_base, swa_scale, no_rope_step, use_rope}} from each class's
    load_arch_hparams and its graph's ``use_rope`` (the layers that skip RoPE) in the same file."""
    models = llama_dir / "src" / "models"
    header = (models / "models.h").read_text() if (models / "models.h").is_file() else ""
    bases = dict(re.findall(r"struct\s+(llama_model_\w+)\s*:\s*public\s+(llama_model_\w+)", header))
    files = {p.name: _strip_comments(p.read_text()) for p in sorted(models.glob("*.cpp"))}
    text = "\n".join(files.values())
    file_of = {cls: name for name, src in files.items()
               for cls in re.findall(r"void\s+(llama_model_\w+)::load_arch_hparams\(", src)}
    out: dict[str, dict] = {}
    empty = {"reads": [], "swa_pattern": None, "swa_base": "default", "swa_scale": "default",
             "no_rope_step": None, "use_rope": None}

    def info(cls: str) -> dict:
        if cls in out:
            return out[cls]
        body = _function_body(text, f"void {cls}::load_arch_hparams(")
        if body is None:
            parent = bases.get(cls)
            out[cls] = dict(info(parent)) if parent and parent != "llama_model_base" else dict(empty)
            return out[cls]
        d: dict = {"reads": sorted(set(re.findall(r"LLM_KV_ROPE_\w+", body)))}
        m = re.search(r"load_swa_pattern\(\s*ml\s*,\s*([^,)]+)(?:,\s*(\w+))?\)", body) or \
            re.search(r"set_swa_pattern\(\s*([^,)]+)(?:,\s*(\w+))?\)", body)
        if m:
            n = m.group(1).strip()
            d["swa_pattern"] = {"n": int(n) if n.isdigit() else None, "expr": n,
                                "dense_first": (m.group(2) or "false") == "true",
                                "key": "load_swa_pattern" in m.group(0)}
        else:
            d["swa_pattern"] = None
        for name, key in (("swa_base", "rope_freq_base_train"), ("swa_scale", "rope_freq_scale_train")):
            m = re.search(rf"hparams\.{key}_swa\s*=\s*([^;]+);", body)
            if m is None:
                d[name] = "default"
            elif m.group(1).strip() == f"hparams.{key}":
                d[name] = "inherit"
            else:
                d[name] = _number(m.group(1))
        # n_no_rope_layer_step: a number, or "n_layer" (llama4, smallthinker set it in their no-SWA branch).
        m = re.search(r"hparams\.n_no_rope_layer_step\s*=\s*([^;]+);", body)
        d["no_rope_step"] = None if m is None else (
            "n_layer" if m.group(1).strip() == "hparams.n_layer()" else _number(m.group(1)))
        m = re.search(r"const\s+bool\s+use_rope\s*=\s*([^;]+);", files[file_of[cls]])
        d["use_rope"] = None if m is None else {"cpp": " ".join(m.group(1).split()), "py": _use_rope_py(m.group(1))}
        if d["use_rope"] is None:
            # Only a guard over the per-layer flags ropelab models (an `if (n_head > 0)` around a whole attention
            # block, deci's, says nothing about RoPE): anything else stays "every layer rotates", as before.
            guard = _rope_guard(files[file_of[cls]])
            py = None if guard is None else _use_rope_py(guard)
            d["use_rope"] = None if py is None else {"cpp": guard, "py": py}
        out[cls] = d
        return d

    for cls in set(file_of) | set(bases):
        info(cls)
    return out


def parse_hparam_defaults(llama_dir: Path) -> dict[str, float]:
    src = _strip_comments((llama_dir / "src" / "llama-hparams.h").read_text())
    out = {}
    for name in ("rope_freq_base_train_swa", "rope_freq_scale_train_swa", "rope_attn_factor", "rope_yarn_log_mul",
                 "n_no_rope_layer_step",
                 "yarn_ext_factor", "yarn_attn_factor", "yarn_beta_fast", "yarn_beta_slow"):
        m = re.search(rf"\b{name}\s*=\s*(-?[0-9.]+)f?\s*;", src)
        if m:
            out[name] = float(m.group(1))
    return out


# ---------------------------------------------------------------------------------------------------------------
# The converter (Python): which Hugging Face architectures permute q/k


class _Cls:
    def __init__(self, node: ast.ClassDef):
        self.name = node.name
        self.bases = [b.id if isinstance(b, ast.Name) else b.attr if isinstance(b, ast.Attribute) else ""
                      for b in node.bases]
        self.attrs: dict[str, object] = {}
        self.registered: list[str] = []
        self.methods = {n.name: n for n in node.body if isinstance(n, ast.FunctionDef)}
        for n in node.body:
            if isinstance(n, ast.Assign) and len(n.targets) == 1 and isinstance(n.targets[0], ast.Name):
                self.attrs[n.targets[0].id] = n.value
        for dec in node.decorator_list:
            if isinstance(dec, ast.Call) and isinstance(dec.func, ast.Attribute) and dec.func.attr == "register":
                self.registered += [a.value for a in dec.args if isinstance(a, ast.Constant)]


def _permute_calls(fn: ast.FunctionDef, classes: set[str]) -> tuple[bool, bool, bool]:
    """(calls permute unguarded, calls permute under `if self.undo_permute`, calls super().modify_tensors)."""
    plain = guarded = sup = False

    def visit(node: ast.AST, under: bool) -> None:
        nonlocal plain, guarded, sup
        if isinstance(node, ast.If) and "undo_permute" in ast.unparse(node.test):
            for n in node.body:
                visit(n, True)
            for n in node.orelse:
                visit(n, under)
            return
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            f = node.func
            owner = f.value
            if f.attr in ("permute", "_reverse_hf_permute") and (
                    isinstance(owner, ast.Name) and (owner.id == "self" or owner.id in classes)):
                if under:
                    guarded = True
                else:
                    plain = True
            if f.attr == "modify_tensors" and (
                    (isinstance(owner, ast.Call) and isinstance(owner.func, ast.Name) and owner.func.id == "super")
                    or (isinstance(owner, ast.Name) and owner.id in classes)):
                sup = True
        for child in ast.iter_child_nodes(node):
            visit(child, under)

    visit(fn, False)
    return plain, guarded, sup


def parse_converter(llama_dir: Path) -> dict[str, dict[str, bool]]:
    """{GGUF arch enum name (MODEL_ARCH.X): {registered HF architecture: permutes q/k}}."""
    classes: dict[str, _Cls] = {}
    for p in sorted((llama_dir / "conversion").glob("*.py")):
        for node in ast.walk(ast.parse(p.read_text())):
            if isinstance(node, ast.ClassDef):
                classes[node.name] = _Cls(node)
    names = set(classes)

    def mro(name: str) -> list[_Cls]:
        out, todo = [], [name]
        while todo:
            n = todo.pop(0)
            if n in classes and classes[n] not in out:
                out.append(classes[n])
                todo[:0] = classes[n].bases
        return out

    def attr(chain: list[_Cls], key: str):
        for c in chain:
            if key in c.attrs:
                return c.attrs[key]
        return None

    result: dict[str, dict[str, bool]] = {}
    for c in classes.values():
        if not c.registered:
            continue
        chain = mro(c.name)
        arch = attr(chain, "model_arch")
        if not (isinstance(arch, ast.Attribute) and "MODEL_ARCH" in ast.unparse(arch)):
            continue
        undo = attr(chain, "undo_permute")
        undo_true = isinstance(undo, ast.Constant) and undo.value is True
        permutes = False
        for k in chain:  # follow modify_tensors down the chain while each override calls its parent's
            fn = k.methods.get("modify_tensors")
            if fn is None:
                continue
            plain, guarded, sup = _permute_calls(fn, names)
            if plain or (guarded and undo_true):
                permutes = True
                break
            if not sup:
                break
        entry = result.setdefault(arch.attr, {})
        for hf in c.registered:
            entry[hf] = permutes
    return result


def parse_gguf_arch_names(llama_dir: Path) -> dict[str, str]:
    """{MODEL_ARCH.X name: GGUF arch string} from gguf-py's constants (MODEL_ARCH_NAMES)."""
    src = (llama_dir / "gguf-py" / "gguf" / "constants.py").read_text()
    body = src[src.index("MODEL_ARCH_NAMES"):]
    body = body[:body.index("}")]
    return dict(re.findall(r"MODEL_ARCH\.(\w+)\s*:\s*\"([^\"]+)\"", body))


def parse(source: str | Path) -> dict:
    """Everything the table holds, from the llama.cpp tree in ``source``."""
    d = llama_cpp_dir(source)
    arch_src = (d / "src" / "llama-arch.cpp").read_text()
    model_src = (d / "src" / "llama-model.cpp").read_text()
    names = parse_arch_names(arch_src)
    rope_types = parse_rope_types(model_src)
    cls_of = parse_classes(model_src)
    hp = parse_hparams(d)
    conv = parse_converter(d)
    gguf_names = parse_gguf_arch_names(d)
    archs = {}
    for enum, name in names.items():
        if enum not in rope_types:
            continue
        cls = cls_of.get(enum)
        h = hp.get(cls, {"reads": [], "swa_pattern": None, "swa_base": "default", "swa_scale": "default",
                         "no_rope_step": None, "use_rope": None})
        hf = {}
        for model_arch, gname in gguf_names.items():
            if gname == name and model_arch in conv:
                hf.update(conv[model_arch])
        archs[name] = {"rope_type": rope_types[enum], "class": cls, **h,
                       "converter": dict(sorted(hf.items()))}
    return {"commit": commit_of(source) or commit_of(d), "archs": dict(sorted(archs.items())),
            "keys": {k: v for k, v in sorted(parse_kv_names(arch_src).items())},
            "defaults": parse_hparam_defaults(d)}


def render(table: dict, source_label: str) -> str:
    """The text of ``ropelab/engines/llamacpp_table.py`` for ``table`` (from :func:`parse`)."""
    import pprint

    lines = [
        '"""llama.cpp\'s RoPE conventions per GGUF architecture. GENERATED: do not edit by hand.',
        "",
        "Regenerate with ``python -m ropelab.engines.llamacpp_table --source DIR`` (ropelab.engines.llamacpp_parse",
        "documents what is read from which file). Read from llama.cpp commit",
        f"{table['commit']} ({source_label}):",
        "",
        "- ARCHS[arch]['rope_type']: src/llama-model.cpp, llama_model_rope_type ({'sections': A, 'else': B} when it",
        "  depends on rope.dimension_sections; None when computed from other hparams);",
        "- ARCHS[arch]['class'], 'reads', 'swa_pattern', 'swa_base', 'swa_scale': the factory switch in",
        "  src/llama-model.cpp and the class's load_arch_hparams in src/models/*.cpp;",
        "- ARCHS[arch]['converter']: {Hugging Face architecture: the converter permutes q/k} (conversion/*.py);",
        "- KEYS: src/llama-arch.cpp LLM_KV_NAMES; DEFAULTS: src/llama-hparams.h.",
        '"""',
        "",
        f"LLAMA_CPP_COMMIT = {table['commit']!r}",
        f"SOURCE = {source_label!r}",
        "",
        "KEYS = " + pprint.pformat(table["keys"], width=116, sort_dicts=True),
        "",
        "DEFAULTS = " + pprint.pformat(table["defaults"], width=116, sort_dicts=True),
        "",
        "ARCHS = " + pprint.pformat(table["archs"], width=116, sort_dicts=True),
        "",
        "",
        "def main(argv=None) -> int:",
        '    """``python -m ropelab.engines.llamacpp_table --source DIR``: regenerate this module."""',
        "    from .llamacpp_parse import main as _main",
        "",
        "    return _main(argv)",
        "",
        "",
        'if __name__ == "__main__":',
        "    raise SystemExit(main())",
        "",
    ]
    return "\n".join(lines)


def source_label(source: str | Path) -> str:
    """A citation for ``source``: the llama-cpp-python sdist's name and version (PKG-INFO), else the path."""
    source = Path(source)
    info = source / "PKG-INFO"
    if info.is_file():
        m = re.search(r"^Version:\s*(\S+)", info.read_text(), flags=re.M)
        if m:
            return f"llama-cpp-python {m.group(1)} sdist, vendor/llama.cpp"
    return str(source)


def main(argv=None) -> int:
    import argparse

    ap = argparse.ArgumentParser(prog="python -m ropelab.engines.llamacpp_table",
                                 description="Regenerate ropelab/engines/llamacpp_table.py from llama.cpp's source.")
    ap.add_argument("--source", required=True, help="a llama.cpp checkout or an extracted llama-cpp-python sdist")
    ap.add_argument("--out", default=str(Path(__file__).with_name("llamacpp_table.py")))
    args = ap.parse_args(argv)
    table = parse(args.source)
    Path(args.out).write_text(render(table, source_label(args.source)))
    print(f"wrote {args.out}: {len(table['archs'])} architectures, llama.cpp {table['commit']}")
    return 0
