"""pola_mm.timm: every registered model has the authors' layout, timm's
interface and features_only contract, and computes what the mm backbones
compute; the reference minis load through timm's pretrained path and give
the authors' logits; PolaPP's classifiers equal the mm classifier and the
authors' (timm's own model tests: test_timm_suite.py)."""
import json
import os.path as osp

import pytest
import timm
import timm.optim
import torch
from helpers import (PVT_MINI, PVT_TINY, SWIN_MINI, SWIN_TINY_DEPTH2,
                     count_calls, randomise)

import pola_mm.timm as pola_timm
from pola_mm.models import PolaPP, PolaPVT, PolaSwinTransformer
from pola_mm.models.backbones.base import PreNormBlock
from pola_mm.models.checkpoint import convert_official_checkpoint
from pola_mm.models.layers import PolaPPBlock

pytestmark = pytest.mark.slow

TOL = 1e-4
#: Every registered name with its own pretrained config (no short names).
NAMES = timm.list_models('pola*', name_matches_cfg=True)
#: The PolaFormer models (the authors' layouts are in the reference JSON).
POLA_NAMES = [n for n in NAMES if n.startswith('pola_')]
#: The short names, each a model function of its own.
ALIASES = {
    'pola_swin_t': 'pola_swin_tiny', 'pola_swin_s': 'pola_swin_small',
    'pola_swin_b': 'pola_swin_base', 'pola_pvt_t': 'pola_pvt_tiny',
    'pola_pvt_s': 'pola_pvt_small', 'pola_pvt_m': 'pola_pvt_medium',
    'pola_pvt_l': 'pola_pvt_large',
}
FAMILIES = {
    'swin': ('pola_swin_tiny', PolaSwinTransformer, SWIN_TINY_DEPTH2),
    'pvt': ('pola_pvt_tiny', PolaPVT, PVT_TINY),
}
#: The authors' ImageNet drop path of each model (their configs; PolaPP's
#: is its arch's ``drop_path_rate``).
DROP_PATH = {
    'pola_swin_tiny': 0.2, 'pola_swin_small': 0.3, 'pola_swin_base': 0.5,
    'pola_swin_base_384': 0.5, 'pola_pvt_tiny': 0.1, 'pola_pvt_small': 0.1,
    'pola_pvt_medium': 0.3, 'pola_pvt_large': 0.3,
    **{f'polapp_{a}': zoo['drop_path_rate']
       for a, zoo in PolaPP.arch_zoo.items()},
}


def test_registered_with_aliases():
    listed = set(timm.list_models('pola*'))
    assert set(NAMES) | set(ALIASES) == listed
    assert {f'polapp_b{i}' for i in range(6)} <= listed
    # the authors' PolaFormer files (Hugging Face): listed as pretrained
    assert set(timm.list_pretrained('pola_*')) == {
        'pola_swin_tiny.in1k', 'pola_swin_small.in1k', 'pola_swin_base.in1k',
        'pola_pvt_tiny.in1k', 'pola_pvt_small.in1k'}
    # timm's file shape: one model function a name, in its family's module
    for name in listed:
        fn = timm.models.model_entrypoint(name)
        assert fn.__name__ == name
        assert fn.__module__ in ('pola_mm.timm.pola_swin',
                                 'pola_mm.timm.pola_pvt',
                                 'pola_mm.timm.polapp')
    for alias, name in ALIASES.items():
        tiny = SWIN_TINY_DEPTH2 if 'swin' in alias else PVT_TINY
        with torch.device('meta'):
            model = timm.create_model(alias, arch=tiny)
            full = timm.create_model(name, arch=tiny)
        assert model.pretrained_cfg['architecture'] == name
        assert type(model) is type(full)


@pytest.mark.parametrize('prefix,cls', [('pola_swin', PolaSwinTransformer),
                                        ('pola_pvt', PolaPVT),
                                        ('polapp', PolaPP)])
