"""PolaFormer's polarity-aware linear attention, one file per form:

- :mod:`.op`: :func:`polarity_attention`, the op the models call; it picks
  the implementation (:func:`~pola_mm.ops.dispatch.implementation`);
- :mod:`.naive`: the paper's formula as written, the arbiter;
- :mod:`.graph`: the export form (standard operations), also what runs with
  the fast paths off;
- :mod:`.cpu`: torch operations rearranged (CPU; GPUs without Triton);
- :mod:`.triton`: fused Triton kernels (CUDA), as torch custom ops.
"""
from .graph import polarity_attention_pytorch
from .naive import polarity_attention_naive
from .op import polarity_attention

__all__ = ['polarity_attention', 'polarity_attention_pytorch',
           'polarity_attention_naive']
