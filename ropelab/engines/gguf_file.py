r"""A GGUF file's header, key-value pairs and tensor infos, read within the file's bounds: :func:`open_gguf`.

GGUF files are untrusted input (``ropelab-check`` runs on files people downloaded). Every count and length in
the file is checked before anything is allocated or looped over: against the bytes left in the file and against
the limits of llama.cpp's own parser (``ggml/src/gguf.cpp``, in :data:`ropelab.engines.llamacpp_types.LIMITS`:
``GGUF_MAX_STRING_LENGTH``, ``GGUF_MAX_ARRAY_ELEMENTS``, ``GGML_MAX_DIMS``, ``GGML_MAX_NAME``), so a file that
claims an array of :math:`2^{40}` elements is refused at once, in constant memory, instead of being looped over
(``gguf``'s ``GGUFReader`` builds one numpy view per element of a string array, and reads numeric arrays whole).

What llama.cpp's ``gguf_init_from_file`` refuses is refused here, with its reason: a bad magic, a version other
than 2 and 3 (1 is "no longer supported", a huge one a byte-order mismatch), an empty or duplicate key, a value
type outside the 13 GGUF types (an array of arrays included), a ``general.alignment`` that is not a UINT32
power of two, a tensor name of ``GGML_MAX_NAME`` bytes or more or a duplicate one, more than ``GGML_MAX_DIMS``
dims, a negative dim or an element count past INT64_MAX, an unknown ggml type or a row that is not whole blocks,
a tensor offset other than the running (aligned) size, and a data section past the end of the file.

Values are decoded only when asked for (:meth:`GGUFFile.value`), and a reader asks only for the keys it reads:
the file's other keys (a tokenizer's 150,000 strings) cost one pass over their lengths and nothing more.
The byte order is little-endian (llama.cpp's ``gguf.cpp`` reads the host's order and names a mismatch).
"""

from __future__ import annotations

import mmap
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from . import llamacpp_types
from .reading import ReadError

__all__ = ["GGUFFile", "Field", "TensorInfo", "open_gguf", "TYPE_NAMES"]

# GGUF value types (ggml/include/gguf.h, enum gguf_type): name, struct format ("" for string and array).
_TYPES = {0: ("UINT8", "<B"), 1: ("INT8", "<b"), 2: ("UINT16", "<H"), 3: ("INT16", "<h"), 4: ("UINT32", "<I"),
          5: ("INT32", "<i"), 6: ("FLOAT32", "<f"), 7: ("BOOL", "<?"), 8: ("STRING", ""), 9: ("ARRAY", ""),
          10: ("UINT64", "<Q"), 11: ("INT64", "<q"), 12: ("FLOAT64", "<d")}
TYPE_NAMES = {t: name for t, (name, _) in _TYPES.items()}
_STRING, _ARRAY = 8, 9
_INT64_MAX = 2 ** 63 - 1


@dataclass(frozen=True)
class Field:
    """One key-value pair: its GGUF ``type`` (a name of :data:`TYPE_NAMES`), ``elem`` (an array's element
    type, else None), ``count`` (an array's length, else 1), and where its value's bytes start."""

    key: str
    type: str
    elem: str | None
    count: int
    offset: int

    @property
    def is_array(self) -> bool:
        return self.type == "ARRAY"


@dataclass(frozen=True)
class TensorInfo:
    """One tensor info: ``shape`` (ggml's ne, innermost first), ``ggml_type`` (its number), ``n_elements``,
    ``nbytes`` and ``offset`` (from the start of the data section)."""

    name: str
    shape: tuple[int, ...]
    ggml_type: int
    n_elements: int
    nbytes: int
    offset: int


