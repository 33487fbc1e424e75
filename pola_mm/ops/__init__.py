"""Fast implementations of the models' computations, behind one switch.

Everything here computes what the plain layers in :mod:`pola_mm.models`
compute (tested against them); :mod:`pola_mm.ops.dispatch` decides where
each applies (:func:`~pola_mm.ops.dispatch.select`, called once per module
call) and holds the switch (``POLA_MM_FAST_PATHS=0`` or
:func:`plain_paths`) and every tuning constant.

- :mod:`~pola_mm.ops.polarity_kernel`: the polarity attention kernel
  (shared key-value product, recomputation in backward, CPU runs);
- :mod:`~pola_mm.ops.pacs_kernel`: the PaCS attention kernel of
  PolaFormer++ (one key-value product, recomputation in backward);
- :mod:`~pola_mm.ops.cpu_ext` and ``csrc/``: its fused C++ CPU loops;
- :mod:`~pola_mm.ops.depthwise_conv`: depth-wise conv with a fast backward;
- :mod:`~pola_mm.ops.token_runs`: CPU training of MLPs and projections in
  runs of tokens;
- :mod:`~pola_mm.ops.inference_runs`: helpers of CPU inference in runs (the
  blocks' own ``forward_in_runs`` use them).
"""
from .dispatch import (FAST_PATHS_ENV, fast_paths_enabled, plain_paths,
                       set_fast_paths)
from .pacs_kernel import pacs_attention_kernel
from .polarity_kernel import (polarity_attention_kernel, polarity_key_state,
                              polarity_query_apply)

__all__ = [
    'FAST_PATHS_ENV', 'fast_paths_enabled', 'plain_paths', 'set_fast_paths',
    'polarity_attention_kernel', 'polarity_key_state', 'polarity_query_apply',
    'pacs_attention_kernel'
]
