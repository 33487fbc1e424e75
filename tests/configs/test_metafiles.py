"""The mim metadata: ``model-index.yml`` and ``configs/<family>/
metafile.yml`` (written by ``tools/misc/make_metafiles.py``).

Every config is a Model in OpenMMLab's schema, openmim's own loader reads
the files without complaint, the FLOPs and parameters are the counter's
(recounted here for two configs), the authors' weights are cited where
this repository cites them, and ``mim search pola_mm`` (openmim's command
line, in a subprocess from a fresh folder with a clean environment) lists
every config with its numbers.
"""
import json
import os
import os.path as osp
import subprocess
import sys

import pytest
import yaml
from helpers import REPO, load_tool

pytestmark = pytest.mark.slow

gen = load_tool('misc', 'make_metafiles.py')

CONFIGS = osp.join(REPO, 'configs')


def _yaml(path: str):
    with open(path) as f:
        return yaml.safe_load(f)


@pytest.fixture(scope='module')
def models():
    return gen.read_metafiles()


def test_model_index_imports_every_metafile():
    index = _yaml(osp.join(REPO, 'model-index.yml'))
    on_disk = sorted(
        f'configs/{d}/metafile.yml' for d in os.listdir(CONFIGS)
        if osp.isfile(osp.join(CONFIGS, d, 'metafile.yml')))
    assert sorted(index['Import']) == on_disk
    assert len(on_disk) == 3  # Pola-Swin, Pola-PVT, PolaPP
    # the package's copy (read by mim and by mmengine) is the same file
    shipped = osp.join(REPO, 'pola_mm', '.mim', 'model-index.yml')
    assert osp.realpath(shipped) == osp.realpath(
        osp.join(REPO, 'model-index.yml'))


def test_every_config_is_a_model(models):
    names = sorted(f[:-3] for f in os.listdir(CONFIGS) if f.endswith('.py'))
    assert len(names) > 50
    assert sorted(models) == names
    for name, model in models.items():
        assert model['Config'] == f'configs/{name}.py'
        assert osp.isfile(osp.join(REPO, model['Config']))


def test_schema(models):
    collections = {}
    for key in gen.FAMILIES:
        meta = _yaml(gen.metafile_path(key))
        for c in meta['Collections']:
            collections[c['Name']] = c
            assert c['Paper']['Title'] and c['Paper']['URL']
            # the implementation the collection names exists
            assert osp.isfile(osp.join(REPO, c['Code']['URL'])), (
                'rerun tools/misc/make_metafiles.py --keep-counts')
    assert set(collections) == {'Pola-Swin', 'Pola-PVT', 'PolaPP'}
    tasks = set()
    for name, model in models.items():
        assert model['In Collection'] in collections
        meta = model['Metadata']
        assert isinstance(meta['FLOPs'], int) and meta['FLOPs'] > 1e8
        assert isinstance(meta['Parameters'], int) and \
            meta['Parameters'] > 1e6
        assert meta['Training Data'] in ('ImageNet-1k', 'COCO', 'ADE20K')
        assert ('Epochs' in meta) != ('Iterations' in meta)
        assert 'Weights' in model  # null: pola_mm hosts no weights
        for result in model['Results']:
            tasks.add(result['Task'])
            assert result['Dataset'] == meta['Training Data']
            if result['Metrics']:  # the authors' numbers, marked so
                assert "the authors'" in result['Note']
    assert tasks == {'Image Classification', 'Object Detection',
                     'Instance Segmentation', 'Semantic Segmentation'}
    assert models['mask_rcnn_pola_swin_t']['Results'][1]['Task'] == \
        'Instance Segmentation'
    assert models['pola_swin_t_in1k']['Results'][0]['Metrics'] == {
        'Top 1 Accuracy': 82.6}
    assert models['mask_rcnn_polapp_b3']['Results'][1]['Metrics'] == {
        'mask AP': 44.6}


def test_converted_from_cites_the_authors_published_weights(models):
    """Every ImageNet-1k config whose weights the authors publish names them
    where this repository already cites them (README, docs/timm.md)."""
    cited = ''
    for doc in ('README.md', osp.join('docs', 'timm.md')):
        with open(osp.join(REPO, doc)) as f:
            cited += f.read()
    converted = {n: m['Converted From'] for n, m in models.items()
                 if 'Converted From' in m}
    assert sorted(converted) == sorted(
        [f'pola_{a}_in1k' for a in ('swin_t', 'swin_s', 'swin_b', 'pvt_t',
                                    'pvt_s')]
        + [f'polapp_b{k}_in1k' for k in range(6)])
    for name, source in converted.items():
        assert source['Weights'] in cited, name
        assert source['Code'] in ('https://github.com/ZacharyMeng/PolaFormer',
                                  'https://github.com/ZacharyMeng/'
                                  'PolaFormerPP')
        family = 'PolaFormerPP' if name.startswith('polapp') else \
            'PolaFormer'
        assert source['Code'].endswith('/' + family)


def test_openmim_loads_and_checks_the_index():
    """openmim's loader (model-index) reads everything and its checker
    finds nothing wrong."""
    from modelindex.load_model_index import load
    index = load(osp.join(REPO, 'model-index.yml'))
    index.build_models_with_collections()  # models inherit their collection
    assert len(index.models) == len(gen.config_names())
    assert {m.in_collection for m in index.models} == {
        'Pola-Swin', 'Pola-PVT', 'PolaPP'}
    errors = index.check(silent=True)
    assert not errors, errors


@pytest.mark.parametrize('name', ['pola_pvt_t_in1k',
                                  'sem_fpn_pola_pvt_t_ade20k'])
def test_counts_are_the_counters(name, models):
    """FLOPs and parameters equal a fresh count by get_flops.py (a
    classifier and a segmentor; the detectors take minutes)."""
    counted = gen.count(name)
    stored = {k: models[name]['Metadata'][k] for k in counted}
    assert stored == counted, (
        f'{name}: metafile {stored} != counter {counted}; rerun '
        'python tools/misc/make_metafiles.py')


def test_mim_search_lists_every_config(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != 'PYTHONPATH'}
    out = tmp_path / 'search.json'
    proc = subprocess.run(
        [sys.executable, '-m', 'mim', 'search', 'pola_mm', '--json',
         str(out)], cwd=str(tmp_path), env=env, capture_output=True,
        text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    table = json.loads(out.read_text())
    names = gen.config_names()
    assert sorted(table['config']) == names
    assert all(table['config'][n] == f'configs/{n}.py' for n in names)
    assert all(table['flops'][n] > 0 and table['parameters'][n] > 0
               for n in names)
    assert table['model']['pola_swin_t_in1k'] == 'pola-swin'
    assert table['imagenet-1k/top_1_accuracy']['pola_swin_t_in1k'] == 82.6
    assert table['coco/box_ap']['retinanet_polapp_b3'] == 47.3
    assert table['ade20k/miou']['ham_polapp_b3_ade20k'] == 50.5
