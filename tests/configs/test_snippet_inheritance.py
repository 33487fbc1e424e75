"""One source per value: the downstream configs inherit the drop path of
their snippet (``configs/_base_/models/*_fpn.py``) and restate none.

The configs folder is copied, every snippet's drop path values are changed
(the detection default in ``pola_backbone``, ``pola_seg_drop_path``,
``pola_retinanet_drop_path``), and every shipped downstream config read
from the copy must carry the changed value of its snippet."""
import glob
import os.path as osp
import re
import shutil

import pytest
from helpers import REPO

CONFIGS = osp.join(REPO, 'configs')
#: the recipe's variable of the snippet a downstream config takes
RECIPE = (('upernet_', 'pola_seg_drop_path'),
          ('sem_fpn_', 'pola_seg_drop_path'),
          ('retinanet_pola_pvt_', 'pola_retinanet_drop_path'))


def _downstream():
    out = []
    for path in sorted(glob.glob(osp.join(CONFIGS, '*.py'))):
        text = open(path).read()
        snippet = re.search(r"'\./_base_/models/(\w+_fpn\.py)'", text)
        if snippet:
            out.append((osp.basename(path), snippet.group(1)))
    return out


def _bump(text: str, offset: float) -> str:
    """Every drop path value of a snippet, plus ``offset`` (each variable
    by a different multiple, so they cannot be mistaken for each other)."""
    text = re.sub(r'^(    drop_path_rate=)([0-9.]+)',
                  lambda m: f'{m.group(1)}{float(m.group(2)) + offset}',
                  text, flags=re.M)
    for k, name in enumerate(('pola_seg_drop_path',
                              'pola_retinanet_drop_path'), start=2):
        text = re.sub(rf'^({name} = )([0-9.]+)',
                      lambda m, k=k: f'{m.group(1)}'
                      f'{float(m.group(2)) + k * offset}', text, flags=re.M)
    return text


def _expected(config: str, snippet_text: str) -> float:
    for prefix, name in RECIPE:
        if config.startswith(prefix) and name in snippet_text:
            return float(re.search(rf'^{name} = ([0-9.]+)', snippet_text,
                                   re.M).group(1))
    return float(re.search(r'^    drop_path_rate=([0-9.]+)', snippet_text,
                           re.M).group(1))


def test_every_downstream_config_follows_its_snippet(tmp_path):
    pytest.importorskip('mmdet')
    pytest.importorskip('mmseg')
    from mmengine.config import Config

    import pola_mm  # noqa: F401  (mmdet::/mmseg:: bases resolve)
    copy = tmp_path / 'configs'
    shutil.copytree(CONFIGS, copy)
    for path in glob.glob(str(copy / '_base_' / 'models' / '*_fpn.py')):
        with open(path) as f:
            text = f.read()
        with open(path, 'w') as f:
            f.write(_bump(text, 0.001))
    configs = _downstream()
    assert len(configs) >= 40, configs
    for name, snippet in configs:
        original = Config.fromfile(osp.join(CONFIGS, name))
        changed = Config.fromfile(str(copy / name))
        with open(copy / '_base_' / 'models' / snippet) as f:
            want = _expected(name, f.read())
        got = changed.model.backbone.drop_path_rate
        assert got == pytest.approx(want), (name, snippet, got, want)
        assert got != pytest.approx(original.model.backbone.drop_path_rate)
