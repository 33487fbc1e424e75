"""The ImageNet-1k configs state the authors' training recipe."""
import os.path as osp

import pytest
from mmengine.config import Config

CONFIGS = osp.join(osp.dirname(osp.dirname(osp.abspath(__file__))), 'configs')

# name -> (arch, drop path, warm-up epochs, grad clip, images per GPU)
RECIPE = {
    'pola_swin_t_in1k.py': ('tiny', 0.2, 20, 5.0, 128),
    'pola_swin_s_in1k.py': ('small', 0.3, 20, 5.0, 128),
    'pola_swin_b_in1k.py': ('base', 0.5, 20, 5.0, 64),
    'pola_pvt_t_in1k.py': ('tiny', 0.1, 5, None, 128),
    'pola_pvt_s_in1k.py': ('small', 0.1, 5, None, 64),
    'pola_pvt_m_in1k.py': ('medium', 0.3, 5, 1.0, 64),
    'pola_pvt_l_in1k.py': ('large', 0.3, 5, 1.0, 32),
}


def _find(pipeline, kind):
    return [t for t in pipeline if t['type'] == kind]


@pytest.mark.parametrize('name', sorted(RECIPE))
def test_in1k_recipe(name):
    arch, dpr, warmup, clip, per_gpu = RECIPE[name]
    cfg = Config.fromfile(osp.join(CONFIGS, name))
    assert cfg.model.backbone.arch == arch
    assert cfg.model.backbone.drop_path_rate == dpr
    assert cfg.train_dataloader.batch_size == per_gpu
    # lr 5e-4 per 512 images, stated for the 8-GPU batch; --auto-scale-lr
    # rescales from that batch (OpenMMLab convention: off by default)
    total = 8 * per_gpu
    assert cfg.optim_wrapper.optimizer.type == 'AdamW'
    assert cfg.optim_wrapper.optimizer.lr == pytest.approx(5e-4 * total / 512)
    assert cfg.optim_wrapper.optimizer.weight_decay == 0.05
    assert cfg.auto_scale_lr == dict(base_batch_size=total, enable=False)
    assert cfg.optim_wrapper.get('clip_grad') == (
        None if clip is None else dict(max_norm=clip))
    warm, cosine = cfg.param_scheduler
    assert warm.type == 'LinearLR' and warm.end == warmup
    assert cosine.type == 'CosineAnnealingLR' and cosine.begin == warmup
    assert cfg.train_cfg.max_epochs == 300
    assert cfg.model.head.loss.label_smooth_val == 0.1
    augments = {a['type']: a['alpha'] for a in cfg.model.train_cfg.augments}
    assert augments == {'Mixup': 0.8, 'CutMix': 1.0}
    pipe = cfg.train_dataloader.dataset.pipeline
    assert _find(pipe, 'RandAugment')[0].magnitude_level == 9
    assert _find(pipe, 'RandomErasing')[0].erase_prob == 0.25
    keys = cfg.optim_wrapper.paramwise_cfg.custom_keys
    for key in ('positional_encoding', 'pos_embed',
                'relative_position_bias_table', 'power', 'scale'):
        assert any(key in k and v.decay_mult == 0 for k, v in keys.items())