class GGUFFile:
    """The parsed header of one GGUF file (see the module docstring); use as a context manager or call
    :meth:`close`. ``fields`` and ``tensors`` are dicts by key / name, in file order."""

    def __init__(self, path: Path, mm: mmap.mmap, version: int, fields: dict[str, Field],
                 tensors: dict[str, TensorInfo], data_offset: int):
        self.path, self._mm, self.version = path, mm, version
        self.fields, self.tensors, self.data_offset = fields, tensors, data_offset

    def close(self) -> None:
        self._mm.close()

    def __enter__(self) -> GGUFFile:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def string_length(self, key: str) -> int:
        """The byte length of the string value of ``key`` (bounded by the file when the header was read)."""
        return struct.unpack_from("<Q", self._mm, self.fields[key].offset)[0]

    def value(self, key: str) -> Any:
        """The decoded value of ``key``: a Python scalar, a str, or a list for an array. Decoding reads only this
        value's bytes, which the header pass has already bounded by the file's size."""
        f = self.fields[key]
        if not f.is_array:
            return _Cursor(self._mm, f.offset, self.path).scalar(f.type)
        if f.elem == "STRING":
            cur = _Cursor(self._mm, f.offset, self.path)
            return [cur.string() for _ in range(f.count)]
        fmt = _TYPES[_type_id(f.elem)][1]
        data = np.frombuffer(self._mm, dtype=np.dtype(fmt), count=f.count, offset=f.offset)
        return data.tolist()

    def tensor_values(self, name: str) -> np.ndarray:
        """A F32 / F16 / F64 tensor's values as float64 (the rope tensors); ReadError for other types."""
        t = self.tensors[name]
        dtypes = {0: "<f4", 1: "<f2", 28: "<f8"}  # ggml_type F32, F16, F64 (ggml/include/ggml.h)
        if t.ggml_type not in dtypes:
            raise ReadError(f"{self.path}: tensor {name} has ggml type {_ggml_name(t.ggml_type)}; ropelab reads rope "
                            "tensors stored as F32, F16 or F64 (the converter writes F32).")
        start = self.data_offset + t.offset
        return np.frombuffer(self._mm, dtype=np.dtype(dtypes[t.ggml_type]), count=t.n_elements,
                             offset=start).astype(np.float64)


def _type_id(name: str) -> int:
    return next(t for t, n in TYPE_NAMES.items() if n == name)


def _ggml_name(t: int) -> str:
    try:
        import gguf

        return gguf.GGMLQuantizationType(t).name
    except (ImportError, ValueError):
        return str(t)


class _Cursor:
    """Reads little-endian values from ``mm`` at a moving offset; running out of bytes is a ReadError."""

    def __init__(self, mm: mmap.mmap, offset: int, path: Path):
        self.mm, self.pos, self.path, self.size = mm, offset, path, len(mm)

    def fail(self, what: str) -> ReadError:
        return ReadError(f"{self.path}: not a readable GGUF file: {what} (at byte {self.pos} of {self.size}); the "
                         "file is truncated, corrupt or not GGUF.")

    def need(self, n: int, what: str) -> None:
        if n < 0 or n > self.size - self.pos:
            raise self.fail(f"{what} needs {n} bytes, {self.size - self.pos} are left")

    def unpack(self, fmt: str, what: str) -> Any:
        n = struct.calcsize(fmt)
        self.need(n, what)
        (v,) = struct.unpack_from(fmt, self.mm, self.pos)
        self.pos += n
        return v

    def scalar(self, type_name: str) -> Any:
        if type_name == "STRING":
            return self.string()
        return self.unpack(_TYPES[_type_id(type_name)][1], f"a {type_name} value")

    def string_bounds(self, what: str = "a string") -> tuple[int, int]:
        n = self.unpack("<Q", f"the length of {what}")
        limit = llamacpp_types.LIMITS["GGUF_MAX_STRING_LENGTH"]
        if n > limit:
            raise self.fail(f"{what} claims {n} bytes, past llama.cpp's GGUF_MAX_STRING_LENGTH {limit}")
        self.need(n, what)
        start = self.pos
        self.pos += n
        return start, n

    def string(self, what: str = "a string") -> str:
        start, n = self.string_bounds(what)
        return bytes(self.mm[start:start + n]).decode("utf-8", errors="replace")


