"""CUDA checks (run by ``make gpu-check``; skipped without a GPU).

- every backbone's forward and backward on CUDA against the CPU reference
  (float32, TF32 off), at an odd, non-square size;
- mixed precision through mmengine's ``AmpOptimWrapper`` (fp16 with
  dynamic loss scale, bf16);
- one training step of a real config (Mask R-CNN with the full Pola-Swin-T)
  through mmengine's Runner on a small synthetic COCO set;
- the meta / fake-CUDA activation estimate
  (:mod:`pola_mm.analysis.train_memory`) against ``memory_allocated`` after
  a real CUDA forward.
"""
import copy
import math

import helpers
import pytest
import torch

pytestmark = [
    pytest.mark.gpu, pytest.mark.slow,
    pytest.mark.skipif(
        not torch.cuda.is_available(),
        reason='needs a CUDA GPU (torch.cuda.is_available() is False)')]

BACKBONES = {
    'pola_swin': dict(type='PolaSwinTransformer',
                      arch=helpers.SWIN_TINY_DEPTH2),
    'pola_swin_pacs': dict(type='PolaSwinTransformer',
                           arch=helpers.SWIN_TINY_DEPTH2, feature_map='pacs'),
    'pola_pvt': dict(type='PolaPVT', arch=helpers.PVT_TINY),
    'polapp': dict(type='PolaPP', arch=dict(
        embed_dims=(16, 32, 64, 64), depths=(1, 1, 1, 1),
        num_heads=(1, 1, 2, 2))),
}


@pytest.fixture(autouse=True)
def _no_tf32():
    """Exact float32 matrix products for the CPU comparison."""
    prev = (torch.backends.cuda.matmul.allow_tf32,
            torch.backends.cudnn.allow_tf32)
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    yield
    torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 \
        = prev


def _build(cfg: dict) -> torch.nn.Module:
    import pola_mm  # noqa: F401
    from pola_mm.registry import MODELS
    torch.manual_seed(0)
    model = MODELS.build(dict(cfg, drop_path_rate=0.0))
    model.init_weights()
    helpers.randomise_attention(model)
    model.train()
    return model


def _step(model: torch.nn.Module, x: torch.Tensor):
    outs = model(x)
    loss = sum(o.float().pow(2).mean() for o in outs)
    loss.backward()
    grads = {n: p.grad for n, p in model.named_parameters()
             if p.requires_grad}
    return [o.detach() for o in outs], grads


@pytest.mark.parametrize('name', sorted(BACKBONES))
def test_backbone_cuda_matches_cpu(name):
    cpu = _build(BACKBONES[name])
    gpu = copy.deepcopy(cpu).cuda()
    x = torch.randn(2, 3, 75, 109, generator=torch.Generator().manual_seed(0))
    outs_c, grads_c = _step(cpu, x)
    outs_g, grads_g = _step(gpu, x.cuda())
    assert len(outs_c) == len(outs_g) == 4
    for i, (a, b) in enumerate(zip(outs_c, outs_g)):
        assert b.is_cuda and a.shape == b.shape
        torch.testing.assert_close(b.cpu(), a, rtol=1e-4, atol=1e-4,
                                   msg=f'{name} output {i}')
    assert grads_c.keys() == grads_g.keys()
    assert all(g is not None for g in grads_c.values())
    # gradients span orders of magnitude (BatchNorm'd stems get ~1e-6):
    # each agrees to 2e-5 of the largest gradient (CPU fast vs plain paths
    # differ by ~2e-7 of it) and to 1e-3 relative
    scale = max(float(g.abs().max()) for g in grads_c.values())
    for n, g in grads_c.items():
        assert grads_g[n] is not None, n
        torch.testing.assert_close(grads_g[n].cpu(), g, rtol=1e-3,
                                   atol=2e-5 * scale,
                                   msg=f'{name} grad of {n}')


