"""The command line: ``python -m ropelab.diagnosis MODULE:CALLABLE --layout "b s h d"`` (or ``ropelab-diagnose``).

Exit codes: 0 a correct RoPE along the declared axis; 1 a diagnosed problem (and nothing else); 2 a usage
error (a module or attribute that does not exist, malformed ``--sizes``/``--expect``), with one line on
stderr naming it.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Callable
from typing import Any

from ..precision import DTYPE_NAMES
from .measure import diagnose

__all__ = ["main"]


class UsageError(Exception):
    """A mistake in the command line (exit 2), never a finding about the RoPE (exit 1)."""


def _parse_kv(text: str | None, what: str) -> dict[str, str]:
    out = {}
    for item in filter(None, (text or "").split(",")):
        if "=" not in item:
            raise UsageError(f"--{what} takes comma-separated key=value items (e.g. h=20,d=64), got {item!r}.")
        k, v = item.split("=", 1)
        out[k.strip()] = v.strip()
    return out


def _load(target: str) -> Callable:
    if ":" not in target:
        raise UsageError(f"name the function as MODULE:CALLABLE (e.g. mypkg.rope:apply), got {target!r}.")
    mod_name, attr = target.split(":", 1)
    if "" not in sys.path:
        sys.path.insert(0, "")
    try:
        obj: Any = importlib.import_module(mod_name)
    except ImportError as e:
        raise UsageError(f"cannot import module {mod_name!r}: {e}") from e
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise UsageError(f"module {mod_name!r} has no attribute {attr!r}.")
        obj = getattr(obj, part)
    if not callable(obj):
        raise UsageError(f"{target} is not callable.")
    return obj


def _expect(text: str | None) -> dict[str, Any]:
    expect: dict[str, Any] = {}
    for k, v in _parse_kv(text, "expect").items():
        if k == "pairing":
            raise UsageError(f"--expect names the pairing 'style' (as apply_rope does): use style={v}.")
        if k not in ("style", "base", "rotary_dim", "attention_factor"):
            raise UsageError(f"--expect knows style, base, rotary_dim, attention_factor; got {k!r}.")
        try:
            expect[k] = v if k == "style" else (int(v) if k == "rotary_dim" else float(v))
        except ValueError as e:
            raise UsageError(f"--expect {k} needs a number, got {v!r}.") from e
    return expect


def main(argv: list[str] | None = None) -> int:
    """Run the command; returns the exit code (0 correct, 1 a diagnosed problem, 2 a usage error)."""
    parser = argparse.ArgumentParser(
        prog="ropelab-diagnose",
        description="Probe a RoPE implementation and print what it does. Exit 0: a correct RoPE; 1: a diagnosed "
        "problem; 2: a usage error.",
    )
    parser.add_argument("target", help="MODULE:CALLABLE, the function fn(x) (fn(x, cu_seqlens) for 't' layouts)")
    parser.add_argument("--layout", required=True, help='einops-style axes of x, e.g. "b s h d" or "t h d"')
    parser.add_argument("--sizes", help="axis sizes fn needs, e.g. h=20,d=64")
    parser.add_argument("--dtype", default="float32", choices=sorted(DTYPE_NAMES.values()), help="phase-check dtype")
    parser.add_argument("--max-position", type=int, default=4096, help="last position of the phase check")
    parser.add_argument("--expect", help="expected values, e.g. style=half,base=10000,rotary_dim=64")
    args = parser.parse_args(argv)  # argparse itself exits 2 on a malformed command line
    try:
        try:
            sizes = {k: int(v) for k, v in _parse_kv(args.sizes, "sizes").items()}
        except ValueError as e:
            raise UsageError(f"--sizes takes integer sizes such as h=20,d=64 ({e}).") from e
        expect = _expect(args.expect)
        dtype = {v: k for k, v in DTYPE_NAMES.items()}[args.dtype]
        fn = _load(args.target)
        try:
            dg = diagnose(
                fn,
                layout=args.layout,
                sizes=sizes,
                dtype=dtype,
                max_position=args.max_position,
                expect=expect,
                name=args.target,
            )
        except ValueError as e:  # diagnose's own argument checks (layout, sizes, ...): a usage error too
            raise UsageError(str(e)) from e
    except UsageError as e:
        print(f"ropelab-diagnose: error: {e}", file=sys.stderr)
        return 2
    print(dg)
    return 0 if dg.ok else 1


if __name__ == "__main__":
    sys.exit(main())
