"""The small-data lines of docs/small_data.md, as written: the shapes
dataset made by ``tools/misc/make_shapes_dataset.py``, ``my_shapes.py`` on
top of the README's Get started config under mmdet's own
``tools/train.py`` and ``my_seg.py`` under mmseg's, in a fresh folder,
from scratch.

Every line comes from docs/small_data.md at test time: the dataset
command, the two training commands (``path/to/mmdetection/tools/train.py``
is the installed mmdet's tool) and the config blocks, each named by the
sentence before it. The runs are shortened from the command line only
(fewer iterations and validation images); the page states the full runs'
time and metrics.
"""
import os.path as osp
import re
import subprocess
import sys
from typing import Dict, List, NamedTuple

import pytest
from helpers import REPO, clean_env, get_started_config, upstream_tool

pytest.importorskip('mmdet')
pytest.importorskip('mmseg')

pytestmark = [pytest.mark.slow, pytest.mark.e2e]

#: the page's upstream checkouts -> the installed package holding the tool
CHECKOUTS = {'mmdetection': 'mmdet', 'mmsegmentation': 'mmseg'}

#: the test's shortening, on the command line (``--cfg-options``): 40
#: iterations of 8 images and 50 validation images for mmdet (one epoch of
#: 320 images), 100 iterations for mmseg
SHORTER = {
    'my_shapes.py': [
        'train_cfg.max_epochs=1', 'train_dataloader.dataset.indices=320',
        'val_dataloader.dataset.indices=50', 'default_hooks.logger.interval=10'
    ],
    'my_seg.py': [
        'train_cfg.max_iters=100', 'train_cfg.val_interval=100',
        'default_hooks.logger.interval=10'
    ],
}


class SmallData(NamedTuple):
    """The small-data lines of docs/small_data.md."""
    #: the dataset command, split into words (``python tools/misc/...``)
    make: List[str]
    #: config file -> the package whose ``tools/train.py`` trains it
    tools: Dict[str, str]
    #: config file -> its block, as written
    configs: Dict[str, str]


def small_data_lines() -> SmallData:
    """Read the small-data lines from docs/small_data.md."""
    with open(osp.join(REPO, 'docs', 'small_data.md')) as f:
        section = f.read()
    bash = [line.split('#')[0].split()
            for block in re.findall(r'```bash\n(.*?)```', section, re.S)
            for line in block.splitlines()]
    make = [words for words in bash if 'make_shapes_dataset.py' in
            ' '.join(words)]
    assert len(make) == 1, bash
    tools = {}
    for words in bash:
        found = re.fullmatch(r'path/to/(\w+)/tools/train\.py',
                             words[1] if len(words) > 2 else '')
        if words and words[0] == 'python' and found:
            tools[words[2]] = CHECKOUTS[found.group(1)]
    # a config block is named by the first `*.py` of the paragraph that
    # introduces it ("with `my_shapes.py` beside `my_config.py` ...:")
    configs = {}
    pieces = re.split(r'```python\n(.*?)```', section, flags=re.S)
    for prose, block in zip(pieces[0::2], pieces[1::2]):
        intro = prose.rsplit('```', 1)[-1].strip().rsplit('\n\n', 1)[-1]
        named = re.findall(r'`(\w+\.py)`', intro)
        if named:
            assert named[0] not in configs, named[0]
            configs[named[0]] = block
    return SmallData(make[0], tools, configs)


def test_page_names_both_sets_of_small_data_lines():
    lines = small_data_lines()
    assert lines.make[:2] == ['python', 'tools/misc/make_shapes_dataset.py']
    assert lines.tools == {'my_shapes.py': 'mmdet', 'my_seg.py': 'mmseg'}
    assert set(lines.tools) <= set(lines.configs), lines.configs.keys()
    assert "_base_ = ['./my_config.py']" in lines.configs['my_shapes.py']
    assert "'mmseg::" in lines.configs['my_seg.py']


@pytest.fixture(scope='module')
def project(tmp_path_factory):
    """A fresh folder with the configs (the README's and the page's) and
    the dataset."""
    root = tmp_path_factory.mktemp('small_data')
    lines = small_data_lines()
    (root / 'my_config.py').write_text(get_started_config())
    for name, block in lines.configs.items():
        (root / name).write_text(block)
    make = subprocess.run(
        [sys.executable, osp.join(REPO, lines.make[1]), *lines.make[2:]],
        cwd=str(root), capture_output=True, text=True, timeout=300)
    assert make.returncode == 0, make.stderr[-3000:]
    return root


def train(root, config: str) -> str:
    """Run the page's training command for ``config``, shortened by
    :data:`SHORTER`; return its output."""
    tool = upstream_tool(small_data_lines().tools[config], 'train.py')
    work_dir = config.replace('.py', '_work')
    args = [sys.executable, tool, config, '--work-dir', work_dir,
            '--cfg-options', *SHORTER[config]]
    proc = subprocess.run(args, cwd=str(root), env=clean_env(),
                          capture_output=True, text=True, timeout=900)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-4000:]
    return out


def last_metric(out: str, name: str) -> float:
    values = re.findall(rf'{re.escape(name)}: (-?\d+\.\d+)', out)
    assert values, out[-4000:]
    return float(values[-1])


def test_readme_my_shapes_learns_under_mmdet_train_py(project):
    """``my_shapes.py`` under mmdet's ``train.py``: 40 iterations from
    scratch (the ImageNet file of the Get started snippet is not read)
    reach a non-zero bbox mAP on the shapes' validation images."""
    out = train(project, 'my_shapes.py')
    assert 'Epoch(train) [1][40/40]' in out, out[-4000:]
    assert 'from path: checkpoints/pola_swin_t_in1k.pth' not in out
    bbox = last_metric(out, 'coco/bbox_mAP')
    assert bbox > 0, out[-4000:]
    print(f'bbox mAP {bbox}, segm mAP {last_metric(out, "coco/segm_mAP")}')


def test_readme_my_seg_learns_under_mmseg_train_py(project):
    """``my_seg.py`` under mmseg's ``train.py``: 100 iterations from
    scratch reach a non-zero mIoU on the shapes' validation images, with
    at least one shape (not only the background) found."""
    out = train(project, 'my_seg.py')
    assert 'Iter(train) [100/100]' in out, out[-4000:]
    miou = last_metric(out, 'mIoU')
    assert miou > 0, out[-4000:]
    rows = dict(re.findall(r'^\|\s*(\w+)\s*\|\s*(\d+\.\d+)\s*\|', out, re.M))
    assert set(rows) == {'circle', 'square', 'triangle', 'background'}, \
        out[-4000:]
    assert max(float(rows[c]) for c in ('circle', 'square', 'triangle')) \
        > 0, rows
    print(f'mIoU {miou}: {rows}')
