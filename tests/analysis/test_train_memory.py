"""The training-memory mode (pola_mm.analysis.train_memory): the count on
meta / fake CUDA tensors against the same hooks on a real CPU forward, the
dedupe of views, mixed precision, and the CLI on a tiny arch."""
import json
import os.path as osp
import subprocess
import sys

import helpers
import pytest
import torch
import torch.nn as nn

from pola_mm.analysis.train_memory import (MemoryReport, measure,
                                           measure_saved, stage_of)
from pola_mm.analysis.zoo import build, counterpart

pytestmark = pytest.mark.slow

TINY_SWIN = dict(type='PolaSwinTransformer', arch=helpers.SWIN_TINY_DEPTH2,
                 drop_path_rate=0.0)
TINY_PVT = dict(type='PolaPVT', arch=helpers.PVT_TINY, drop_path_rate=0.0)


def _keyed(r: MemoryReport):
    # (not the op: the CPU path saves the same storages through other ops,
    # e.g. its own depth-wise conv function, explicit softmax for SDPA)
    return sorted((s.module, s.shape, s.dtype, s.nbytes) for s in r.saved)


@pytest.mark.parametrize('spec', [TINY_SWIN, TINY_PVT], ids=['swin', 'pvt'])
def test_meta_count_equals_real_cpu_forward(spec):
    """Odd, non-square input (padding, resized position tables): the meta
    count is the real CPU forward's, storage by storage, on the same code
    (the plain references: with the fast paths on, the ops pick their
    implementation by device, and the CPU's differs from the others')."""
    spec = dict(spec, _fast_paths_=False)
    cpu = measure(spec, 2, (65, 97), 'fp32', 'cpu')
    meta = measure(spec, 2, (65, 97), 'fp32', 'meta')
    assert cpu.total > 0
    assert meta.total == cpu.total
    assert _keyed(meta) == _keyed(cpu)
    assert list(meta.by_stage()) == ['stage1', 'stage2', 'stage3', 'stage4']
    # parameters, buffers and the input are not counted, but reported
    model = _built(spec)
    state = list(model.parameters()) + list(model.buffers())
    assert meta.param_bytes == sum(t.numel() * t.element_size()
                                   for t in state)
    assert meta.input_bytes == 2 * 3 * 65 * 97 * 4


def _built(spec):
    return build(spec).model


