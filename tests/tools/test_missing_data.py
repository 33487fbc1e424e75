"""tools/train.py and tools/test.py without the data or weights a config
needs: one line naming the path, the layout and how to point elsewhere
(pola_mm.cli.data_paths), exit code 2, no Runner built."""
import os.path as osp

import pytest

from pola_mm.cli import data_paths
from pola_mm.cli import train_test as runner
from pola_mm.cli.train_test import run_tool

pytestmark = [pytest.mark.slow, pytest.mark.e2e]

CONFIGS = osp.join(osp.dirname(osp.dirname(osp.dirname(
    osp.abspath(__file__)))), 'configs')

FAMILIES = [
    ('mask_rcnn_pola_swin_t.py', 'CocoDataset', 'data/coco/',
     'instances_{train,val}2017.json'),
    ('upernet_pola_swin_t_ade20k.py', 'ADE20KDataset',
     'data/ade/ADEChallengeData2016', 'images/{training,validation}'),
    ('pola_swin_t_in1k.py', 'ImageNet', 'data/imagenet', 'train/<wnid>'),
]


def _one_line(capsys) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    lines = [line for line in err if line.startswith('error:')]
    assert len(lines) == 1, err
    assert 'Traceback' not in '\n'.join(err)
    return lines[0]


@pytest.mark.parametrize('name, kind, root, layout', FAMILIES)
def test_missing_dataset_is_one_line(tmp_path, monkeypatch, capsys, name,
                                     kind, root, layout):
    monkeypatch.chdir(tmp_path)  # no data/ here
    built = []
    monkeypatch.setattr(runner, 'build_runner', built.append)
    assert run_tool(runner.train_main, [osp.join(CONFIGS, name)]) == 2
    line = _one_line(capsys)
    assert f'{kind} data_root not found: {root}' in line
    assert layout in line
    assert '--cfg-options train_dataloader.dataset.data_root=DIR' in line
    ckpt = tmp_path / 'model.pth'
    ckpt.write_bytes(b'')
    assert run_tool(runner.test_main,
                    [osp.join(CONFIGS, name), str(ckpt)]) == 2
    line = _one_line(capsys)
    assert f'{kind} data_root not found: {root}' in line
    assert 'test_dataloader.dataset.data_root=DIR' in line
    assert built == []


def test_missing_annotation_file_and_image_dir(tmp_path, monkeypatch,
                                               capsys):
    monkeypatch.chdir(tmp_path)
    (tmp_path / 'data' / 'coco' / 'annotations').mkdir(parents=True)
    monkeypatch.setattr(runner, 'build_runner', lambda cfg: None)
    config = osp.join(CONFIGS, 'mask_rcnn_pola_swin_t.py')
    assert run_tool(runner.train_main, [config]) == 2
    line = _one_line(capsys)
    assert ('CocoDataset annotation file not found: '
            'data/coco/annotations/instances_train2017.json') in line
    # the annotation there, the image folder not
    (tmp_path / 'data/coco/annotations/instances_train2017.json').write_text(
        '{}')
    assert run_tool(runner.train_main, [config]) == 2
    line = _one_line(capsys)
    assert 'CocoDataset img directory not found: data/coco/train2017/' in line


def test_missing_pretrained_checkpoint_names_pola_pretrained(
        tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    root = tmp_path / 'data' / 'ade' / 'ADEChallengeData2016'
    for split in ('training', 'validation'):
        (root / 'images' / split).mkdir(parents=True)
        (root / 'annotations' / split).mkdir(parents=True)
    monkeypatch.setattr(runner, 'build_runner', lambda cfg: None)
    config = osp.join(CONFIGS, 'upernet_pola_swin_t_ade20k.py')
    assert run_tool(runner.train_main, [config]) == 2
    line = _one_line(capsys)
    assert 'pretrained checkpoint not found: checkpoints/pola_swin_t_in1k' \
        in line
    assert '$POLA_PRETRAINED' in line
    assert 'model.backbone.init_cfg=None' in line
    # with everything in place the run goes on to build the Runner
    built = []

    class FakeRunner:

        def __init__(self, cfg):
            built.append(cfg)

        def train(self):
            pass

    monkeypatch.setattr(runner, 'build_runner', FakeRunner)
    assert run_tool(runner.train_main, [
        config, '--cfg-options', 'model.backbone.init_cfg=None'
    ]) == 0
    assert len(built) == 1


def test_remote_paths_and_wrappers():
    from mmengine.config import Config
    cfg = Config(
        dict(train_dataloader=dict(dataset=dict(
            type='RepeatDataset', times=2,
            dataset=dict(type='CocoDataset', data_root='s3://bucket/coco',
                         ann_file='a.json'))),
             val_cfg=None))
    assert data_paths.missing_paths(cfg) == []
    cfg.train_dataloader.dataset.dataset.data_root = 'nowhere/coco'
    (line, ) = data_paths.missing_paths(cfg)
    assert line.startswith('CocoDataset data_root not found: nowhere/coco')
    assert 'train_dataloader.dataset.dataset.data_root=DIR' in line
