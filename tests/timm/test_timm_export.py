"""What torch recommends in place of TorchScript (``torch.jit.script`` is
deprecated in torch 2.14), on pola_mm's timm models: ``torch.export``
captures the plain formula of each family and the exported program equals
the eager model."""
import pytest
import timm
import torch

import pola_mm.timm  # noqa: F401  (registers the models)
from pola_mm.ops import dispatch

from helpers import randomise


@pytest.mark.parametrize('name', ['pola_swin_tiny', 'pola_pvt_tiny',
                                  'polapp_b0'])
def test_torch_export_equals_eager(monkeypatch, name):
    torch.manual_seed(0)
    model = timm.create_model(name, num_classes=7).eval()
    randomise(model, std=0.1)
    x = torch.randn(1, 3, 96, 128)
    with torch.no_grad():
        want = model(x)
    kernels = []
    real = dispatch.select

    def spy(*args):
        path = real(*args)
        kernels.append(path.kernels)
        return path

    monkeypatch.setattr(dispatch, 'select', spy)
    program = torch.export.export(model, (x, ))
    assert kernels and not any(kernels)  # the plain formula was captured
    with torch.no_grad():
        got = program.module()(x)
    assert got.shape == (1, 7)
    scale = float(want.abs().max())
    assert float((got - want).abs().max()) <= 1e-5 * scale
