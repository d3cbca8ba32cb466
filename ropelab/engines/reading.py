r"""What one source says a model's RoPE is: :class:`Reading`, one :class:`~ropelab.spec.RopeSpec` per layer.

A model's RoPE is declared again at every boundary it crosses (a transformers ``config.json``, the GGUF file
llama.cpp's converter writes, an MLX model directory as mlx-lm builds it). Each reader in
``ropelab.engines`` turns one such source into a :class:`Reading` in ropelab's terms, so that two readings
compare layer by layer (``ropelab.engines.check``, the ``ropelab-check`` console script).

The specs are always in the coordinates of the *stored* q/k weights, except that :attr:`Reading.qk_permuted`
records a q/k row permutation the writer applied (llama.cpp's converter permutes q/k of NORM-type
architectures: NORM on the permuted weights equals NEOX on the original ones, ``ropelab.convert``). The
comparison uses :meth:`Reading.effective_specs`, the specs in the original weights' coordinates.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from ..multiaxis import MultiAxis
from ..spec import RopeSpec

__all__ = ["Reading", "ReadError", "FORMATS", "class_runs"]

# The source formats a Reading can come from.
FORMATS = ("transformers", "gguf", "mlx", "vllm")

_OTHER_STYLE = {"half": "interleaved", "interleaved": "half"}


class ReadError(ValueError):
    """A source that cannot be read as a model's RoPE: the message names the file, the problem and the fix.

    ``ropelab-check`` turns it into exit code 2 with the message, never a traceback.
    """


@dataclass(frozen=True)
class Reading:
    """One source's RoPE for every layer of a model.

    Args:
        source: the path (or a label) it was read from.
        format: one of :data:`FORMATS`.
        architecture: the source's own name for the model (transformers ``model_type``, GGUF
            ``general.architecture``, the mlx-lm module name).
        head_dim: the attention head dimension the specs apply to.
        layers: one spec per decoder layer, in the stored weights' coordinates (``RopeSpec.nope()`` for a
            layer without RoPE).
        sections: multi-axis RoPE (M-RoPE, its interleaved form, vision), or None for 1D RoPE.
        qk_permuted: True when the writer permuted the q/k rows between the styles (the stored weights are in
            the other style's dim order), so the original model's style is the other one.
        declared: the source's raw RoPE keys, as written (for display and ``--json``).
        notes: what the reader observed but does not compare (a key it ignores, a convention it applied).
        text_only: True when the engine runs token ids only, with no multi-axis positions (mlx-lm: its models take
            ``inputs`` and no position ids): every token then has the same position on every axis, where M-RoPE with
            any sections is the 1D RoPE of the same frequencies, so the sections are not compared against it.
        problems: contradictions inside the source itself (a GGUF whose rope keys contradict its
            architecture's rope type, a config whose v4 and v5 keys disagree): ``ropelab-check`` reports each
            and exits 1, even for a single source.
    """

    source: str
    format: str
    architecture: str
    head_dim: int
    layers: tuple[RopeSpec, ...]
    sections: MultiAxis | None = None
    qk_permuted: bool = False
    declared: Mapping[str, Any] = field(default_factory=dict)
    notes: tuple[str, ...] = ()
    problems: tuple[str, ...] = ()
    text_only: bool = False

    def __post_init__(self) -> None:
        if self.format not in FORMATS:
            raise ValueError(f"format must be one of {FORMATS}, got {self.format!r}.")
        if not isinstance(self.head_dim, int) or self.head_dim <= 0 or self.head_dim % 2:
            raise ValueError(f"head_dim must be a positive even int, got {self.head_dim!r}.")
        if not self.layers or not all(isinstance(s, RopeSpec) for s in self.layers):
            raise ValueError("layers must be a non-empty tuple of RopeSpec, one per decoder layer.")
        object.__setattr__(self, "layers", tuple(self.layers))
        object.__setattr__(self, "notes", tuple(self.notes))
        object.__setattr__(self, "problems", tuple(self.problems))

    @property
    def n_layers(self) -> int:
        return len(self.layers)

    def effective_specs(self) -> tuple[RopeSpec, ...]:
        """The specs in the original (unpermuted) weights' coordinates: the style flipped when ``qk_permuted``."""
        if not self.qk_permuted:
            return self.layers
        return tuple(s if s.is_nope else dataclasses.replace(s, style=_OTHER_STYLE[s.style]) for s in self.layers)

    def to_dict(self) -> dict:
        """A JSON-ready view (``ropelab-check --json``)."""
        return {
            "source": self.source,
            "format": self.format,
            "architecture": self.architecture,
            "head_dim": self.head_dim,
            "qk_permuted": self.qk_permuted,
            "sections": None if self.sections is None else dataclasses.asdict(self.sections),
            "layers": [s.to_dict() for s in self.layers],
            "declared": _jsonable(self.declared),
            "notes": list(self.notes),
            "problems": list(self.problems),
            "text_only": self.text_only,
        }


def _jsonable(value: Any) -> Any:
    if isinstance(value, Mapping):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if isinstance(value, (str, int, float, bool)) or value is None:
        return value
    return repr(value)


def class_runs(names: list[str]) -> str:
    """Per-layer names with repeats folded, for a reading's notes: ``["A", "A", "B"]`` -> ``"A x2, B"``."""
    out, i = [], 0
    while i < len(names):
        j = i
        while j + 1 < len(names) and names[j + 1] == names[i]:
            j += 1
        out.append(f"{names[i]} x{j - i + 1}" if j > i else names[i])
        i = j + 1
    return ", ".join(out)
