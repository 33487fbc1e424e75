"""Parameters and FLOPs of pola_mm models, the polarity attention included.

Convention (mmengine's ``get_model_complexity_info`` / fvcore, and the
tables of Swin, PVT and PolaFormer): **one multiply-add is one FLOP**, so a
``(m, k) @ (k, n)`` product costs ``m k n`` and a conv ``out_elements *
in_channels / groups * kernel_area``. Normalisation layers cost what
mmengine charges, bilinear upsampling 4 per output element, nearest 1,
adaptive average pooling 1 per input element (:mod:`.aten`). Other
elementwise work (activations, residual adds, softmax) is not counted, as
in mmengine. The attention ops are charged their published formulas.

Where each part lives:

- :mod:`.formulas`: the closed-form formulas of the attention ops
  (:func:`polarity_attention_flops`, :func:`pacs_attention_flops`,
  :func:`softmax_attention_flops`) and which calls are charged by formula
  (:data:`FORMULAS`, :func:`register_formula`);
- :mod:`.aten`: what each aten operation costs;
- :mod:`.counter`: the counter, a dispatch mode over one forward with
  pola_mm's fast paths off, which observes the calls of the ops with a
  formula (:func:`pola_mm.ops.observe_calls`) instead of replacing
  anything (:func:`count_flops`, :func:`count_params`,
  :class:`FlopReport`);
- :mod:`.complexity`: whole models from configs, as the upstream
  ``get_flops.py`` tools count them (:func:`model_complexity`,
  :func:`format_report`);
- :mod:`.rois`: the RoIs a two-stage detector's heads are counted on, the
  test pass's at most (:func:`published_rois`), the one part that relies
  on mmdet beyond its public API (why: that module's docstring).

The depth-wise conv on v (``dwc``, ``lepe``) is a conv like any other, so
each attention module costs its projections, the op's formula and its conv:
the published total (``total`` of the formulas). Every
``scaled_dot_product_attention`` kernel (fused softmax attention, which
:class:`torch.utils.flop_counter.FlopCounterMode` counts as 0 on the CPU)
is charged :func:`softmax_attention_flops`: its two products, the same as
the explicit ``q @ k^T`` and ``attn @ v`` of the plain reference.
``compute=False`` counts without computing the matrix products and
convolutions (zeros of their shapes): the same count.

mmengine's counter (``get_model_complexity_info``, used by the upstream
``get_flops.py`` tools) traces the model with ``torch.jit.trace``: it cannot
see into custom autograd functions or C++ loops and has no handler for
``scaled_dot_product_attention``.
"""
from .complexity import format_report, model_complexity
from .counter import FlopReport, count_flops, count_params
from .formulas import (FORMULAS, pacs_attention_flops,
                       polarity_attention_flops, register_formula,
                       softmax_attention_flops)
from .rois import published_rois

__all__ = [
    'FlopReport', 'FORMULAS', 'register_formula', 'polarity_attention_flops',
    'pacs_attention_flops', 'softmax_attention_flops', 'count_flops',
    'count_params', 'model_complexity', 'published_rois', 'format_report'
]
