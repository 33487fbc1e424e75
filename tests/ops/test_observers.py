"""The ops' calls reported to observers (``pola_mm.ops.observers``): which
ops report, what an observer sees, nesting and removal, and that an op with
no observer registered is the plain function to ``torch.compile``."""
import contextlib

import pytest
import torch

import pola_mm.ops as ops
from pola_mm.ops import observe_calls, reporting, reports_calls
from pola_mm.ops.observers import _observers

#: The ops analysis tools observe (the FLOPs counter, the attention maps).
REPORTING = ['polarity_attention', 'polarity_attention_pytorch',
             'pacs_attention', 'pacs_attention_pytorch', 'resize_pos_table',
             'gate_linear']


def _heads(B=1, h=2, N=6, d=4):
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(B, h, N, d, generator=g) for _ in range(3))
    return q, k, v, torch.zeros(1, h, 1, d), torch.zeros(1, h, 1, d)


@pytest.mark.parametrize('name', REPORTING)
def test_public_ops_report_their_calls(name):
    fn = getattr(ops, name)
    assert reporting(fn)
    # the op keeps its name, documentation and signature
    assert fn.__name__ == name and fn.__doc__ == fn.__wrapped__.__doc__
    assert fn.__module__.startswith('pola_mm.ops.')
    assert not reporting(fn.__wrapped__)
    assert not reporting(ops.softmax_attention)


def _recorder(log, tag):
    @contextlib.contextmanager
    def observer(op, arguments):
        log.append((tag, 'enter', op.__name__, dict(arguments)))
        yield
        log.append((tag, 'exit', op.__name__))
    return observer


def test_observer_sees_calls_with_their_arguments():
    q, k, v, scale, power = _heads()
    log = []
    expected = ops.polarity_attention(q, k, v, scale, power, 3.0)
    with ops.use_implementation('graph'), observe_calls(_recorder(log, 'a')):
        out = ops.polarity_attention(q, k, v, scale, power, alpha=3.0)
    torch.testing.assert_close(out, expected)
    names = [(e[1], e[2]) for e in log]
    # the op, and inside it the reference it runs with the fast paths off
    assert names == [('enter', 'polarity_attention'),
                     ('enter', 'polarity_attention_pytorch'),
                     ('exit', 'polarity_attention_pytorch'),
                     ('exit', 'polarity_attention')]
    args = log[0][3]
    assert args['q'] is q and args['alpha'] == 3.0
    assert 'k_bias' in args and args['k_bias'] is None  # defaults filled
    assert not _observers  # removed on exit


def test_observers_nest_and_are_removed_after_an_error():
    q, k, v, scale, power = _heads()
    log = []
    with observe_calls(_recorder(log, 'outer')), \
            observe_calls(_recorder(log, 'inner')):
        ops.pacs_attention(q, k, v, torch.zeros(1, 2, 1, 8),
                           torch.zeros(1, 2, 1, 8))
    assert [e[:2] for e in log[:2]] == [('outer', 'enter'),
                                        ('inner', 'enter')]
    assert [e[:2] for e in log[-2:]] == [('inner', 'exit'),
                                         ('outer', 'exit')]
    with pytest.raises(ValueError, match='polarity_attention'):
        with observe_calls(_recorder(log, 'x')):
            ops.polarity_attention(q, k[..., :3], v, scale, power, 3.0)
    assert not _observers


def test_own_function_reports_its_calls():
    @reports_calls
    def my_op(x, factor=2):
        return x * factor

    seen = []

    @contextlib.contextmanager
    def observer(op, arguments):
        seen.append((op, arguments))
        yield

    x = torch.ones(3)
    assert torch.equal(my_op(x), 2 * x)  # unobserved
    with observe_calls(observer):
        my_op(x)
    assert seen == [(my_op, {'x': x, 'factor': 2})]


def test_compiled_op_is_the_plain_function():
    """With no observer, ``torch.compile(fullgraph=True)`` traces through
    the reporting op in one graph (a graph break would raise)."""
    q, k, v, scale, power = _heads()

    def attention(q, k, v):
        return ops.polarity_attention(q, k, v, scale, power, 3.0)

    compiled = torch.compile(attention, backend='eager', fullgraph=True)
    torch.testing.assert_close(compiled(q, k, v), attention(q, k, v))
