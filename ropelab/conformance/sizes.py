"""The sweep's sizes that both the runner (``running``) and the input builders (``sequence_inputs``) use: the
positions every model is run at, and the audio frames a feature input has. Their own module, so that neither
builder imports the other."""

from __future__ import annotations

__all__ = ["N_FRAMES", "positions_for"]

# Audio feature frames: a few tokens left after the encoders' subsampling (50 after 2x: never the head size, so
# the sequence axis of q and k is told apart).
N_FRAMES = 100


def positions_for(max_pos: int | None) -> list[int]:
    """9 distinct positions: small ones (every pair's angle resolved) and large ones up to the context."""
    top = min(max_pos or 4096, 4096)
    pos = sorted({0, 1, 2, 3, 5, 17, top // 4, top // 2, top - 1})
    k = 6
    while len(pos) < 9:
        pos = sorted(set(pos) | {k})
        k += 1
    return pos[:9]
