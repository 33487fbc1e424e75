"""What ``python -m pola_mm.deployment.pytorch2onnx`` does when told
little: the input size of the config's test pipeline, a file under
``work_dirs/``, random weights that are seeded (the same seed, the same
file), said in one line and saved on request."""
import os.path as osp

import numpy as np
import pytest
import torch
from helpers import REPO

from pola_mm.deployment import (ExportError, ExportInputError,
                                config_test_size, default_onnx_path,
                                export_and_verify)

pytest.importorskip('onnxruntime')

pytestmark = [pytest.mark.slow, pytest.mark.export]

CONFIGS = osp.join(REPO, 'configs')
#: the shipped demo detector: a small Pola-Swin, tested at 128x128
DEMO = osp.join(CONFIGS, 'demo', 'mask_rcnn_pola_swin_shapes.py')
#: ``--cfg-options`` of a tiny Pola-Swin in the flagship detector config
TINY_SWIN = [
    'model.backbone.arch._delete_=True', 'model.backbone.arch.embed_dims=16',
    'model.backbone.arch.depths=[1,1,1,1]',
    'model.backbone.arch.num_heads=[1,1,2,2]']


@pytest.fixture(scope='module')
def tool():
    """The export tool, ``python -m pola_mm.deployment.pytorch2onnx``."""
    from pola_mm.deployment import pytorch2onnx
    return pytorch2onnx


@pytest.mark.parametrize('config,size', [
    ('mask_rcnn_pola_swin_t.py', (800, 1344)),  # (1333, 800), padded by 32
    ('pola_pvt_t_in1k.py', (224, 224)),  # Resize 256, CenterCrop 224
    ('pola_swin_b_384_in1k.py', (384, 384)),
    ('upernet_pola_swin_t_ade20k.py', (512, 2048)),
    ('demo/mask_rcnn_pola_swin_shapes.py', (128, 128)),
])
def test_test_size_of_the_config(config, size):
    assert config_test_size(osp.join(CONFIGS, config)) == size


def test_test_size_follows_cfg_options():
    assert config_test_size(osp.join(CONFIGS, 'pola_pvt_t_in1k.py'), {
        'test_dataloader.dataset.pipeline.2.crop_size': 160}) == (160, 160)


def test_a_config_without_a_test_size_says_pass_shape(tmp_path):
    cfg = tmp_path / 'bare.py'
    cfg.write_text("model = dict(type='ImageClassifier', "
                   "backbone=dict(type='PolaPVT'))\n")
    with pytest.raises(ExportInputError, match='pass --shape H W'):
        config_test_size(str(cfg))


def test_default_out_is_under_work_dirs():
    assert default_onnx_path('configs/retinanet_pola_pvt_t.py') == osp.join(
        'work_dirs', 'retinanet_pola_pvt_t',
        'retinanet_pola_pvt_t_backbone.onnx')
    assert default_onnx_path(DEMO, whole=True).endswith(
        osp.join('mask_rcnn_pola_swin_shapes',
                 'mask_rcnn_pola_swin_shapes_whole.onnx'))


def test_dynamic_with_no_other_argument(tmp_path, monkeypatch, capsys, tool):
    """``pytorch2onnx.py CONFIG --dynamic``: the config's test size
    (128x128), a file under ./work_dirs named after the config, the random
    weights said to be random and seeded; verified as every dynamic
    export, by the default (dynamo) exporter."""
    monkeypatch.chdir(tmp_path)
    rc = tool.main([DEMO, '--dynamic'])
    out, err = capsys.readouterr()
    assert rc == 0, err
    path = osp.join('work_dirs', 'mask_rcnn_pola_swin_shapes',
                    'mask_rcnn_pola_swin_shapes_backbone.onnx')
    assert (tmp_path / path).is_file()
    lines = out.splitlines()
    assert 'shape: 128x128, the test size of the config (--shape H W for ' \
        'another)' in lines
    assert f'out: {path} (--out FILE for another)' in lines
    weights = [ln for ln in lines if ln.startswith('weights: ')]
    assert weights == [f'weights: random, seeded (--seed 0); --save-weights '
                       f'writes them to {path[:-len(".onnx")]}.pth']
    assert f'{path}: PolaSwinTransformer exported at 128x128' in out
    assert 'dynamic batch, height and width' in out
    assert 'values compared per runtime' in out
    assert 'note: torch.export' not in err
    assert '(dynamo exporter, dynamic batch' in out


def _run_ort(path: str, x: np.ndarray) -> list:
    import onnxruntime as ort
    sess = ort.InferenceSession(path, providers=['CPUExecutionProvider'])
    return sess.run(None, {'input': x})


def test_the_same_seed_gives_the_same_file(tmp_path, capsys, tool):
    """Without CKPT: two runs with one seed write equal files (their
    outputs equal bit for bit), another seed another model; the weights
    saved with --save-weights are the file's: exported again as CKPT they
    give the same outputs."""
    def export(name: str, *extra: str) -> str:
        out = str(tmp_path / f'{name}.onnx')
        rc = tool.main([osp.join(CONFIGS, 'mask_rcnn_pola_swin_t.py'),
                        *extra, '--shape', '64', '96', '--out', out,
                        '--exporter', 'torchscript', '--cfg-options',
                        *TINY_SWIN])
        assert rc == 0, capsys.readouterr().err
        return out

    x = np.random.default_rng(0).standard_normal(
        (1, 3, 64, 96)).astype(np.float32)
    first = _run_ort(export('a', '--save-weights'), x)
    printed = capsys.readouterr().out
    saved = str(tmp_path / 'a.pth')
    assert (f'weights: random, seeded (--seed 0); saved to {saved}'
            in printed.splitlines())
    again = _run_ort(export('b'), x)
    other = _run_ort(export('c', '--seed', '1'), x)
    for f, a, o in zip(first, again, other):
        np.testing.assert_array_equal(f, a)
        assert not np.allclose(f, o)
    with open(tmp_path / 'a.onnx', 'rb') as fa, \
            open(tmp_path / 'b.onnx', 'rb') as fb:
        assert fa.read() == fb.read()
    state = torch.load(saved, map_location='cpu', weights_only=True)
    assert set(state) == {'state_dict'}
    reloaded = _run_ort(export('d', saved, '--seed', '5'), x)
    for f, r in zip(first, reloaded):
        np.testing.assert_allclose(r, f, rtol=0, atol=1e-6)
    assert f'weights: checkpoint {saved}' in capsys.readouterr().out


class _Empty(torch.nn.Module):
    """A model whose only output has no element."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x[:, :0] * 2


def test_an_export_of_nothing_is_not_verified(tmp_path):
    """A file whose every output is empty compares nothing: refused, not
    written."""
    out = tmp_path / 'empty.onnx'
    with pytest.raises(ExportError, match='nothing to compare'):
        export_and_verify(_Empty(), (8, 8), str(out), exporter='torchscript',
                          runtimes=['onnxruntime'])
    assert not out.exists()
