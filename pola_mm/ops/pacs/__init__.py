"""PolaFormer++'s PaCS polarity attention, one file per form:

- :mod:`.op`: :func:`pacs_attention`, the op the models call; it picks the
  implementation (:func:`~pola_mm.ops.dispatch.implementation`);
- :mod:`.naive`: the formula as written, the arbiter, and also the graph
  form (with the fast paths off, and in captured graphs);
- :mod:`.cpu`: torch operations rearranged (CPU; GPUs without Triton);
- :mod:`.triton`: fused Triton kernels (CUDA), as torch custom ops.
"""
from .naive import pacs_attention_pytorch
from .op import pacs_attention

__all__ = ['pacs_attention', 'pacs_attention_pytorch']
