"""The kernels inside compiled models: under ``torch.compile`` each launch
stays an opaque custom op of the graph, in the forward and the backward
graph; a configuration whose kernels fail on this GPU is found while the
graph is traced (one run on small inputs), and the graph takes the formula
instead, with the same training."""
import warnings

import pytest
import torch
from helpers import FailingKernel, attention_training_losses

from pola_mm.models.layers import PaCSAttention, PolarityAttention
from pola_mm.ops import dispatch, launch
from pola_mm.ops.pacs import triton as pacs_kernels
from pola_mm.ops.polarity import triton as polarity_kernels

pytest.importorskip('triton')
from torch._dynamo.backends.common import aot_autograd  # noqa: E402
from triton.runtime.errors import OutOfResources  # noqa: E402

pytestmark = pytest.mark.kernels

KERNEL_OPS = {
    'polarity': ({'polarity_key_pass', 'polarity_query_pass'},
                 {'polarity_query_grad', 'polarity_key_grad'}),
    'pacs': ({'pacs_key_pass', 'pacs_query_pass'},
             {'pacs_query_grad', 'pacs_key_grad'}),
}


def _recording_backend():
    """An AOT backend that records the pola_mm ops of the forward and
    backward graphs and runs them eagerly."""
    seen = {'forward': set(), 'backward': set()}

    def compiler(which):
        def compile_(gm, example_inputs):
            seen[which] |= {
                str(n.target).split('.')[1] for n in gm.graph.nodes
                if str(n.target).startswith('pola_mm.')}
            from functorch.compile import make_boxed_func
            return make_boxed_func(gm.forward)
        return compile_

    return aot_autograd(fw_compiler=compiler('forward'),
                        bw_compiler=compiler('backward')), seen


@pytest.fixture(autouse=True)
def _fresh():
    torch._dynamo.reset()
    launch.forget_failures()
    yield
    torch._dynamo.reset()
    launch.forget_failures()


@pytest.mark.parametrize('op', sorted(KERNEL_OPS))
def test_compiled_training_step_holds_the_kernel_ops(op):
    """On ``meta`` tensors (standing for a GPU): the forward graph holds
    the forward passes, the backward graph the backward passes."""
    torch.manual_seed(0)
    layer = (PolarityAttention(64, 2, ref_hw=(5, 6)) if op == 'polarity'
             else PaCSAttention(64, 2)).to('meta')
    backend, seen = _recording_backend()
    compiled = torch.compile(layer, backend=backend, fullgraph=True)
    x = torch.empty(2, 30, 64, device='meta', requires_grad=True)
    compiled(x, (5, 6)).sum().backward()
    forward, backward = KERNEL_OPS[op]
    assert seen['forward'] == forward, seen
    assert seen['backward'] == backward, seen


def _train(compiled: bool, steps: int = 3):
    torch.manual_seed(0)
    layer = PolarityAttention(64, 2, ref_hw=(5, 6))
    backend, seen = _recording_backend()
    run = (torch.compile(layer, backend=backend, fullgraph=True)
           if compiled else layer)
    return attention_training_losses(layer, run, steps), seen


def test_compiled_kernels_train_as_the_torch_path():
    """The interpreted kernels inside a compiled training loop (the setting
    ``triton`` on CPU tensors) give the torch path's losses."""
    with dispatch.use_implementation('triton'):
        losses, seen = _train(compiled=True)
    assert seen['forward'] == KERNEL_OPS['polarity'][0]
    with dispatch.use_implementation('cpu'):
        want, _ = _train(compiled=False)
    torch.testing.assert_close(losses, want, rtol=1e-5, atol=0)


def test_a_failing_configuration_is_found_while_tracing(monkeypatch):
    """A backward kernel that fails here: the probe at trace time finds it
    (one warning), the compiled graph holds no kernel op, training equals
    the torch path's."""
    failing = FailingKernel(OutOfResources(232448, 101376,
                                           'shared memory'))
    monkeypatch.setattr(polarity_kernels, '_query_grad', failing)
    with dispatch.use_implementation('triton'), \
            warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter('always')
        losses, seen = _train(compiled=True)
    fallbacks = [w for w in caught
                 if issubclass(w.category, launch.KernelFallbackWarning)]
    assert len(fallbacks) == 1 and failing.calls == 1
    assert seen['forward'] == set() and seen['backward'] == set()
    monkeypatch.undo()
    with dispatch.use_implementation('cpu'):
        want, _ = _train(compiled=False)
    torch.testing.assert_close(losses, want, rtol=1e-5, atol=0)


def test_pola_swin_t_compiled_training_step_holds_every_kernel_op():
    """Pola-Swin-T on ``meta`` (standing for a GPU), one compiled graph
    (``fullgraph``): each polarity attention of the model launches its four
    kernels inside the compiled forward and backward graphs."""
    from pola_mm.analysis.zoo import build
    from pola_mm.models.layers import PolarityAttention
    model = build('pola_swin_t').model.to('meta').train()
    layers = sum(isinstance(m, PolarityAttention) for m in model.modules())
    counts = {'forward': {}, 'backward': {}}

    def compiler(which):
        def compile_(gm, example_inputs):
            for n in gm.graph.nodes:
                name = str(n.target)
                if name.startswith('pola_mm.'):
                    name = name.split('.')[1]
                    counts[which][name] = counts[which].get(name, 0) + 1
            from functorch.compile import make_boxed_func
            return make_boxed_func(gm.forward)
        return compile_

    compiled = torch.compile(
        model, fullgraph=True,
        backend=aot_autograd(fw_compiler=compiler('forward'),
                             bw_compiler=compiler('backward')))
    outs = compiled(torch.empty(2, 3, 224, 224, device='meta'))
    sum(o.sum() for o in outs).backward()
    assert layers == 4
    forward, backward = KERNEL_OPS['polarity']
    assert counts['forward'] == dict.fromkeys(forward, layers), counts
    assert counts['backward'] == dict.fromkeys(backward, layers), counts


@pytest.mark.parametrize('flag', [False, True])
@pytest.mark.parametrize('module,kernel', [
    (polarity_kernels, '_query_grad'), (pacs_kernels, '_bwd_queries_kernel')
])
def test_each_probe_runs_its_configuration(module, kernel, flag,
                                           monkeypatch):
    """An op's probe runs its kernels, forward and backward, on small
    inputs of the configuration (polarity's key bias, PaCS's rotary map
    and scaled keys as flagged), as the trace-time check runs it (under
    ``guarded``): the configuration passes, and fails where its backward
    kernel fails."""
    q = torch.empty(1, 2, 80, 32)
    if module is polarity_kernels:
        key = module.config(q, torch.empty(1, 2, 80, 32) if flag else None)
    else:
        key = module.config(q, (8, 10) if flag else None, flag)
    assert dict(key[4:]) in ({'k_bias': flag},
                             {'rotary': flag, 'scaled': flag})
    failing = FailingKernel(OutOfResources(1, 0, 'shared memory'))
    real = getattr(module, kernel)

    class Counting:  # the real kernel, counting its launches

        def __getitem__(self, grid):
            failing.calls += 1
            return real[grid]

    monkeypatch.setattr(module, kernel, Counting())
    launch.guarded(key, lambda: module.probe(key), lambda: None)
    assert not launch.failed(key) and failing.calls == 1
    monkeypatch.setattr(module, kernel, failing)
    with warnings.catch_warnings():
        warnings.simplefilter('ignore', launch.KernelFallbackWarning)
        launch.guarded(key, lambda: module.probe(key), lambda: None)
    assert launch.failed(key) and failing.calls == 2
