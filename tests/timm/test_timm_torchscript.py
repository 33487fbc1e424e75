"""TorchScript (``torch.jit.script``) of pola_mm's timm models, beyond
timm's own test (which checks the output's shape): the compiled model equals
the eager one (whose fast paths run) at a size where the position tables
are resized and the softmax windows padded and shifted, saves and loads
without Python, trains (gradients equal to eager), and rejects a bad input
with a message."""
import pytest
import timm
import torch

import pola_mm.timm  # noqa: F401  (registers the models)

from helpers import randomise

NAMES = ['pola_swin_tiny', 'pola_pvt_tiny', 'polapp_b0']


def _model(name: str) -> torch.nn.Module:
    torch.manual_seed(0)
    model = timm.create_model(name, num_classes=7, drop_path_rate=0.)
    randomise(model, std=0.1)
    return model


def _assert_close(got: torch.Tensor, want: torch.Tensor, tol: float) -> None:
    scale = float(want.abs().max())
    assert scale > 0
    assert float((got - want).abs().max()) <= tol * scale


@pytest.mark.parametrize('name', NAMES)
def test_scripted_model_equals_eager_and_loads_from_file(name, tmp_path):
    model = _model(name).eval()
    x = torch.randn(2, 3, 100, 140)
    with torch.no_grad():
        want = model(x)
    path = str(tmp_path / 'model.pt')
    torch.jit.save(torch.jit.script(model), path)
    loaded = torch.jit.load(path)
    with torch.no_grad():
        got = loaded(x)
    assert got.shape == (2, 7)
    _assert_close(got, want, 1e-5)
    with pytest.raises(Exception, match=r'expects a non-empty image batch'):
        loaded(torch.randn(1, 4, 64, 64))


@pytest.mark.parametrize('name', NAMES)
def test_scripted_model_trains_as_eager(name):
    model = _model(name).train()
    scripted = torch.jit.script(_model(name).train())
    x = torch.randn(2, 3, 64, 96)
    model(x).square().sum().backward()
    scripted(x).square().sum().backward()
    grads = {n: p.grad for n, p in model.named_parameters()}
    top = max(float(g.abs().max()) for g in grads.values())
    assert top > 0
    names = [n for n, _ in scripted.named_parameters()]
    assert sorted(names) == sorted(grads)
    for n, p in scripted.named_parameters():
        want = grads[n]
        assert p.grad is not None, n
        # relative to the parameter's own gradient, or to the model's
        # largest where that is float noise (biases before a BatchNorm)
        tol = 1e-4 * float(want.abs().max()) + 1e-6 * top
        assert float((p.grad - want).abs().max()) <= tol, n
