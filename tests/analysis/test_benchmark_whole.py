"""The whole-model ONNX Runtime mode of the benchmark (MMDeploy export,
checked against PyTorch, timed in worker processes), on tiny RetinaNets at
128x128."""
import glob
import os.path as osp
import sys

import pytest

pytest.importorskip('mmdeploy')
pytest.importorskip('onnxruntime')

from helpers import REPO, load_tool  # noqa: E402

from pola_mm.analysis.benchmark import BenchmarkResult  # noqa: E402
from pola_mm.analysis.benchmark import whole  # noqa: E402
from pola_mm.analysis.benchmark import compute_ratios, format_table
from pola_mm.analysis.benchmark.ortprofile import ratio_floor  # noqa: E402

pytestmark = [pytest.mark.slow, pytest.mark.export]

ASSETS = osp.join(REPO, 'tests', 'deployment', 'assets')
#: mmdet's softmax PVT with the channels of the tiny Pola-PVT of the asset
#: (embed_dims x num_heads = 16, 32, 64, 64).
MMDET_PVT_TINY = dict(_delete_=True, type='PyramidVisionTransformer',
                      embed_dims=16, num_layers=[1, 1, 1, 1],
                      num_heads=[1, 2, 4, 4], mlp_ratios=[2, 2, 2, 2],
                      init_cfg=None)


@pytest.fixture(scope='module')
def shapes_image(tmp_path_factory) -> str:
    from pola_mm.demo.shapes import make_shapes_dataset
    out = tmp_path_factory.mktemp('shapes')
    make_shapes_dataset(str(out), num_train=1, num_val=1, img_size=128,
                        seed=0)
    return sorted(glob.glob(str(out / 'val' / '*')))[0]


def test_whole_retinanets_exported_checked_timed_and_paired(shapes_image):
    """The trained tiny Pola-PVT RetinaNet (its checkpoint) and a softmax
    one (mmdet's PVT in its place, random weights; its export needs the
    opset-11 unflatten of pola_mm's MMDeploy fixes) through the stock
    static detection config at 128x128, each in its worker processes: the
    Pola file agrees with PyTorch on real detections, both are timed, the
    ratio is against the named baseline."""
    cfg = osp.join(ASSETS, 'retinanet_pola_pvt_shapes.py')
    pola = dict(name='retinanet_pola_tiny', config=cfg,
                checkpoint=osp.join(ASSETS, 'retinanet_pola_pvt_shapes.pth'),
                image=shapes_image, baseline='retinanet_pvt_tiny')
    softmax = dict(name='retinanet_pvt_tiny', config=cfg,
                   cfg_options={'model.backbone': MMDET_PVT_TINY})
    lines = []
    rs = whole.run_whole_benchmarks([pola, softmax], size=(128, 128),
                                    log=lines.append, repeats=2, threads=1,
                                    timeout=300, profile_runs=1)
    for r in rs:
        assert r.error is None, r.error
        assert (r.runtime, r.exporter, r.mode, r.size) == (
            'onnxruntime', 'mmdeploy', 'infer', (128, 128))
        assert r.deploy_cfg == 'detection_onnxruntime_static.py'
        assert r.opset == 11 and r.ort_version and r.num_params > 0
        assert len(r.times) == 2 and all(t > 0 for t in r.times)
        assert 0 < r.time_min <= r.time_median and r.threads == 1
        assert r.peak_mem_mb >= r.base_mem_mb > 0 and r.export_s > 0
        # ONNX Runtime's profile by part: the detector's top-level modules
        parts = r.ort_profile['parts']
        assert {'backbone', 'neck', 'bbox_head'} <= set(parts), parts
        assert all(parts[p] > 0 for p in ('backbone', 'neck', 'bbox_head'))
        assert sum(parts.values()) == pytest.approx(
            r.ort_profile['kernel_ms'])
    # the check compared real detections of the trained model
    assert rs[0].weights == 'retinanet_pola_pvt_shapes.pth'
    assert rs[0].check.split()[0] != '0', rs[0].check
    assert 'box diff' in rs[0].check
    assert rs[1].weights == 'random'
    assert rs[1].num_params != rs[0].num_params  # another backbone
    ratios = compute_ratios(rs)
    assert ratios[0][0] == pytest.approx(rs[0].time_median /
                                         rs[1].time_median)
    assert ratios[0][1] == pytest.approx(rs[0].peak_mem_mb /
                                         rs[1].peak_mem_mb)
    assert 1 not in ratios
    # no backbone could take the ratio below the neck's and heads' share,
    # which is below the ratio of the two models' kernel times
    floor = ratio_floor(rs[0].ort_profile, rs[1].ort_profile)
    assert 0 < floor < (rs[0].ort_profile['kernel_ms'] /
                        rs[1].ort_profile['kernel_ms'])
    table = format_table(rs)
    assert (f'so no backbone can bring the ratio below {floor:.2f}'
            in table)
    assert 'confident detections' in table
    assert 'random (seeded init_weights; timing only)' in table
    assert len(lines) == 2 and 'retinanet_pola_tiny' in lines[0]
    assert BenchmarkResult.from_dict(rs[0].to_dict()) == rs[0]


