"""One source per value: the downstream configs inherit the drop path of
their snippet (``configs/_base_/models/*_fpn.py``) and the optimiser of
their family (``configs/_base_/models/*_train.py``, which every snippet
includes) and restate none.

The configs folder is copied, every snippet's drop path values are changed
(the detection default in ``pola_backbone``, ``pola_seg_drop_path``,
``pola_retinanet_drop_path``) and every number of every optimiser of the
training files (lr, betas, weight decay, loss scale, paramwise
multipliers), each by a different amount; every shipped downstream config
read from the copy must carry the changed values of its snippet."""
import glob
import itertools
import os.path as osp
import re
import shutil

import pytest
from helpers import REPO

pytestmark = pytest.mark.slow

CONFIGS = osp.join(REPO, 'configs')
#: the recipe's variable of the snippet a downstream config takes
RECIPE = (('upernet_', 'pola_seg_drop_path'),
          ('sem_fpn_', 'pola_seg_drop_path'),
          ('retinanet_pola_pvt_', 'pola_retinanet_drop_path'))
#: the optimiser of the snippet a downstream config takes (first match;
#: the rest take ``pola_optim_wrapper``)
OPTIMISER = (('retinanet_', 'pola_retinanet_optim_wrapper'),
             ('upernet_', 'pola_seg_optim_wrapper'),
             ('sem_fpn_', 'pola_seg_optim_wrapper'),
             ('ham_', 'pola_ham_optim_wrapper'),
             ('mask_rcnn_polapp_', 'pola_amp_optim_wrapper'),
             ('cascade_mask_rcnn_polapp_', 'pola_amp_optim_wrapper'))
NUMBER = r'\d+(?:\.\d*)?(?:e-?\d+)?'
#: the numbers of an optimiser in a training file
KEYWORD_NUMBER = re.compile(
    rf'(\b(?:lr|weight_decay|loss_scale|decay_mult|lr_mult)=)({NUMBER})')
BETAS = re.compile(rf'(betas=\()({NUMBER}), ({NUMBER})\)')


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


def _bump_optimisers(text: str, offset: float) -> str:
    """Every number of the optimisers of a training file, plus ``offset``
    times 1, 2, 3, ... in the order they are written (comments left
    alone), so that no two of its wrappers stay equal."""
    count = itertools.count(1)

    def add(number: str) -> str:
        return repr(float(number) + next(count) * offset)

    out = []
    for line in text.splitlines(keepends=True):
        if not line.lstrip().startswith('#'):
            line = BETAS.sub(lambda m: f'{m.group(1)}{add(m.group(2))}, '
                             f'{add(m.group(3))})', line)
            line = KEYWORD_NUMBER.sub(
                lambda m: f'{m.group(1)}{add(m.group(2))}', line)
        out.append(line)
    assert next(count) > 5, 'no optimiser numbers found'
    return ''.join(out)


def _expected(config: str, snippet_text: str) -> float:
    for prefix, name in RECIPE:
        if config.startswith(prefix) and name in snippet_text:
            return float(re.search(rf'^{name} = ([0-9.]+)', snippet_text,
                                   re.M).group(1))
    return float(re.search(r'^    drop_path_rate=([0-9.]+)', snippet_text,
                           re.M).group(1))


def _optimiser_of(config: str) -> str:
    for prefix, name in OPTIMISER:
        if config.startswith(prefix):
            return name
    return 'pola_optim_wrapper'


def _numbers(tree, path=()):
    """(path, value) of every number in a nested dict / list."""
    if isinstance(tree, dict):
        for key, value in tree.items():
            yield from _numbers(value, path + (key, ))
    elif isinstance(tree, (list, tuple)):
        for i, value in enumerate(tree):
            yield from _numbers(value, path + (i, ))
    elif isinstance(tree, (int, float)) and not isinstance(tree, bool):
        yield path, tree


@pytest.fixture(scope='module')
def changed(tmp_path_factory):
    """(name, snippet, original config, config read from the changed copy,
    the changed snippet) of every downstream config."""
    pytest.importorskip('mmdet')
    pytest.importorskip('mmseg')
    from mmengine.config import Config

    import pola_mm  # noqa: F401  (mmdet::/mmseg:: bases resolve)
    copy = tmp_path_factory.mktemp('snippets') / 'configs'
    shutil.copytree(CONFIGS, copy)
    models = copy / '_base_' / 'models'
    for pattern, bump in (('*_fpn.py', _bump),
                          ('*_train.py', _bump_optimisers)):
        for path in glob.glob(str(models / pattern)):
            with open(path) as f:
                text = f.read()
            with open(path, 'w') as f:
                f.write(bump(text, 0.001 if bump is _bump else 1e-7))
    configs = _downstream()
    assert len(configs) >= 40, configs
    snippets = {}
    out = []
    for name, snippet in configs:
        if snippet not in snippets:
            snippets[snippet] = Config.fromfile(str(models / snippet))
        out.append((name, snippet, Config.fromfile(osp.join(CONFIGS, name)),
                    Config.fromfile(str(copy / name)), snippets[snippet]))
    return copy, out


def test_every_downstream_config_follows_its_snippet(changed):
    copy, configs = changed
    for name, snippet, original, changed_cfg, _ in configs:
        with open(copy / '_base_' / 'models' / snippet) as f:
            want = _expected(name, f.read())
        got = changed_cfg.model.backbone.drop_path_rate
        assert got == pytest.approx(want), (name, snippet, got, want)
        assert got != pytest.approx(original.model.backbone.drop_path_rate)


def test_every_downstream_optimiser_follows_its_snippet(changed):
    """Each config's optimiser is its snippet's wrapper, every number of it
    changed with the snippet's; within a family no two wrappers are equal
    after the change, so a config taking the wrong one fails too."""
    _, configs = changed
    families = {}
    for name, snippet, original, changed_cfg, snippet_cfg in configs:
        wrappers = {k: v.to_dict() for k, v in snippet_cfg.items()
                    if k.startswith('pola_') and k.endswith('optim_wrapper')}
        families[tuple(sorted(wrappers))] = list(wrappers.values())
        want = wrappers[_optimiser_of(name)]
        assert want.pop('_delete_') is True, name
        got = changed_cfg.optim_wrapper.to_dict()
        assert got == want, (name, snippet, got, want)
        before = dict(_numbers(original.optim_wrapper.to_dict()))
        after = dict(_numbers(got))
        assert before.keys() == after.keys(), name
        assert all(after[k] != before[k] for k in before), (name, before,
                                                            after)
    for wrappers in families.values():
        for a, b in itertools.combinations(wrappers, 2):
            assert a != b


def test_optimisers_are_set_once():
    """The schedules and the shared downstream bases set no optimiser; a
    downstream config sets it in one line, from its snippet."""
    bases = glob.glob(osp.join(CONFIGS, '_base_', 'schedules', '*.py')) + [
        path for path in glob.glob(osp.join(CONFIGS, '_base_', '*.py'))
        if "'./schedules/" in open(path).read()]
    assert len(bases) >= 5, bases
    for path in bases:
        assert not re.search(r'^optim_wrapper\b', open(path).read(), re.M), \
            path
    for name, _ in _downstream():
        lines = [line for line in open(osp.join(CONFIGS, name))
                 if 'optim_wrapper' in line]
        assert lines == [f'optim_wrapper = _base_.{_optimiser_of(name)}\n'], \
            (name, lines)
