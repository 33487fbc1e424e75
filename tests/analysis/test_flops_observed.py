"""The FLOPs counter observes the ops' calls and replaces nothing: no module
global of pola_mm (or any other module) changes during or after a count,
and an op is charged its formula whatever name a model calls it by: a
module-level alias bound before the count, a ``functools.partial``, an
attribute of the module."""
import functools
import sys

import pytest
import torch
import torch.nn as nn

import pola_mm.ops as ops
from pola_mm.analysis.attention.capture import op_calls
from pola_mm.analysis.flops import count_flops, polarity_attention_flops
from pola_mm.models.layers import PolarityAttention

#: bound when this file is imported, long before any count
ATTENTION = ops.polarity_attention
ALPHA = 3.0


def _globals():
    """Every callable global of every loaded pola_mm module and of this
    file, by ``(module, name)``."""
    out = {}
    for name, module in list(sys.modules.items()):
        if not (name == __name__ or name.startswith('pola_mm')):
            continue
        for key, value in list(vars(module).items()):
            if callable(value):
                out[name, key] = value
    return out


def _changed(before, now):
    return sorted(k for k in before.keys() | now.keys()
                  if before.get(k) is not now.get(k))


def test_counter_replaces_no_module_global():
    attn = PolarityAttention(16, 2, (4, 5))
    x = torch.randn(1, 20, 16)
    before = _globals()
    seen = []
    attn.register_forward_pre_hook(lambda m, a: seen.append(_globals()))
    report = count_flops(attn, lambda: attn(x, (4, 5)))
    assert report.by_op['polarity_attention'] > 0
    assert len(seen) == 1
    assert _changed(before, seen[0]) == []  # while counting
    assert _changed(before, _globals()) == []  # and after
    layer_module = sys.modules[PolarityAttention.__module__]
    assert vars(layer_module)['gate_linear'] is ops.gate_linear


class Aliases(nn.Module):
    """Calls the polarity attention op through three names the counter
    could not find by looking at module globals."""

    def __init__(self):
        super().__init__()
        self.op = ops.polarity_attention  # an attribute
        self.partial = functools.partial(ops.polarity_attention,
                                         alpha=ALPHA)

    def forward(self, q, k, v, scale, power):
        a = ATTENTION(q, k, v, scale, power, ALPHA)  # module-level alias
        b = self.op(q, k, v, scale, power, ALPHA)
        c = self.partial(q, k, v, scale, power)
        return a + b + c


def test_op_charged_by_formula_whatever_name_calls_it():
    B, h, N, d = 2, 2, 12, 8
    q, k, v = (torch.randn(B, h, N, d) for _ in range(3))
    scale, power = torch.zeros(1, h, 1, d), torch.zeros(1, h, 1, d)
    model = Aliases()
    # with the fast paths on, the op runs its kernel and not its reference:
    # the op's own call is the one to charge
    with torch.no_grad():
        report = count_flops(model, lambda: model(q, k, v, scale, power),
                             fast_paths=True)
    per_call = polarity_attention_flops(B, N, h * d, h)['op']
    # the three calls by formula, none of the products inside them
    assert report.by_op == {'polarity_attention': 3 * per_call}
    assert report.total == 3 * per_call


def test_counter_and_attention_capture_observe_together():
    """The counter inside another observer (the attention tools'
    ``op_calls``): each sees every call."""
    attn = PolarityAttention(16, 2, (4, 5))
    x = torch.randn(1, 20, 16)
    with op_calls(ops.polarity_attention, ops.gate_linear) as calls:
        report = count_flops(attn, lambda: attn(x, (4, 5)))
    assert [c.op for c in calls] == [ops.polarity_attention,
                                     ops.gate_linear]
    assert calls[0].args['q'].shape == (1, 2, 20, 8)
    f = polarity_attention_flops(1, 20, 16, 2)
    assert report.by_op['polarity_attention'] == f['op']


def test_op_calls_refuses_an_op_that_does_not_report():
    with pytest.raises(ValueError, match='softmax_attention must report'):
        with op_calls(ops.polarity_attention, ops.softmax_attention):
            pass