@pytest.mark.parametrize('dtype', ['float16', 'bfloat16'])
@pytest.mark.parametrize('name', ['pola_swin', 'pola_pvt', 'polapp'])
def test_amp_optim_wrapper_trains(name, dtype):
    from mmengine.optim import AmpOptimWrapper
    model = _build(BACKBONES[name]).cuda()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    wrapper = AmpOptimWrapper(optimizer=opt, loss_scale='dynamic',
                              dtype=getattr(torch, dtype))
    x = torch.randn(2, 3, 96, 128, device='cuda')
    target = [torch.zeros(()) for _ in range(4)]
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    seen = set()  # output dtypes of the Linear layers: autocast ran them
    hooks = [m.register_forward_hook(lambda m, i, o: seen.add(o.dtype))
             for m in model.modules() if isinstance(m, torch.nn.Linear)]
    losses = []
    for _ in range(5):
        with wrapper.optim_context(model):
            outs = model(x)
            loss = sum((o.float() - t.cuda()).pow(2).mean()
                       for o, t in zip(outs, target))
        wrapper.update_params(loss)
        losses.append(float(loss))
    for h in hooks:
        h.remove()
    assert all(math.isfinite(v) for v in losses), losses
    assert losses[-1] < losses[0], losses
    assert seen == {getattr(torch, dtype)}, seen
    moved = [n for n, p in model.named_parameters()
             if not torch.equal(p.detach(), before[n])]
    assert len(moved) == len(before), set(before) - set(moved)


def test_one_training_step_of_a_real_config(tmp_path):
    """Mask R-CNN with the full Pola-Swin-T (the config as shipped; only
    the data, the schedule length and logging are changed), AMP."""
    import e2e_data
    from mmengine.runner import Runner
    data = e2e_data.make_coco(str(tmp_path / 'coco'), num_images=2,
                              size=256)
    cfg = e2e_data.load('mask_rcnn_pola_swin_t.py')
    cfg.work_dir = str(tmp_path / 'work')
    for loader in (cfg.train_dataloader, cfg.val_dataloader,
                   cfg.test_dataloader):
        e2e_data.no_workers(loader)
        ds = loader.dataset
        ds.data_root = data['data_root']
        ds.ann_file = data['ann_file']
        ds.data_prefix = dict(img=data['img_prefix'])
        ds.metainfo = dict(classes=e2e_data.COCO_NAMES)
        if 'filter_cfg' in ds:
            ds.filter_cfg = dict(filter_empty_gt=True, min_size=4)
    cfg.test_evaluator.ann_file = data['ann_file']
    cfg.train_dataloader.batch_size = 2
    cfg.train_dataloader.pop('batch_sampler', None)
    cfg.train_cfg.max_epochs = 1
    # no validation (mmengine validates after the last epoch)
    cfg.val_cfg = cfg.val_dataloader = cfg.val_evaluator = None
    cfg.model.backbone.init_cfg = None
    cfg.optim_wrapper.type = 'AmpOptimWrapper'
    cfg.optim_wrapper.loss_scale = 'dynamic'
    cfg.default_hooks.pop('visualization', None)
    cfg.default_hooks.checkpoint.interval = 2
    runner = Runner.from_cfg(cfg)
    losses = []

    from mmengine.hooks import Hook

    class Record(Hook):
        def after_train_iter(self, runner, batch_idx, data_batch=None,
                             outputs=None):
            losses.append(float(outputs['loss']))

    runner.register_hook(Record(), priority='VERY_LOW')
    model = runner.model
    runner.train()
    assert len(losses) == 1 and math.isfinite(losses[0]), losses
    assert next(model.parameters()).is_cuda


@pytest.mark.parametrize('name', ['pola_swin_t', 'swin_t', 'pola_pvt_t'])
def test_memory_estimate_matches_cuda(name):
    """The fake-CUDA count (saved for backward + outputs) against what the
    allocator holds after a real forward: allocator rounding and small
    temporaries aside, the same bytes."""
    from pola_mm.analysis.train_memory import cuda_memory_check
    r = cuda_memory_check(name, batch=2, hw=(256, 320), precision='fp32')
    assert r['estimate'] > 0
    assert 0.95 <= r['ratio'] <= 1.10, r
    assert r['peak_step'] >= r['held_after_forward']