def test_archs_come_from_the_backbone_zoo(prefix, cls):
    """Every arch of the backbone's ``arch_zoo`` (short names included) is
    a timm model ``<prefix>_<arch>`` whose backbone is that arch, with the
    authors' drop path; no other arch is registered."""
    with torch.device('meta'):
        for arch, spec in cls.arch_zoo.items():
            name = f'{prefix}_{arch}'
            model = timm.create_model(name)
            for key, value in model.backbone.arch.items():
                if key in spec:
                    want = spec[key]
                    if isinstance(want, (list, tuple)):
                        want = tuple(want)
                    assert value == want, (name, key)
            want = DROP_PATH[model.pretrained_cfg['architecture']]
            blocks = [m for m in model.backbone.modules()
                      if isinstance(m, (PreNormBlock, PolaPPBlock))]
            assert blocks[-1].drop_path.drop_prob == want, name
    zoo_names = {f'{prefix}_{a}' for a in cls.arch_zoo}
    assert set(timm.list_models(f'{prefix}_*')) - zoo_names <= {
        'pola_swin_base_384'}


@pytest.mark.parametrize(
    'name', [n for n in POLA_NAMES if n != 'pola_swin_base_384'])
def test_state_dict_is_the_converted_authors_layout(reference_dir, name):
    """Names and shapes of each classifier are exactly the authors' file
    after conversion (built on the meta device)."""
    path = osp.join(reference_dir, 'official_state_dict_layouts.json')
    with open(path) as f:
        layout = json.load(f)[name]
    with torch.device('meta'):
        model = timm.create_model(name)
    official = {k: torch.empty(s, device='meta')
                for k, s in layout['params'] + layout['buffers']}
    want = {k: list(v.shape)
            for k, v in convert_official_checkpoint(official).items()}
    got = {k: list(v.shape) for k, v in model.state_dict().items()}
    assert got == want
    # the authors' count, less the unused final PVT norm the conversion drops
    kept = convert_official_checkpoint(
        {k: torch.empty(s, device='meta') for k, s in layout['params']})
    assert sum(p.numel() for p in model.parameters()) == \
        sum(v.numel() for v in kept.values())
    if name.startswith('pola_swin'):
        assert sum(v.numel() for v in kept.values()) == layout['n_params']


def test_swin_base_384_is_the_fine_tune_setting():
    with torch.device('meta'):
        model = timm.create_model('pola_swin_base_384')
    sd = model.state_dict()
    # polarity window 96 (the whole 96x96 stage-1 map), softmax window 12
    pe = 'backbone.layers.0.blocks.0.attn.positional_encoding'
    assert tuple(sd[pe].shape) == (1, 96 * 96, 128)
    rpb = 'backbone.layers.2.blocks.0.attn.relative_position_bias_table'
    assert tuple(sd[rpb].shape) == (23 * 23, 16)
    assert model.pretrained_cfg['input_size'] == (3, 384, 384)


@pytest.mark.parametrize('family', sorted(FAMILIES))
def test_features_and_logits_match_the_mm_backbone(family):
    """Same weights -> the features_only model returns exactly the mm
    backbone's outputs, and the classifier's logits are the head on its last
    output, at an odd, non-square size."""
    name, cls, arch = FAMILIES[family]
    mm = cls(arch=arch, out_indices=(0, 1, 2, 3)).eval()
    randomise(mm, seed=3)
    head = torch.nn.Linear(mm.num_features[-1], 7)
    feats = timm.create_model(name, arch=arch, features_only=True).eval()
    # a plain backbone state dict (as an mm training run saves it)
    sd = pola_timm.checkpoint_filter_fn(mm.state_dict(), feats.model)
    feats.model.load_state_dict(sd, strict=True)
    x = torch.randn(2, 3, 45, 61)
    with torch.no_grad():
        want = mm(x)
        got = feats(x)
    assert len(got) == 4
    for w, g in zip(want, got):
        torch.testing.assert_close(g, w, rtol=0, atol=1e-6)

    clf = timm.create_model(name, arch=arch, num_classes=7).eval()
    sd = pola_timm.checkpoint_filter_fn(mm.state_dict(), clf)
    sd.update({'head.fc.weight': head.weight, 'head.fc.bias': head.bias})
    clf.load_state_dict(sd, strict=True)
    with torch.no_grad():
        logits = clf(x)
        pooled = clf.forward_head(clf.forward_features(x), pre_logits=True)
    torch.testing.assert_close(pooled, want[-1].mean(dim=(2, 3)),
                               rtol=0, atol=1e-6)
    torch.testing.assert_close(logits, head(pooled), rtol=0, atol=1e-6)


