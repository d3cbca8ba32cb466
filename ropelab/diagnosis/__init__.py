r"""Tell what a RoPE implementation actually does, by probing it as a black box.

Two silent RoPE bugs pass the usual sanity checks (norms are preserved, and :math:`q\cdot k` still depends
only on a difference of indices): a rotation that runs along the wrong axis (the heads, because the code
assumed another layout), and varlen packing whose positions do not restart at each sequence. ``diagnose``
measures instead of trusting. A RoPE at position m is the linear map

.. math::  y = a\,R_m x, \qquad R_m = \bigoplus_i \begin{pmatrix}\cos m\omega_i & -\sin m\omega_i\\
           \sin m\omega_i & \cos m\omega_i\end{pmatrix} \text{ on the pairs } (a_i, b_i),

the same for every head and batch element (Su et al. 2021, "RoFormer", arXiv 2104.09864). So:

1. **Structure** (``structure``; float64 where ``fn`` runs in it, else float32). Feeding the basis vector
   :math:`e_j` at every token gives column j of each token's matrix :math:`M_{\text{token}}` (d calls).
   Which dims couple gives the pairs, the rotary slice (where in the head it sits: leading dims, or
   trailing ones as in DeepSeek's MLA) and the style within it (``half`` (i, i + r/2) or ``interleaved``
   (2i, 2i + 1)). A permutation at position 0 is an output permutation (named, and undone before the
   rest). Each 2x2 block must be :math:`a\,[[c, -s], [s, c]]`, whose angle
   :math:`\theta = \operatorname{atan2}(M_{ba} - M_{ab}, M_{aa} + M_{bb})` and norm scale a are read off.
   The axis along which :math:`\theta` varies is where the positions actually run; every token's
   position is the integer m with :math:`\theta \equiv m\,\omega`, and :math:`\omega` is refined by least
   squares over all tokens.
2. **Frequencies** (``ladder``). The base is read from the unscaled high-frequency end of the ladder
   (:math:`\omega_i/\omega_{i+1} = b^{2/r}`), or from its fully scaled low-frequency end (the same ratio), then
   the per-pair factor :math:`\omega_i / b^{-2i/r}` is fitted: constant (default, linear), a ramp linear in i
   (yarn), or linear in :math:`\omega_i` (llama3) (Peng et al. 2023, arXiv 2309.00071; Meta 2024, arXiv
   2407.21783). The fitted parameters are checked by rebuilding the ladder with ``ropelab.frequencies``: within
   ``2**-16`` relative it matches, within ``2**-5`` it only resembles (frequencies held in bf16 land there, and
   are named). A ladder no known type reproduces is reported as unrecognised, with the measured per-pair factors,
   never a fitted base.
3. **Precision** (``measure``). One long call with positions 0 .. ``max_position`` in ``dtype`` (made
   *before* the high-precision call at that length, so a module that caches its tables by length cannot
   serve it float64 tables) reads back each pair's angle and compares it with :math:`m\,\omega_i` of the
   matched ladder in float64, allowing ``ropelab.precision.phase_tolerance``. Beyond that, the error
   pattern is matched against positions, ``inv_freq``, angles or cos/sin tables held in bf16/fp16 to
   name the cause. A ladder off its match is read as that ladder rounded to bf16/fp16 by any route
   (``rounding``: each pair's frequency fitted over the long call, with its standard error, must lie on
   the dtype's grid, as inv_freq, its denominator :math:`b^{2i/r}` or its exponent, within a few roundings
   of the ladder), and named an ``inv_freq`` precision problem with the dtype.

``fn`` may also be an MLX function (``functools.partial(mx.fast.rope, ...)``, an mlx-lm rope module):
``framework="mlx"``, or detected from where fn is defined; its arrays convert at the boundary
(``ropelab.engines.mlx.to_mx`` / ``to_torch``), so MLX is diagnosed like torch, float64 probes included.

``compare`` (``explain``) runs two implementations on the same input and explains every difference in
words. ``sanity_checks`` runs the two usual checks (norms kept; scores depending on n - m only), which a
rotation along the wrong axis passes, and ``rotation_angles`` returns the angle a pair actually gets at
every token. The command ``python -m ropelab.diagnosis MODULE:CALLABLE --layout "b s h d"
[--sizes h=20,d=64]`` (installed as ``ropelab-diagnose``) prints the report; it exits 0 for a correct RoPE,
1 for a diagnosed problem and 2 for a usage error.

The implementations the checks are tested on (correct and broken, ropelab's own and real-world code
imported from transformers and rotary-embedding-torch) are the rows of ``ropelab.diagnosis.zoo``.

Modules: ``probes`` (sizes, calls, tolerances, sanity checks), ``structure`` (pairs, axis, positions),
``ladder`` (frequency ladders), ``rounding`` (16-bit rounded ladders),
``measure`` (``diagnose``), ``report`` (``Diagnosis``, ``Comparison``),
``explain`` (``compare``),
``axes`` (multi-axis RoPE: ``diagnose_axes``, the single-axis check), ``zoo`` (the table),
``__main__`` (the command line).
"""

from .explain import compare
from .ladder import Ladder, fit_ladder
from .measure import diagnose
from .probes import probe_cu_seqlens, probe_sizes, rotation_angles, sanity_checks
from .report import Comparison, Diagnosis

__all__ = [
    "diagnose",
    "compare",
    "Diagnosis",
    "Comparison",
    "Ladder",
    "fit_ladder",
    "sanity_checks",
    "rotation_angles",
    "probe_sizes",
    "probe_cu_seqlens",
]
