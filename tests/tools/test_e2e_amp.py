"""Mixed precision: bf16 autocast on the CPU, and ``--amp`` in the train tool.

There is no GPU here, so ``AmpOptimWrapper`` itself (CUDA-only in mmengine)
is not stepped; the tool's option handling is checked on the config it hands
to the Runner, and the numerics of the backbones under bf16 autocast -- what
AMP changes in the model -- are checked directly.
"""
import os.path as osp

import e2e_data
import pytest
import torch
from helpers import PVT_TINY, SWIN_TINY_DEPTH1

import pola_mm  # noqa: F401
from pola_mm.registry import MODELS

pytestmark = [pytest.mark.slow, pytest.mark.e2e]

BACKBONES = [
    dict(type='PolaSwinTransformer', arch=SWIN_TINY_DEPTH1),
    dict(type='PolaPVT', arch=PVT_TINY),
]


@pytest.mark.parametrize('cfg', BACKBONES, ids=lambda c: c['type'])
def test_backbone_bf16_autocast_forward_backward(cfg):
    torch.manual_seed(0)
    model = MODELS.build(dict(cfg, drop_path_rate=0.0))
    model.init_weights()
    model.train()
    # odd, non-square size: padding paths run under autocast too
    x = torch.randn(2, 3, 72, 104)
    dtypes = set()

    def record(module, inputs, output):
        if isinstance(output, torch.Tensor):
            dtypes.add(output.dtype)

    for module in model.modules():
        module.register_forward_hook(record)
    with torch.autocast('cpu', dtype=torch.bfloat16):
        outs = model(x)
        loss = sum(o.float().pow(2).mean() for o in outs)
    assert len(outs) == 4
    for i, o in enumerate(outs):
        assert torch.isfinite(o.float()).all(), f'output {i} not finite'
    loss.backward()
    grads = [p.grad for p in model.parameters() if p.requires_grad]
    assert all(g is not None for g in grads), 'a parameter got no gradient'
    assert all(torch.isfinite(g).all() for g in grads)
    # autocast really ran layers (convolutions, projections) in bf16
    assert torch.bfloat16 in dtypes, dtypes


@pytest.mark.parametrize('name', [
    'mask_rcnn_pola_swin_t.py', 'upernet_pola_swin_t_ade20k.py',
    'pola_swin_t_in1k.py'
])
def test_amp_flag_selects_amp_optim_wrapper(name):
    from pola_mm.cli.train_test import prepare_train_config, train_parser
    path = osp.join(e2e_data.CONFIGS, name)
    args = train_parser().parse_args([path, '--amp'])
    cfg = prepare_train_config(args)
    assert cfg.optim_wrapper.type == 'AmpOptimWrapper'
    assert cfg.optim_wrapper.loss_scale == 'dynamic'
    # the rest of the recipe is untouched
    plain = prepare_train_config(train_parser().parse_args([path]))
    assert plain.optim_wrapper.get('type', 'OptimWrapper') == 'OptimWrapper'
    assert cfg.optim_wrapper.optimizer == plain.optim_wrapper.optimizer
    assert cfg.optim_wrapper.get('paramwise_cfg') == \
        plain.optim_wrapper.get('paramwise_cfg')
    from mmengine.registry import OPTIM_WRAPPERS
    assert OPTIM_WRAPPERS.get('AmpOptimWrapper') is not None