@pytest.mark.parametrize('family,arch,model', [
    ('swin', SWIN_MINI, 'pola_swin_t'), ('pvt', PVT_MINI, 'pola_pvt_t')])
def test_reference_minis_through_timm_pretrained(reference_dir, family, arch,
                                                 model):
    """The authors' file, loaded by timm.create_model(pretrained=True,
    pretrained_cfg_overlay=dict(file=...)), gives the authors' features and
    logits; features_only from the same file gives the same last map."""
    path = osp.join(reference_dir, f'official_pola_{family}_mini.pth')
    io = torch.load(osp.join(reference_dir,
                             f'official_pola_{family}_mini_io.pth'),
                    map_location='cpu', weights_only=True)
    clf = timm.create_model(model, arch=arch, pretrained=True,
                            pretrained_cfg_overlay=dict(file=path)).eval()
    feats = timm.create_model(model, arch=arch, pretrained=True,
                              features_only=True, out_indices=(-1, ),
                              pretrained_cfg_overlay=dict(file=path)).eval()
    with torch.no_grad():
        last = clf.forward_features(io['input'])
        pooled = clf.forward_head(last, pre_logits=True)
        logits = clf.forward_head(last)
        (feat_last, ) = feats(io['input'])
    assert (pooled - io['features']).abs().max() <= TOL
    assert (logits - io['logits']).abs().max() <= TOL
    assert torch.equal(logits.argmax(1), io['logits'].argmax(1))
    torch.testing.assert_close(feat_last, last, rtol=0, atol=1e-6)


def test_filter_fn_idempotent_and_strict(reference_dir):
    official = torch.load(
        osp.join(reference_dir, 'official_pola_swin_mini.pth'),
        map_location='cpu', weights_only=True)
    model = timm.create_model('pola_swin_tiny', arch=SWIN_MINI)
    once = pola_timm.checkpoint_filter_fn(official, model)
    twice = pola_timm.checkpoint_filter_fn(once, model)
    assert set(once) == set(model.state_dict())
    assert list(twice) == list(once)
    assert all(torch.equal(once[k], twice[k]) for k in once)
    # the authors' Swin mini into a PVT, or into another Swin size: one
    # clear error naming the problem
    with pytest.raises(ValueError, match='does not fit .*same family'):
        pola_timm.checkpoint_filter_fn(
            official, timm.create_model('pola_pvt_tiny', arch=PVT_MINI))
    with pytest.raises(ValueError, match='does not fit .*file .* vs model'):
        pola_timm.checkpoint_filter_fn(
            official, timm.create_model('pola_swin_tiny',
                                        arch=SWIN_TINY_DEPTH2))