class _TwoViews(nn.Module):
    """Saves two views of one storage (``mul`` of the halves of a Linear's
    output), a plain tensor twice, and a branch whose graph is dropped."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(8, 16)

    def forward(self, x):
        y = self.lin(x)  # saves x (an input) and nothing else of its own
        a, b = y.chunk(2, dim=-1)  # two views of y's storage
        z = a * b  # saves a and b
        w = torch.sigmoid(z)  # saves its output w
        _ = torch.exp(w * 3)  # graph dropped at once (freed)
        return w * w  # saves w twice


@pytest.mark.parametrize('device', ['cpu', 'meta'])
def test_views_of_one_storage_count_once(device):
    model = _TwoViews().to(device)
    x = torch.zeros(4, 5, 8, device=device)
    saved, extra = measure_saved(model, [x])
    y_bytes = 4 * 5 * 16 * 4  # the Linear's output, whole
    w_bytes = 4 * 5 * 8 * 4
    assert sorted(s.nbytes for s in saved) == sorted([y_bytes, w_bytes])
    y_rec = next(s for s in saved if s.nbytes == y_bytes)
    assert y_rec.shape == (4, 5, 8)  # a view; its whole storage counted
    assert y_rec.op == 'mul'
    # the dropped branch (w * 3 saved nothing, exp saved its output)
    assert extra['freed'] == w_bytes
    assert extra['input'] == x.numel() * 4
    assert extra['param'] == sum(p.numel() * 4 for p in model.parameters())


def test_fake_cuda_takes_cuda_autocast():
    """fp16 on the fake CUDA device is CUDA's autocast: Linear inputs are
    saved in fp16, the polarity kernel keeps q, k, v as the fp16 views of
    the projection output (one 4C-wide storage, no float32 copies) and its
    float32 output, and less is saved than in float32 (at a size where
    activations outweigh the fp16 weight copies autocast keeps)."""
    fp32 = measure(TINY_SWIN, 2, (256, 384), 'fp32', 'cuda')
    fp16 = measure(TINY_SWIN, 2, (256, 384), 'fp16', 'cuda')
    assert fp16.device == 'cuda' and fp16.total < fp32.total
    lin = [s for s in fp16.saved if s.op == 'linear']
    assert lin and all(s.dtype == 'float16' for s in lin)
    kern = [s for s in fp16.saved if s.module.endswith('blocks.0.attn')
            and s.op == '(autograd.Function)' and len(s.shape) == 4]
    assert kern and {s.dtype for s in kern} == {'float16', 'float32'}
    half = [s for s in kern if s.dtype == 'float16']  # one per stage
    assert half and all(  # (B, h, N, d) view of a (B, N, 4 h d) storage
        s.nbytes == 4 * s.shape[0] * s.shape[1] * s.shape[2] * s.shape[3] * 2
        for s in half)
    assert not any(s.dtype in ('float16', 'bfloat16') for s in fp32.saved)


def test_stage_of_maps_every_family():
    assert stage_of('patch_embed.projection') == 'stage1'
    assert stage_of('layers.2.blocks.0.attn') == 'stage3'  # Pola-Swin
    assert stage_of('stages.1.downsample') == 'stage2'  # mmdet Swin
    assert stage_of('norm3') == 'stage4'
    assert stage_of('block1.0.attn.qg') == 'stage1'  # Pola-PVT, 1-based
    assert stage_of('patch_embed4.proj') == 'stage4'
    assert stage_of('backbone.layers.0.1.attn') == 'stage1'
    assert stage_of('neck.lateral_convs.0') == 'neck'
    assert stage_of('') == '(top)'


def test_counterparts():
    swin = counterpart('pola_swin_t')
    assert swin['type'] == 'SwinTransformer' and swin['window_size'] == 7
    assert tuple(swin['depths']) == (2, 2, 6, 2)
    pvt = counterpart('pola_pvt_t')
    assert pvt['type'] == 'PyramidVisionTransformer'
    assert pvt['embed_dims'] * pvt['num_heads'][2] == 320
    assert counterpart(dict(type='ResNet', depth=18)) is None


def test_bad_arguments_raise_one_line():
    with pytest.raises(ValueError, match='precision must be one of'):
        measure(TINY_SWIN, 2, (64, 64), 'fp8', 'meta')
    with pytest.raises(ValueError, match='batch must be >= 1'):
        measure(TINY_SWIN, 0, (64, 64), 'fp32', 'meta')
    with pytest.raises(KeyError, match='unknown model'):
        measure('pola_swin_x', 1, (64, 64), 'fp32', 'meta')


def test_cli_tiny_arch(tmp_path):
    """A config whose model is a tiny Pola-Swin: the table against mmdet's
    Swin, the per-module listing and the JSON."""
    cfg = tmp_path / 'tiny.py'
    cfg.write_text(f"default_scope = 'pola_mm'\nmodel = {TINY_SWIN!r}\n")
    out_json = tmp_path / 'mem.json'
    cmd = [sys.executable,
           osp.join(helpers.REPO, 'tools', 'analysis', 'train_memory.py'),
           str(cfg), '--batch', '2', '--shape', '64', '96', '--amp', 'fp16',
           '--per-module', 'layers.0.blocks.0', '--json', str(out_json)]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=300,
                         env=_env())
    assert res.returncode == 0, res.stderr[-2000:]
    assert '| **total** |' in res.stdout and 'SwinTransformer' in res.stdout
    assert 'layers.0.blocks.0.attn' in res.stdout
    data = json.loads(out_json.read_text())
    assert [d['name'] for d in data][1] == 'SwinTransformer'
    pola, soft = data
    assert pola['precision'] == 'fp16' and pola['total'] > 0
    assert soft['total'] > 0
    row = next(line for line in res.stdout.splitlines()
               if line.startswith('| **total** |'))
    ratio = float(row.strip('| ').split('|')[-1])
    assert ratio == pytest.approx(pola['total'] / soft['total'], abs=0.006)
    bad = subprocess.run(cmd[:2] + ['no_such_model'], capture_output=True,
                         text=True, timeout=120, env=_env())
    assert bad.returncode != 0
    assert bad.stderr.strip().splitlines()[-1].startswith(
        'error: unknown model')


def _env():
    import os
    env = dict(os.environ, POLA_MM_CPU_EXT='0')
    env['PYTHONPATH'] = helpers.REPO + os.pathsep + env.get('PYTHONPATH', '')
    return env
