"""A kernel configuration that fails on the user's GPU never ends a run
(:func:`pola_mm.ops.launch.guarded`): one warning naming the configuration
and the switch, the torch implementation for that configuration from then
on, and the same training.

The kernels run under Triton's interpreter on CPU tensors (the conftest),
where the setting ``triton`` takes them;
the failures are injected where a GPU raises them: at the launch of one
kernel (Triton compiles at the first launch), as ``OutOfResources`` (a
launch over the shared-memory limit) and as a ``CompilationError``."""
import warnings

import pytest
import torch
from helpers import FailingKernel, attention_training_losses

from pola_mm.models.layers import PaCSAttention, PolarityAttention
from pola_mm.ops import dispatch, launch
from pola_mm.ops.pacs import triton as pacs_kernels
from pola_mm.ops.polarity import triton as polarity_kernels

triton = pytest.importorskip('triton')
from triton.compiler.errors import CompilationError  # noqa: E402
from triton.runtime.errors import OutOfResources  # noqa: E402

pytestmark = pytest.mark.kernels

ERRORS = {
    'out_of_resources':
    lambda: OutOfResources(232448, 101376, 'shared memory'),
    'compile_error':
    lambda: CompilationError(None, None, 'PassManager::run failed'),
}
#: The Triton kernel objects of each op: the first launch of the forward
#: and of the backward.
KERNELS = {
    'polarity': (polarity_kernels, '_key_pass', '_query_grad'),
    'pacs': (pacs_kernels, '_fwd_keys_kernel', '_bwd_queries_kernel'),
}


@pytest.fixture
def kernels_on_cpu():
    """The dispatch takes the (interpreted) kernels on CPU tensors; no
    failure remembered before or after."""
    launch.forget_failures()
    with dispatch.use_implementation('triton'):
        yield
    launch.forget_failures()


def _model(op: str) -> torch.nn.Module:
    torch.manual_seed(0)
    if op == 'polarity':
        return PolarityAttention(64, 2, ref_hw=(5, 6))
    return PaCSAttention(64, 2)


def _train(op: str, steps: int = 3):
    """Losses of a few SGD steps of one attention layer fitting a fixed
    target (heads of width 32)."""
    return attention_training_losses(_model(op), steps=steps)


@pytest.mark.parametrize('op', sorted(KERNELS))
def test_the_fixture_runs_the_kernels(op, kernels_on_cpu, monkeypatch):
    """Without a failure the layer trains on the kernels themselves, as
    the torch path does (the routing the other tests rely on)."""
    module, forward, backward = KERNELS[op]
    seen = []
    for name in (forward, backward):
        real = getattr(module, name)

        class Spy:

            def __getitem__(self, grid, real=real, name=name):
                seen.append(name)
                return real[grid]

        monkeypatch.setattr(module, name, Spy())
    with warnings.catch_warnings():
        warnings.simplefilter('error', launch.KernelFallbackWarning)
        losses = _train(op)
    assert set(seen) == {forward, backward}
    monkeypatch.undo()
    with dispatch.use_implementation('cpu'):
        torch.testing.assert_close(losses, _train(op), rtol=1e-5, atol=0)


@pytest.mark.parametrize('error', sorted(ERRORS))
@pytest.mark.parametrize('where', ['forward', 'backward'])
@pytest.mark.parametrize('op', sorted(KERNELS))
def test_a_failing_kernel_falls_back_once(op, where, error, kernels_on_cpu,
                                          monkeypatch):
    """The run continues with the torch path's losses; one warning that
    names the configuration and the switch; the failed kernel is not tried
    again."""
    module, forward, backward = KERNELS[op]
    failing = FailingKernel(ERRORS[error]())
    monkeypatch.setattr(module, forward if where == 'forward' else backward,
                        failing)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter('always')
        losses = _train(op)
    fallbacks = [w for w in caught
                 if issubclass(w.category, launch.KernelFallbackWarning)]
    assert len(fallbacks) == 1, [str(w.message) for w in caught]
    message = str(fallbacks[0].message)
    assert f'{op} Triton kernels' in message and 'd=32' in message
    assert 'torch.float32' in message and 'POLA_MM_OPS' in message
    assert failing.calls == 1
    with dispatch.use_implementation('cpu'):  # the reference: torch path
        torch.testing.assert_close(losses, _train(op), rtol=1e-5, atol=0)


def test_other_errors_are_not_swallowed(kernels_on_cpu, monkeypatch):
    """Errors that are not the GPU's (a bug, out of memory) reach the
    caller and are not remembered as a failed configuration."""
    for error in (ValueError('a bug'),
                  torch.cuda.OutOfMemoryError('out of memory')):
        monkeypatch.setattr(polarity_kernels, '_key_pass',
                            FailingKernel(error))
        with pytest.raises(type(error)):
            _train('polarity', steps=1)
        assert not launch._failed


def test_device_admits_checked_gpus_only(monkeypatch):
    """The kernels run on compute capability >= 8.0 with the 99 KB class's
    shared memory or more; older GPUs take the torch path."""
    cuda = torch.device('cuda', 0)
    monkeypatch.setattr(torch.cuda, 'is_available', lambda: True)
    for target, admitted in ((launch.TARGETS['sm_86'], True),
                             (launch.TARGETS['sm_90'], True),
                             (launch.Target((7, 5), 64 * 1024), False),
                             (launch.Target((7, 0), 96 * 1024), False),
                             (launch.Target((8, 7), 48 * 1024), False)):
        with launch.compiling_for(target):
            assert launch.device_admits(cuda) is admitted, target
    assert launch.device_admits(torch.device('meta'))
    assert not launch.device_admits(torch.device('cpu'))
