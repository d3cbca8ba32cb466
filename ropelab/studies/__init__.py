"""The code of one notebook's study each, named for the notebook it serves (rasbt's LLMs-from-scratch names its
files by chapter): a reader in notebook NN opens ``nbNN_*.py``.

- ``nb01_restyle``: a trained TinyLM's weights run in another RoPE style, as they are or with W_q, W_k permuted,
  the lag-copy task it is trained on, and the figures of what mixing costs;
- ``nb02_layouts``: notebook 02's figure of a RoPE module told the wrong sequence axis;
- ``nb04_selective_copy``: the CoPE paper's Selective Copy task and notebook 04's learning-rate sweep; ``nb04_results``
  its results files (read by notebook 03 too), ``nb04_plots`` its figures (and the two notebook 03 draws from
  them);
- ``nb08_gridtask``: notebook 08's 2D task (copy the symbol above), one attention head with axial or flattened RoPE;
- ``nb10_engines``: notebook 10's public RoPE boundary bugs (``data/engines/boundary_bugs.json``), each class as a map
  from the correct ``RopeSpec`` to the buggy one, and its damage on the trained TinyLMs.

The primitives these build on (``core``, ``spec``, ``models``, ...) never import a study.
"""

__all__: list[str] = []