def test_specs_and_cli(monkeypatch):
    """Zoo names, config files and --pair give the models and baselines;
    the stock configs and mmdet's own configs are found; a missing
    pretrained file is dropped from the config."""
    from mmengine.config import Config
    spec = whole.whole_spec('retinanet_pola_pvt_t')
    assert (spec['name'], spec['baseline']) == ('retinanet_pola_pvt_t',
                                                'retinanet_pvt_t')
    for name, entry in whole.WHOLE_MODELS.items():
        assert osp.isfile(whole.resolve_config(entry['config'])), name
        if entry.get('baseline'):
            assert entry['baseline'] in whole.WHOLE_MODELS
    for kind in whole.STOCK_DEPLOY_CONFIGS:
        assert osp.isfile(whole.stock_deploy_config(kind))
    cfg = Config.fromfile(whole.resolve_config('configs/'
                                               'mask_rcnn_pola_swin_t.py'))
    assert cfg.model.backbone.init_cfg['checkpoint']
    whole._without_pretrained(cfg)
    assert cfg.model.backbone.init_cfg is None and whole._has_mask_head(cfg)
    with pytest.raises(FileNotFoundError):
        whole.resolve_config('configs/no_such_config.py')

    path = osp.join(REPO, 'tools', 'analysis', 'benchmark.py')
    tool = load_tool('analysis', 'benchmark.py')
    monkeypatch.setattr(sys, 'argv', [
        path, '--runtime', 'onnxruntime', '--size', '800x1344', '--whole',
        'mask_rcnn_pola_swin_t', 'mask_rcnn_swin_t', '--pair', 'a/ours.py',
        'mmdet::pvt/retinanet_pvt-t_fpn_1x_coco.py'])
    specs = tool.whole_models(tool.parse_args())
    assert [(s['name'], s['baseline']) for s in specs] == [
        ('mask_rcnn_pola_swin_t', 'mask_rcnn_swin_t'),
        ('mask_rcnn_swin_t', None),
        ('ours', 'retinanet_pvt-t_fpn_1x_coco'),
        ('retinanet_pvt-t_fpn_1x_coco', None)]
    for bad in (['--whole', 'x.py'],  # no --runtime onnxruntime
                ['--runtime', 'onnxruntime', '--whole', 'x.py', '--size',
                 '224', '256'],
                ['--runtime', 'onnxruntime', '--whole', 'x.py', '--opset',
                 '13']):
        monkeypatch.setattr(sys, 'argv', [path] + bad)
        with pytest.raises(SystemExit):
            tool.parse_args()