def _read_kv(cur: _Cursor, index: int) -> Field:
    key = cur.string(f"key {index}")
    if not key:
        raise cur.fail(f"key {index} is empty")
    t = cur.unpack("<I", f"the type of {key!r}")
    if t not in _TYPES:
        raise cur.fail(f"key {key!r} has GGUF type {t}, not one of the {len(_TYPES)} GGUF types")
    if t != _ARRAY:
        start = cur.pos
        if t == _STRING:
            cur.string_bounds(f"the value of {key!r}")
        else:
            cur.need(struct.calcsize(_TYPES[t][1]), f"the value of {key!r}")
            cur.pos += struct.calcsize(_TYPES[t][1])
        return Field(key, TYPE_NAMES[t], None, 1, start)
    et = cur.unpack("<I", f"the element type of {key!r}")
    n = cur.unpack("<Q", f"the length of {key!r}")
    if et not in _TYPES or et == _ARRAY:
        raise cur.fail(f"array {key!r} has element type {et}, which GGUF arrays cannot hold")
    limit = llamacpp_types.LIMITS["GGUF_MAX_ARRAY_ELEMENTS"]
    if n > limit:
        raise cur.fail(f"array {key!r} claims {n} elements, past llama.cpp's GGUF_MAX_ARRAY_ELEMENTS {limit}")
    start = cur.pos
    if et == _STRING:
        cur.need(8 * n, f"the {n} string lengths of {key!r}")  # each string holds at least its 8-byte length
        for i in range(n):
            cur.string_bounds(f"string {i} of {key!r}")
    else:
        cur.need(n * struct.calcsize(_TYPES[et][1]), f"the {n} elements of {key!r}")
        cur.pos += n * struct.calcsize(_TYPES[et][1])
    return Field(key, "ARRAY", TYPE_NAMES[et], n, start)


def _read_tensor_info(cur: _Cursor, index: int, sizes: dict[int, tuple[int, int]]) -> TensorInfo:
    limits = llamacpp_types.LIMITS
    name = cur.string(f"the name of tensor {index}")
    if len(name.encode()) >= limits["GGML_MAX_NAME"]:
        raise cur.fail(f"tensor {index}'s name is {len(name.encode())} bytes, llama.cpp's limit is "
                       f"GGML_MAX_NAME - 1 = {limits['GGML_MAX_NAME'] - 1}")
    n_dims = cur.unpack("<I", f"the dims of tensor {name!r}")
    if n_dims > limits["GGML_MAX_DIMS"]:
        raise cur.fail(f"tensor {name!r} has {n_dims} dims, past GGML_MAX_DIMS {limits['GGML_MAX_DIMS']}")
    shape = tuple(cur.unpack("<q", f"dim {j} of tensor {name!r}") for j in range(n_dims))
    n_el = 1
    for d in shape:
        if d < 0:
            raise cur.fail(f"tensor {name!r} has a negative dim {d}")
        if d and n_el > _INT64_MAX // d:
            raise cur.fail(f"tensor {name!r} has shape {shape}, more than INT64_MAX elements")
        n_el *= d
    gt = cur.unpack("<I", f"the type of tensor {name!r}")
    if gt not in sizes:
        raise cur.fail(f"tensor {name!r} has ggml type {gt}, which ggml does not know")
    block, type_size = sizes[gt]
    if shape and shape[0] % block:
        raise cur.fail(f"tensor {name!r} of type {_ggml_name(gt)} has {shape[0]} elements per row, not a multiple "
                       f"of its block size {block}")
    offset = cur.unpack("<Q", f"the offset of tensor {name!r}")
    return TensorInfo(name, shape, gt, n_el, n_el // block * type_size, offset)


def _ggml_sizes() -> dict[int, tuple[int, int]]:
    """ggml type -> (block size, bytes per block), from the ``gguf`` package (llama.cpp's own gguf-py)."""
    import gguf

    return {int(t): (int(b), int(s)) for t, (b, s) in gguf.GGML_QUANT_SIZES.items()}


def open_gguf(path: str | Path) -> GGUFFile:
    """Parse the header, key-value pairs and tensor infos of the GGUF file ``path`` within its bounds (see the
    module docstring). Every refusal, and every OS error, is a :class:`ReadError` naming the file."""
    path = Path(path)
    try:
        with open(path, "rb") as fh:
            size = fh.seek(0, 2)
            if size < 24:
                raise ReadError(f"{path}: not a readable GGUF file: {size} bytes, shorter than a GGUF header (24); "
                                "the file is truncated or not GGUF.")
            mm = mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ)
    except OSError as e:
        raise ReadError(f"{path}: cannot be read ({type(e).__name__}: {e.strerror or e}).") from e
    try:
        return _parse(path, mm)
    except BaseException:
        mm.close()
        raise


