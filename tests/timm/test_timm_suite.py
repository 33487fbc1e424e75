"""timm's own model tests, run on pola_mm's timm models.

The test functions are timm's: ``tests/test_models.py`` of the installed
timm release, from its source distribution (``timm_suite.py`` fetches and
caches it). Each is called here with pola_mm's models, with the other
arguments timm's own parametrisation gives it (``batch_size``) and its
fixtures (``cfg_device``), so its body, sizes and tolerances are timm's.
Which models a test gets is also timm's: a model runs a test when timm's
own model list for that test includes it (``list_models`` with the suite's
filters, evaluated after ``import pola_mm.timm``), except that
``pola_mm.timm`` counts as one of the suite's modules with
``forward_intermediates`` (``FEAT_INTER_FILTERS``), as it would if timm
shipped these models.

Every registry-wide test of the suite is either run (:data:`RUN`) or listed
with the reason it does not apply (:data:`NOT_RUN`);
:func:`test_every_suite_test_is_accounted_for` fails when a new timm release
adds one, so a change of timm's contract shows up here.

TorchScript is not supported (``torch.jit.script`` is deprecated in torch
2.14; ``torch.export`` and ``torch.compile`` are, test_timm_export.py):
pola_mm's models are in the suite's ``EXCLUDE_JIT_FILTERS``
(``timm_suite.py``), timm's own mechanism for its families that do not
script, so timm's TorchScript tests (:data:`JIT_TESTS`) select none of them.

Models: by default the smallest of each family (:data:`CI_MODELS`), which
keeps the module within about three minutes on two cores; set
``POLA_MM_TIMM_SUITE_MODELS=all`` (or a comma-separated list of names or
fnmatch patterns) to run others.
"""
import fnmatch
import inspect
import os
from typing import Dict, List, Tuple

import pytest
import timm
import timm_suite
import torch
from timm_suite import load_suite

import pola_mm.timm as pola_timm

pytestmark = pytest.mark.slow


def _suite():
    """timm's test module; outside CI a missing copy (no index reachable)
    skips with the reason, under CI it fails."""
    try:
        return load_suite()
    except RuntimeError as err:
        if os.environ.get('CI'):
            raise
        pytest.skip(str(err), allow_module_level=True)


S = _suite()

#: timm's tests that apply to pola_mm's models and run here.
RUN = (
    'test_model_forward',
    'test_model_backward',
    'test_model_default_cfgs',
    'test_model_load_pretrained',
    'test_model_features_pretrained',
    'test_model_forward_features',
    'test_model_forward_intermediates_features',
    'test_model_forward_intermediates',
    'test_prune_intermediate_layers_contract',
    'test_model_forward_fx',
    'test_model_backward_fx',
)

#: timm's TorchScript tests: their model lists leave out the families in
#: ``EXCLUDE_JIT_FILTERS`` (the fx one exists outside GitHub Actions only).
JIT_TESTS = ('test_model_forward_torchscript',
             'test_model_forward_fx_torchscript')

#: timm's registry-wide tests that do not run here, and why (docs/timm.md).
NOT_RUN: Dict[str, str] = {
    'test_model_default_cfgs_non_std': (
        "timm's list for non-standard models (NON_STD_FILTERS: ViT-like "
        'sequence outputs); pola_mm models are standard NCHW models and run '
        'test_model_default_cfgs.'),
    'test_model_inference': (
        "timm's own test_* models with reference tensors on the Hugging "
        'Face hub only.'),
}

#: The smallest model of each family.
CI_MODELS = ('pola_swin_tiny', 'pola_pvt_tiny', 'polapp_b0')
#: Every pola_mm name, and those with a pretrained config of their own
#: (no short names).
OURS = sorted(timm.list_models('pola*'))
FULL_NAMES = timm.list_models('pola*', name_matches_cfg=True)


def _selected_models() -> List[str]:
    value = os.environ.get('POLA_MM_TIMM_SUITE_MODELS', '')
    if not value:
        return list(CI_MODELS)
    if value == 'all':
        return OURS
    pats = [p.strip() for p in value.split(',') if p.strip()]
    names = [n for n in OURS if any(fnmatch.fnmatch(n, p) for p in pats)]
    if not names:
        raise ValueError(f'POLA_MM_TIMM_SUITE_MODELS={value!r} matches none '
                         f'of {OURS}')
    return names


def _params(fn) -> Dict[str, list]:
    """``argname -> values`` of the function's parametrize marks."""
    out = {}
    for mark in getattr(fn, 'pytestmark', []):
        if mark.name == 'parametrize':
            names, values = mark.args[0], mark.args[1]
            if isinstance(names, str) and ',' not in names:
                out[names] = list(values)
    return out


def _base(name: str) -> str:
    """A model name without its pretrained tag (``'a.in1k'`` -> ``'a'``)."""
    return name.split('.')[0]


def _feat_inter_models() -> set:
    """timm's models with ``forward_intermediates`` (the suite's
    ``FEAT_INTER_FILTERS``)."""
    return set(timm.list_models(module=S.FEAT_INTER_FILTERS))


def _registry_wide() -> Dict[str, Tuple[bool, List[str]]]:
    """Every suite test parametrised over models taken from timm's
    registry: ``name -> (selected by module (FEAT_INTER_FILTERS), models)``.
    A test is registry-wide when its model list holds a pola_mm model or
    is a selection of more than 100 of timm's models with
    ``forward_intermediates``."""
    feat_inter = _feat_inter_models()
    out = {}
    for name, fn in inspect.getmembers(S, inspect.isfunction):
        if not name.startswith('test_'):
            continue
        models = _params(fn).get('model_name')
        if not models:
            continue
        if any(_base(m) in OURS for m in models):
            out[name] = (False, models)
        elif len(models) > 100 and set(models) <= feat_inter:
            out[name] = (True, models)
    return out