def test_features_only_contract_and_indices():
    """timm's contract: feature_info channels and reductions describe the
    outputs, for a subset with a negative index."""
    x = torch.randn(1, 3, 96, 64)
    for name, arch in (('pola_swin_tiny', SWIN_TINY_DEPTH2),
                       ('pola_pvt_tiny', PVT_TINY)):
        model = timm.create_model(name, arch=arch, features_only=True,
                                  out_indices=(1, -1)).eval()
        with torch.no_grad():
            outs = model(x)
        assert model.feature_info.out_indices == (1, 3)
        assert [o.shape[1] for o in outs] == model.feature_info.channels()
        assert [x.shape[2] // o.shape[2] for o in outs] == \
            model.feature_info.reduction() == [8, 32]
        assert [x.shape[3] // o.shape[3] for o in outs] == [8, 32]


@torch.no_grad()
def test_classifier_interface():
    model = timm.create_model('pola_swin_tiny', arch=SWIN_TINY_DEPTH2).eval()
    x = torch.randn(2, 3, 64, 64)
    assert model(x).shape == (2, 1000)
    assert model.default_cfg is model.pretrained_cfg
    assert model.pretrained_cfg['origin_url'] == pola_timm.AUTHORS_WEIGHTS
    # weight decay: exactly the softmax stages' relative position tables
    names = dict(model.named_parameters())
    nwd = model.no_weight_decay()
    assert nwd and nwd <= set(names)
    assert all(n.endswith('relative_position_bias_table') for n in nwd)
    assert len(nwd) == 4  # two 'S' stages x two blocks
    # timm's optimiser factory: no decay on 1-D parameters and exactly
    # those tables; layer-wise lr decay over stem, 4 stages and head
    opt = timm.optim.create_optimizer_v2(model, 'adamw', weight_decay=0.05,
                                         layer_decay=0.75)
    no_decay = {id(p) for g in opt.param_groups if g['weight_decay'] == 0
                for p in g['params']}
    assert {n for n, p in names.items()
            if p.ndim > 1 and id(p) in no_decay} == nwd
    assert len({g['lr_scale'] for g in opt.param_groups}) == 6
    assert timm.create_model('pola_pvt_tiny',
                             arch=PVT_TINY).no_weight_decay() == set()
    # intermediates, timm's convention: every stage's raw output; norm=True
    # applies the final norm (norm3) to the last; the final output is
    # forward_features'
    final, inter = model.forward_intermediates(x, output_fmt='NHWC')
    assert [tuple(t.shape) for t in inter] == [
        (2, 16, 16, 16), (2, 8, 8, 32), (2, 4, 4, 64), (2, 2, 2, 128)]
    assert torch.equal(final, model.forward_features(x))
    normed = model.forward_intermediates(x, norm=True, indices=[-1],
                                         intermediates_only=True)
    torch.testing.assert_close(normed[0], final)
    assert not torch.allclose(inter[3].permute(0, 3, 1, 2), final)
    with pytest.raises(ValueError, match="output_fmt must be 'NCHW'"):
        model.forward_intermediates(x, output_fmt='NLC')
    with pytest.raises(ValueError, match=r'\(B, 3, H, W\)'):
        model.forward_intermediates(x[0])
    # new head, no head
    model.reset_classifier(5)
    assert model(x).shape == (2, 5)
    model.reset_classifier(0)
    assert model(x).shape == (2, 128)
    assert isinstance(model.get_classifier(), torch.nn.Identity)


def test_grad_checkpointing_same_gradients(monkeypatch):
    import torch.utils.checkpoint as cp
    calls = count_calls(monkeypatch, cp, 'checkpoint')
    torch.manual_seed(0)
    model = timm.create_model('pola_pvt_tiny', arch=PVT_TINY, num_classes=3,
                              drop_path_rate=0.)
    x = torch.randn(2, 3, 32, 32)

    def grads():
        model.zero_grad()
        model(x).square().sum().backward()
        return {n: p.grad.clone() for n, p in model.named_parameters()}

    plain = grads()
    assert not calls
    model.set_grad_checkpointing(True)
    checkpointed = grads()
    assert len(calls) == 4  # one per block of the 4-block model
    assert set(plain) == set(checkpointed)
    for n in plain:
        torch.testing.assert_close(checkpointed[n], plain[n])


def test_pretrained_training_file_other_head_no_file(reference_dir, tmp_path,
                                                     monkeypatch):
    """An authors'-style training file (with a yacs config, which torch's
    weights-only loader refuses) loads through pola_mm's safe loader;
    num_classes != 1000 keeps the head initialised and loads the rest;
    pretrained=True without a file fails with one error that says where
    the weights are and how to pass the file (timm's error for a model
    without published weights)."""
    yacs = pytest.importorskip('yacs.config')
    official = torch.load(
        osp.join(reference_dir, 'official_pola_pvt_mini.pth'),
        map_location='cpu', weights_only=True)['model']
    config = yacs.CfgNode()
    config.MODEL = yacs.CfgNode()
    config.MODEL.TYPE = 'pola_pvt'
    path = str(tmp_path / 'ckpt_epoch_300.pth')
    torch.save({'model': official, 'epoch': 300, 'config': config}, path)
    calls = count_calls(monkeypatch, pola_timm.base,
                        'load_checkpoint_file')
    model = timm.create_model('pola_pvt_tiny', arch=PVT_MINI, num_classes=10,
                              pretrained=True,
                              pretrained_cfg_overlay=dict(file=path))
    assert len(calls) == 1
    sd = model.state_dict()
    assert sd['head.fc.weight'].shape == (10, 256)
    for k, v in official.items():
        if not k.startswith(('head.', 'norm.')):
            assert torch.equal(sd['backbone.' + k], v), k
    with pytest.raises(FileNotFoundError) as err:
        timm.create_model('pola_pvt_tiny', arch=PVT_TINY, pretrained=True)
    for said in ("'ZachMeng/PolaFormer'", pola_timm.AUTHORS_WEIGHTS,
                 "timm.create_model('pola_pvt_tiny', pretrained=True, "
                 "pretrained_cfg_overlay=dict(file="):
        assert said in str(err.value), (said, str(err.value))
    with pytest.raises(FileNotFoundError, match='extraction code|Baidu|pan'):
        timm.create_model('polapp_b1', pretrained=True)
    with pytest.raises(FileNotFoundError,
                       match='authors publish no weights for this model'):
        timm.create_model('pola_pvt_medium', arch=PVT_TINY, pretrained=True)


def test_mmpretrain_timm_backbone():
    """Through timm, mmpretrain's TIMMBackbone builds the model by name."""
    pytest.importorskip('mmpretrain')
    from mmengine.registry import init_default_scope
    from mmpretrain.registry import MODELS
    init_default_scope('mmpretrain')
    backbone = MODELS.build(dict(
        type='TIMMBackbone', model_name='pola_pvt_t', features_only=True,
        pretrained=False, out_indices=(0, 1, 2, 3), arch=PVT_TINY))
    backbone.eval()  # (its train() returns None)
    with torch.no_grad():
        outs = backbone(torch.randn(1, 3, 64, 64))
    assert [tuple(o.shape) for o in outs] == [
        (1, 16, 16, 16), (1, 32, 8, 8), (1, 32, 4, 4), (1, 64, 2, 2)]


def test_fx_feature_extraction_by_node_names():
    """torchvision's create_feature_extractor with timm's notrace lists:
    block outputs and the final norm by node name, equal to the eager
    intermediates; features_only with another feature_cls than the getter
    is refused with the way to do this."""
    from torchvision.models.feature_extraction import (
        create_feature_extractor, get_graph_node_names)
    model = timm.create_model('pola_swin_tiny',
                              arch=SWIN_TINY_DEPTH2).eval()
    tracer = dict(leaf_modules=timm.layers.get_notrace_modules(),
                  autowrap_functions=timm.layers.get_notrace_functions())
    _, nodes = get_graph_node_names(model, tracer_kwargs=tracer)
    assert 'backbone.layers.1.blocks.1' in nodes and 'backbone.norm3' in nodes
    extractor = create_feature_extractor(
        model, return_nodes=['backbone.layers.1.blocks.1', 'backbone.norm3'],
        tracer_kwargs=tracer)
    x = torch.randn(1, 3, 64, 96)
    with torch.no_grad():
        got = extractor(x)
        final, inter = model.forward_intermediates(x)
    stage1 = got['backbone.layers.1.blocks.1']  # tokens (1, 8 * 12, 32)
    torch.testing.assert_close(
        stage1.transpose(1, 2).reshape(inter[1].shape), inter[1])
    torch.testing.assert_close(
        got['backbone.norm3'].transpose(1, 2).reshape(final.shape), final)
    with pytest.raises(ValueError, match='create_feature_extractor'):
        timm.create_model('pola_swin_tiny', arch=SWIN_TINY_DEPTH2,
                          features_only=True, feature_cls='fx')