def _parse(path: Path, mm: mmap.mmap) -> GGUFFile:
    cur = _Cursor(mm, 0, path)
    limits = llamacpp_types.LIMITS
    if mm[:4] != b"GGUF":
        raise cur.fail(f"the magic is {bytes(mm[:4])!r}, not b'GGUF'")
    cur.pos = 4
    version = cur.unpack("<I", "the version")
    if version & 0xFFFF == 0 and version:
        raise cur.fail(f"version {version} is a byte-swapped one: a big-endian file, which ropelab does not read")
    if version == 1:
        raise cur.fail("GGUF version 1, which llama.cpp no longer supports")
    if not 2 <= version <= limits["GGUF_VERSION"]:
        raise cur.fail(f"GGUF version {version}; llama.cpp reads versions 2 to {limits['GGUF_VERSION']}")
    n_tensors = cur.unpack("<q", "the tensor count")
    n_kv = cur.unpack("<q", "the key-value count")
    # Each key-value pair takes at least 13 bytes (key length, a 1-byte key, type, a 1-byte value), each tensor
    # info at least 21 (name length, n_dims, type, offset, a 1-byte name): a count past that is a lie.
    left = cur.size - cur.pos
    if not 0 <= n_kv <= left // 13:
        raise cur.fail(f"the file claims {n_kv} key-value pairs, but {left} bytes hold at most {left // 13}")
    fields: dict[str, Field] = {}
    for i in range(n_kv):
        f = _read_kv(cur, i)
        if f.key in fields:
            raise cur.fail(f"duplicate key {f.key!r}")
        fields[f.key] = f
    left = cur.size - cur.pos
    if not 0 <= n_tensors <= left // 21:
        raise cur.fail(f"the file claims {n_tensors} tensors, but {left} bytes hold at most {left // 21} tensor infos")
    alignment = limits["GGUF_DEFAULT_ALIGNMENT"]
    if "general.alignment" in fields:
        fa = fields["general.alignment"]
        if fa.type != "UINT32":
            raise cur.fail(f"general.alignment is {fa.type}; llama.cpp requires UINT32")
        alignment = _Cursor(mm, fa.offset, path).scalar("UINT32")
        if alignment == 0 or alignment & (alignment - 1):
            raise cur.fail(f"general.alignment {alignment} is not a power of 2")
    sizes = _ggml_sizes()
    tensors: dict[str, TensorInfo] = {}
    for i in range(n_tensors):
        t = _read_tensor_info(cur, i, sizes)
        if t.name in tensors:
            raise cur.fail(f"duplicate tensor name {t.name!r}")
        tensors[t.name] = t
    data_offset = cur.pos
    if tensors:
        data_offset = -(-cur.pos // alignment) * alignment
    expected = 0
    for t in tensors.values():
        if t.offset != expected:
            raise cur.fail(f"tensor {t.name!r} has offset {t.offset}, expected {expected} (llama.cpp refuses it)")
        expected += -(-t.nbytes // alignment) * alignment
        if data_offset + t.offset + t.nbytes > cur.size:
            raise cur.fail(f"tensor {t.name!r}'s data ends at byte {data_offset + t.offset + t.nbytes}, past the end "
                           "of the file")
    return GGUFFile(path, mm, version, fields, tensors, data_offset)