REGISTRY_WIDE = _registry_wide()


def _cases() -> List[tuple]:
    cases = []
    for test in RUN:
        if test not in REGISTRY_WIDE:
            continue  # not defined in this environment (see the check)
        by_module, models = REGISTRY_WIDE[test]
        batch_sizes = _params(getattr(S, test)).get('batch_size', [None])
        selected = _selected_models()
        # timm's names for the test (tagged, e.g. 'pola_swin_tiny.in1k',
        # where it lists pretrained tags)
        names = (selected if by_module else
                 [m for m in models if _base(m) in selected])
        for model in names:
            for bs in batch_sizes:
                cases.append(pytest.param(test, model, bs,
                                          id=f'{test}-{model}-{bs}'))
    return cases


def test_every_suite_test_is_accounted_for():
    """Each registry-wide test of the installed timm's suite is run here or
    listed with its reason; the ones run exist and select pola_mm's models
    (a new or renamed test of a new timm release fails here)."""
    unknown = sorted(set(REGISTRY_WIDE) - set(RUN) - set(NOT_RUN))
    assert not unknown, (
        f"timm's suite has registry-wide tests this module neither runs nor "
        f'explains: {unknown}; add each to RUN or NOT_RUN (and docs/timm.md)')
    always = ('test_model_forward', 'test_model_backward',
              'test_model_default_cfgs', 'test_model_forward_features',
              'test_model_forward_intermediates', 'test_model_forward_fx',
              'test_model_backward_fx')
    missing = [t for t in always if t not in REGISTRY_WIDE]
    assert not missing, f"timm's suite no longer has {missing}"
    # timm's own selection takes every pola_mm model (aliases excepted where
    # a test asks for names that match a pretrained config)
    for test in ('test_model_forward', 'test_model_forward_features',
                 'test_model_forward_fx'):
        _, models = REGISTRY_WIDE[test]
        assert set(OURS) <= set(models), test
    for test in ('test_model_backward', 'test_model_default_cfgs'):
        _, models = REGISTRY_WIDE[test]
        assert set(FULL_NAMES) <= {_base(m) for m in models}, test
    # every test run here has cases for the CI models
    run = {c.values[0] for c in _cases()}
    assert set(RUN) & set(REGISTRY_WIDE) <= run


def test_torchscript_tests_leave_pola_mm_out_by_timms_filter():
    """timm's TorchScript tests run over its registry (its own models) and
    select none of pola_mm's, through the suite's EXCLUDE_JIT_FILTERS."""
    assert set(timm_suite.EXCLUDE_JIT) <= set(S.EXCLUDE_JIT_FILTERS)
    assert 'test_model_forward_torchscript' in dir(S)
    for test in JIT_TESTS:
        if not hasattr(S, test):
            continue  # defined outside GitHub Actions only
        models = _params(getattr(S, test))['model_name']
        assert len(models) > 100 and 'resnet18' in models, test
        assert not {_base(m) for m in models} & set(OURS), test
        assert test not in REGISTRY_WIDE


#: timm's own ``cfg_device`` fixture of the suite, visible to pytest here.
cfg_device = S.cfg_device


def _authors_layout(model: torch.nn.Module) -> Dict[str, torch.Tensor]:
    """``model``'s weights in the authors' file layout (the inverse of
    :func:`~pola_mm.models.convert_official_checkpoint`)."""
    out = {}
    for k, v in model.state_dict().items():
        if k.startswith('backbone.norm3.'):
            out['norm.' + k[len('backbone.norm3.'):]] = v
        elif k.startswith('backbone.'):
            out[k[len('backbone.'):]] = v
        elif k.startswith('neck.'):
            out[k[len('neck.'):]] = v
        elif k == 'head.fc.weight' and isinstance(
                model, pola_timm.PolaPPClassifier):
            out['head.weight'] = v[:, :, None, None]
        elif k.startswith('head.fc.'):
            out['head.' + k[len('head.fc.'):]] = v
    return out


@pytest.fixture
def authors_file(request, tmp_path, monkeypatch):
    """For the pretrained tests: the model's pretrained config points at a
    file in the authors' layout (random weights of the right size), as a
    downloaded file would be given; returns the path."""
    from dataclasses import replace

    from timm.models import _registry
    model_name = request.node.callspec.params['model']  # with its tag
    cfg = _registry._model_pretrained_cfgs[model_name]
    with torch.device('cpu'):
        model = timm.create_model(model_name)
    path = str(tmp_path / f'{model_name}_authors.pth')
    torch.save({'model': _authors_layout(model)}, path)
    monkeypatch.setitem(_registry._model_pretrained_cfgs, model_name,
                        replace(cfg, file=path))
    return path


@pytest.mark.parametrize('test,model,batch_size', _cases())
def test_timm_suite(test, model, batch_size, request):
    """timm's ``test`` on pola_mm's ``model``."""
    fn = getattr(S, test)
    kwargs = {}
    params = inspect.signature(fn).parameters
    if 'model_name' in params:
        kwargs['model_name'] = model
    if 'batch_size' in params:
        kwargs['batch_size'] = batch_size
    if 'cfg_device' in params:
        kwargs['cfg_device'] = request.getfixturevalue('cfg_device')
    if test in ('test_model_load_pretrained',
                'test_model_features_pretrained'):
        request.getfixturevalue('authors_file')
    fn(**kwargs)
