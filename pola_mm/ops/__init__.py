"""The ops of pola_mm: each one public function that picks its fast
implementation or its plain ``*_pytorch`` reference itself (mmcv's
pattern), under one setting (``POLA_MM_OPS=auto|triton|cpu|graph`` or
:func:`use_implementation`; :mod:`~pola_mm.ops.dispatch`).

- :func:`polarity_attention` (PolaFormer; its forms in
  :mod:`~pola_mm.ops.polarity`: naive, graph, cpu, triton);
- :func:`pacs_attention` (PolaFormer++'s PaCS; its forms in
  :mod:`~pola_mm.ops.pacs`: naive, cpu, triton);
- :func:`softmax_attention` (``scaled_dot_product_attention`` or the
  explicit form);
- :func:`depthwise_conv2d`, :func:`gate_linear`, :func:`gelu_linear`
  (lean training functions); :func:`gelu_mlp` (the MLP: lean in training,
  in CPU inference on runs of tokens);
- :func:`resize_pos_table` (cached in inference);
- :func:`rotary_tables`, :func:`theta_shift` (PolaFormer++'s 2-D rotary
  encoding).

Each has its plain reference beside it, named ``*_pytorch``, which is also
what it runs with ``POLA_MM_OPS=graph``. The pieces the references and the
fast implementations share are written once
(:mod:`~pola_mm.ops.features`), the CPU run planning apart from their
arithmetic (:mod:`~pola_mm.ops.runs`). Analysis tools see the attention
ops, the gated projection and the table resize being called through
:mod:`~pola_mm.ops.observers`.
"""
from .depthwise_conv import depthwise_conv2d, depthwise_conv2d_pytorch
from .dispatch import (IMPLEMENTATION_ENV, IMPLEMENTATIONS,
                       DynamicShapeExportError, get_implementation, old_name,
                       set_implementation, use_implementation)
from .gate_linear import gate_linear, gate_linear_pytorch
from .gelu_linear import (gelu_linear, gelu_linear_pytorch, gelu_mlp,
                          gelu_mlp_pytorch)
from .observers import observe_calls, reporting, reports_calls
from .pacs import pacs_attention, pacs_attention_pytorch
from .polarity import (polarity_attention, polarity_attention_naive,
                       polarity_attention_pytorch)
from .position import (check_resize_mode, resize_pos_table,
                       resize_pos_table_pytorch)
from .rotary import rotary_tables, theta_shift
from .softmax_attention import (check_window_export, softmax_attention,
                                softmax_attention_pytorch)
from .symbolic_sizes import dynamic_export, dynamic_export_supported

__all__ = [
    'IMPLEMENTATION_ENV', 'IMPLEMENTATIONS', 'get_implementation',
    'set_implementation', 'use_implementation',
    'polarity_attention', 'polarity_attention_pytorch',
    'polarity_attention_naive', 'pacs_attention',
    'pacs_attention_pytorch', 'softmax_attention',
    'softmax_attention_pytorch', 'depthwise_conv2d',
    'depthwise_conv2d_pytorch', 'gate_linear', 'gate_linear_pytorch',
    'gelu_linear', 'gelu_linear_pytorch', 'gelu_mlp', 'gelu_mlp_pytorch',
    'resize_pos_table', 'resize_pos_table_pytorch', 'check_resize_mode',
    'check_window_export', 'dynamic_export', 'dynamic_export_supported',
    'DynamicShapeExportError', 'rotary_tables',
    'theta_shift', 'observe_calls', 'reports_calls', 'reporting'
]


def __getattr__(name: str):
    raise old_name(__name__, name)
