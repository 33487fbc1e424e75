"""PolaSwinTransformer / PolaPVT: archs, shapes at any size, gradients,
with_cp, frozen_stages, drop_path and registry scopes."""
import json
import math
import os.path as osp

import pytest
import torch
from helpers import PVT_TINY, SWIN_TINY_DEPTH2, reference_root, stage_grids

from pola_mm.models import PolaPVT, PolaSwinTransformer
from pola_mm.models.checkpoint import convert_official_checkpoint

pytestmark = pytest.mark.slow

BACKBONES = [(PolaSwinTransformer, SWIN_TINY_DEPTH2), (PolaPVT, PVT_TINY)]
IDS = ['swin', 'pvt']
SIZES = [(224, 224), (250, 333), (112, 137), (64, 64), (33, 47), (511, 511)]


def _layouts():
    root = reference_root('official_state_dict_layouts.json')
    with open(osp.join(root, 'official_state_dict_layouts.json')) as f:
        return json.load(f)


FULL_ARCHS = [(PolaSwinTransformer, a, f'pola_swin_{a}')
              for a in ('tiny', 'small', 'base')] + \
             [(PolaPVT, a, f'pola_pvt_{a}')
              for a in ('tiny', 'small', 'medium', 'large')]


@pytest.mark.parametrize('cls,arch,key', FULL_ARCHS,
                         ids=[k for _, _, k in FULL_ARCHS])
def test_full_arch_matches_authors_layout(cls, arch, key):
    """Every published arch has exactly the authors' parameter names and
    shapes after conversion (how hidden full-size weights are checked)."""
    layout = _layouts()[key]
    with torch.device('meta'):  # shapes only: no memory, no init
        model = cls(arch=arch, out_indices=(3, ))
        alias = cls(arch=arch[0], out_indices=(0, ))
    official = {k: torch.empty(s, device='meta')
                for k, s in layout['params'] + layout['buffers']}
    converted = convert_official_checkpoint(official)
    want = {k[len('backbone.'):]: list(v.shape)
            for k, v in converted.items() if k.startswith('backbone.')}
    got = {k: list(v.shape) for k, v in model.state_dict().items()}
    assert got == want
    n_head = sum(math.prod(s) for k, s in layout['params']
                 if k.startswith('head.'))
    assert sum(p.numel() for p in model.parameters()) + n_head + (
        0 if cls is PolaSwinTransformer else
        2 * model.num_features[-1]) == layout['n_params']
    assert alias.arch == model.arch  # aliases


@pytest.mark.parametrize('cls,arch', BACKBONES, ids=IDS)
def test_shapes_any_size(cls, arch):
    model = cls(arch=arch).eval()
    dims = ([arch['embed_dims'] * 2**i for i in range(4)]
            if cls is PolaSwinTransformer else list(arch['embed_dims']))
    with torch.no_grad():
        for H, W in SIZES:
            outs = model(torch.randn(1, 3, H, W))
            assert len(outs) == 4
            grids = stage_grids(
                'swin' if cls is PolaSwinTransformer else 'pvt', H, W)
            for i, o in enumerate(outs):
                assert o.shape == (1, dims[i], *grids[i]), (H, W, i)
                assert torch.isfinite(o).all()


def _grad_check_all(model, x):
    outs = model(x)
    sum((o * torch.randn_like(o)).sum() for o in outs).backward()
    no_grad = [n for n, p in model.named_parameters()
               if p.requires_grad and (p.grad is None or
                                       p.grad.abs().sum() == 0)]
    assert not no_grad, no_grad


@pytest.mark.parametrize('out_indices', [(0, 1, 2, 3), (0, 1), (3, )])
@pytest.mark.parametrize('cls,arch', BACKBONES, ids=IDS)
def test_every_parameter_gets_gradient(cls, arch, out_indices):
    torch.manual_seed(0)
    model = cls(arch=arch, out_indices=out_indices, drop_path_rate=0.)
    model.init_weights()
    model.train()
    _grad_check_all(model, torch.randn(2, 3, 64, 72))
    assert len(model(torch.randn(1, 3, 64, 64))) == len(out_indices)
    if out_indices == (0, 1):
        names = [n for n, _ in model.named_parameters()]
        assert not any(n.startswith(('layers.2', 'block3', 'patch_embed3',
                                     'norm2', 'norm3')) for n in names)


@pytest.mark.parametrize('cls,arch', BACKBONES, ids=IDS)
def test_with_cp_same_gradients(cls, arch):
    torch.manual_seed(0)
    a = cls(arch=arch, drop_path_rate=0.)
    a.init_weights()
    b = cls(arch=arch, drop_path_rate=0., with_cp=True)
    b.load_state_dict(a.state_dict())
    x = torch.randn(1, 3, 40, 52)
    w = [torch.randn_like(o) for o in a(x)]
    for m in (a, b):
        m.train()
        sum((o * wi).sum() for o, wi in zip(m(x), w)).backward()
    for (n, pa), (_, pb) in zip(a.named_parameters(), b.named_parameters()):
        torch.testing.assert_close(pa.grad, pb.grad, rtol=1e-5, atol=1e-6,
                                   msg=n)


def _frozen_names(model):
    return {n for n, p in model.named_parameters() if not p.requires_grad}


def test_frozen_stages_swin():
    m = PolaSwinTransformer(arch=SWIN_TINY_DEPTH2, frozen_stages=0)
    assert _frozen_names(m) == {n for n, _ in m.named_parameters()
                                if n.startswith('patch_embed.')}
    m = PolaSwinTransformer(arch=SWIN_TINY_DEPTH2, frozen_stages=2)
    frozen = _frozen_names(m)
    prefixes = ('patch_embed.', 'layers.0.', 'layers.1.', 'norm0.', 'norm1.')
    assert frozen == {n for n, _ in m.named_parameters()
                      if n.startswith(prefixes)}
    m.train()
    assert not m.patch_embed.training and not m.layers[1].training
    assert not m.norm1.training and m.layers[2].training and m.norm2.training
    m = PolaSwinTransformer(arch=SWIN_TINY_DEPTH2, frozen_stages=-1)
    assert not _frozen_names(m)
    # the frozen part does not change in training
    m = PolaSwinTransformer(arch=SWIN_TINY_DEPTH2, frozen_stages=1).train()
    before = m.layers[0].blocks[0].attn.qkvg.weight.clone()
    opt = torch.optim.SGD([p for p in m.parameters() if p.requires_grad],
                          lr=1.)
    sum(o.sum() for o in m(torch.randn(1, 3, 32, 32))).backward()
    opt.step()
    assert torch.equal(before, m.layers[0].blocks[0].attn.qkvg.weight)


def test_frozen_stages_pvt():
    m = PolaPVT(arch=PVT_TINY, frozen_stages=0)
    assert _frozen_names(m) == {n for n, _ in m.named_parameters()
                                if n.startswith(('patch_embed1.',
                                                 'pos_embed1'))}
    m = PolaPVT(arch=PVT_TINY, frozen_stages=2).train()
    prefixes = ('patch_embed1.', 'pos_embed1', 'block1.', 'patch_embed2.',
                'pos_embed2', 'block2.')
    assert _frozen_names(m) == {n for n, _ in m.named_parameters()
                                if n.startswith(prefixes)}
    assert not m.block2.training and m.block3.training
    assert m.pos_embed3.requires_grad


@pytest.mark.parametrize('cls,arch', BACKBONES, ids=IDS)
def test_drop_path(cls, arch):
    torch.manual_seed(0)
    m = cls(arch=arch, drop_path_rate=0.5)
    probs = [mod.drop_prob for mod in m.modules() if hasattr(mod,
                                                             'drop_prob')]
    n = sum(arch['depths'])
    assert len(probs) == n - 1  # the first block has rate 0 (Identity)
    assert probs[-1] == pytest.approx(0.5)
    assert probs == sorted(probs)
    x = torch.randn(2, 3, 32, 32)
    m.eval()
    with torch.no_grad():
        assert torch.equal(m(x)[-1], m(x)[-1])
        m.train()
        assert not torch.equal(m(x)[-1], m(x)[-1])


@pytest.mark.parametrize('cls,arch', BACKBONES, ids=IDS)
def test_bf16_autocast_backbone(cls, arch):
    m = cls(arch=arch)
    m.init_weights()
    x = torch.randn(1, 3, 64, 64)
    with torch.autocast('cpu', dtype=torch.bfloat16):
        outs = m(x)
    assert all(torch.isfinite(o.float()).all() for o in outs)
    sum(o.float().sum() for o in outs).backward()
    assert all(torch.isfinite(p.grad).all() for p in m.parameters()
               if p.grad is not None)


def test_arch_errors():
    with pytest.raises(ValueError, match="valid names.*'base'"):
        PolaSwinTransformer(arch='huge')
    with pytest.raises(KeyError, match='num_heads'):
        PolaSwinTransformer(arch=dict(embed_dims=16, depths=(1, 1, 1, 1)))
    with pytest.raises(ValueError, match="valid names.*'medium'"):
        PolaPVT(arch='xl')
    with pytest.raises(KeyError, match='mlp_ratios'):
        PolaPVT(arch=dict(embed_dims=(8, 8, 8, 8), depths=(1, 1, 1, 1),
                          num_heads=(1, 1, 1, 1)))
    with pytest.raises(ValueError, match='out_indices'):
        PolaSwinTransformer(arch=SWIN_TINY_DEPTH2, out_indices=(4, ))
    with pytest.raises(ValueError, match='attn_layout'):
        PolaSwinTransformer(arch=SWIN_TINY_DEPTH2, attn_layout='LLS')


def test_window_rules_and_layouts():
    m = PolaSwinTransformer(arch='tiny', out_indices=(3, ))
    assert [set(w) for w in m.window_sizes] == [
        {(56, 56)}, {(28, 28)}, {(7, 7)}, {(7, 7)}]
    assert tuple(m.layers[0].blocks[0].attn.positional_encoding.shape) == (
        1, 3136, 96)
    m = PolaSwinTransformer(arch=SWIN_TINY_DEPTH2,
                            attn_layout='LLLL', window_size=7)
    assert m.layers[3].blocks[0].attn.ref_hw == (7, 7)
    m = PolaSwinTransformer(arch=SWIN_TINY_DEPTH2, attn_layout='SSSS')
    assert all(w == (7, 7) for ws in m.window_sizes for w in ws)
    with torch.no_grad():
        assert m(torch.randn(1, 3, 45, 61))[0].shape == (1, 16, 12, 16)
    p = PolaPVT(arch=PVT_TINY, attn_layout='SSLL')
    with torch.no_grad():
        outs = p(torch.randn(1, 3, 45, 61))
    # the authors' PVT: floor(45 / 4) = 11, ... 11 // 8 = 1
    assert outs[0].shape == (1, 16, 11, 15) and outs[3].shape == (1, 64, 1, 1)


def _record_polarity_maps(monkeypatch):
    """Record ``(ref_hw, hw, batch)`` of every polarity attention call."""
    from pola_mm.models.layers import PolarityAttention
    seen = []
    forward = PolarityAttention.forward

    def spy(self, x, hw):
        seen.append((self.ref_hw, tuple(hw), x.shape[0]))
        return forward(self, x, hw)

    monkeypatch.setattr(PolarityAttention, 'forward', spy)
    return seen


@pytest.mark.parametrize('grad', [True, False])
def test_swin_polarity_stages_are_global_at_detection_sizes(monkeypatch,
                                                            grad):
    """At a detection-like size every polarity block attends over its whole
    stage map (one sequence per image, the table resized from 56x56 /
    28x28), in training and at inference."""
    seen = _record_polarity_maps(monkeypatch)
    model = PolaSwinTransformer(arch=SWIN_TINY_DEPTH2, out_indices=(3, ))
    model.train(grad)
    x = torch.randn(2, 3, 320, 480)
    with torch.set_grad_enabled(grad):
        model(x)
    assert seen == [((56, 56), (80, 120), 2)] * 2 + \
        [((28, 28), (40, 60), 2)] * 2


def test_swin_t_at_224_uses_the_tables_as_they_are(monkeypatch):
    """At 224 each polarity stage map is the table's grid: the published
    computation, nothing resized."""
    seen = _record_polarity_maps(monkeypatch)
    model = PolaSwinTransformer(arch='tiny', out_indices=(1, )).eval()
    with torch.no_grad():
        out = model(torch.randn(1, 3, 224, 224))
    assert out[0].shape == (1, 192, 28, 28)
    assert seen == [((56, 56), (56, 56), 1)] * 2 + \
        [((28, 28), (28, 28), 1)] * 2


@pytest.mark.parametrize('scope', ['mmdet', 'mmseg', 'mmpretrain', None])
@pytest.mark.parametrize('name,arch', [
    ('PolaSwinTransformer', SWIN_TINY_DEPTH2),
    ('PolaPVT', PVT_TINY)])
def test_build_from_scopes(scope, name, arch):
    import importlib

    from mmengine.registry import MODELS as ROOT
    from mmengine.registry import DefaultScope
    if scope is None:
        from pola_mm.registry import MODELS
        cfg_type = f'pola_mm.{name}'
        model = MODELS.build(dict(type=cfg_type, arch=arch))
        assert type(model).__name__ == name
        model = ROOT.build(dict(type=name, arch=arch))
        assert type(model).__name__ == name
        return
    importlib.import_module(f'{scope}.models')
    registry = importlib.import_module(f'{scope}.registry').MODELS
    with DefaultScope.overwrite_default_scope(scope):
        model = registry.build(dict(type=name, arch=arch, out_indices=(0, )))
    assert type(model).__name__ == name


@pytest.mark.parametrize('cls,arch', BACKBONES, ids=IDS)
def test_default_init(cls, arch):
    """The authors' init: power, scale and positional_encoding start at 0,
    Linear layers and learned tables trunc-normal (std .02)."""
    m = cls(arch=arch)
    with torch.no_grad():
        for p in m.parameters():
            p.fill_(1.)
    m.init_weights()
    for n, p in m.named_parameters():
        if n.endswith(('.power', '.scale', '.positional_encoding')):
            assert not p.any(), n
        elif n.endswith(('relative_position_bias_table', 'fc1.weight')) or \
                n.startswith('pos_embed'):
            assert 0.01 < p.std() < 0.03, n
        elif n.endswith('fc1.bias'):
            assert not p.any(), n


@pytest.mark.parametrize('cls, arch', [
    (PolaSwinTransformer, dict(embed_dims=16, depths=(1, 1, 1, 1),
                               num_heads=(1, 1, 2, 2))),
    (PolaPVT, dict(embed_dims=(16, 32, 32, 64), depths=(1, 1, 1, 1),
                   num_heads=(1, 1, 2, 2), mlp_ratios=(2, 2, 2, 2)))])
def test_wrong_input_shape_is_named(cls, arch):
    model = cls(arch=arch)
    with pytest.raises(ValueError, match=r'\(B, 3, H, W\).*in_channels=1'):
        model(torch.zeros(1, 1, 32, 32))
    with pytest.raises(ValueError, match='batch dimension'):
        model(torch.zeros(3, 32, 32))


def test_backbones_trace_without_graph_breaks():
    """torch.compile sees each backbone as one graph, in inference and in
    training, at a size that pads and shifts both kinds of windows (one-copy
    pad/partition, masked polarity kernel, fused or explicit softmax)."""
    explain = pytest.importorskip('torch._dynamo').explain
    swin = PolaSwinTransformer(
        arch=dict(embed_dims=16, depths=(2, 2), num_heads=(1, 2)),
        attn_layout='LS', window_size=8, pretrain_img_size=64,
        out_indices=(0, 1))
    pvt = PolaPVT(arch=PVT_TINY, out_indices=(0, 1))
    x = torch.randn(1, 3, 76, 100)
    for model in (swin, pvt):
        for train in (False, True):
            model.train(train)
            with torch.set_grad_enabled(train):
                result = explain(model)(x)
            assert result.graph_break_count == 0, result.break_reasons


#: One tiny model of each family, for the shared stage contract.
def _families():
    from helpers import POLAPP_TINY

    from pola_mm.models import PolaPP
    return [PolaSwinTransformer(arch=SWIN_TINY_DEPTH2),
            PolaPVT(arch=PVT_TINY), PolaPP(arch=POLAPP_TINY)]


@pytest.mark.parametrize('index', [0, 1, 2], ids=['swin', 'pvt', 'polapp'])
def test_every_family_has_one_stage_contract(index):
    """Each family's stages are modules with one forward: tokens on a grid
    in, tokens of the same shape out; ``downsample`` leads to the next
    stage; the one loop (``run_stages``) gives the backbone's outputs."""
    from pola_mm.models.layers import to_map
    torch.manual_seed(0)
    model = _families()[index].eval()
    model.init_weights()
    assert len(model.stages) == model.num_built == 4
    x = torch.randn(2, 3, 70, 90)
    with torch.no_grad():
        outs = model(x)
        tokens, hw = model.stem(x)
        for i, stage in enumerate(model.stages):
            forwards = {n for k in type(stage).__mro__
                        if k.__module__.startswith('pola_mm.')
                        for n in vars(k) if n.startswith('forward')}
            assert forwards == {'forward'}, type(stage)
            if i > 0:
                tokens, hw = model.downsample(i - 1, tokens, hw)
            out = stage(tokens, hw)
            assert isinstance(out, torch.Tensor)
            assert out.shape == tokens.shape
            tokens = out
            assert torch.equal(
                to_map(model.out_norm(i, tokens), hw), outs[i])
        last, last_hw, taken = model.run_stages(x, 1, (0, 1), norm=False)
    assert [t.shape[1] for t, _ in taken] == [
        o.shape[2] * o.shape[3] for o in outs[:2]]
    assert last_hw == tuple(outs[1].shape[2:])
    assert torch.equal(last, taken[1][0])


def test_pvt_stages_keep_the_authors_keys():
    """Pola-PVT's stage modules are the authors' ``block{i}`` lists."""
    model = PolaPVT(arch=PVT_TINY)
    assert list(model.stages) == [model.block1, model.block2, model.block3,
                                  model.block4]
    assert 'block1.0.attn.qg.weight' in model.state_dict()


@pytest.mark.parametrize('cls,arch,dpr', [
    (PolaSwinTransformer, 'tiny', 0.2), (PolaSwinTransformer, 's', 0.3),
    (PolaSwinTransformer, 'base', 0.5), (PolaPVT, 'tiny', 0.1),
    (PolaPVT, 'small', 0.1), (PolaPVT, 'medium', 0.3),
    (PolaPVT, 'l', 0.3)])
def test_drop_path_comes_from_the_arch_table(cls, arch, dpr):
    """The arch table holds the authors' ImageNet drop path: the backbone
    builds with it unless told otherwise; the zoo's softmax counterpart
    gets the same."""
    from pola_mm.analysis.zoo import counterpart
    assert cls.arch_zoo[arch]['drop_path_rate'] == dpr
    with torch.device('meta'):
        assert cls(arch=arch, out_indices=(0, )).drop_path_rate == dpr
        assert cls(arch=arch, out_indices=(0, ),
                   drop_path_rate=0.05).drop_path_rate == 0.05
    soft = counterpart(dict(type=cls.__name__, arch=arch))
    assert soft['drop_path_rate'] == dpr
    tiny = SWIN_TINY_DEPTH2 if cls is PolaSwinTransformer else PVT_TINY
    assert cls(arch=tiny).drop_path_rate == 0.1  # a dict without one


def test_blocks_choose_attention_by_one_rule():
    """Every family's block takes 'L' or 'S' and names both otherwise."""
    from pola_mm.models.backbones.pola_pvt import PolaPVTBlock
    from pola_mm.models.backbones.pola_swin import PolaSwinBlock
    from pola_mm.models.layers import (PaCSAttention, PolaPPBlock,
                                       PolarityAttention, RotarySelfAttention,
                                       SpatialReductionAttention, WindowMSA)
    builds = {
        'swin': lambda t: PolaSwinBlock(16, 2, 7, attn_type=t),
        'pvt': lambda t: PolaPVTBlock(16, 2, (8, 8), 2., attn_type=t,
                                      sr_ratio=2),
        'polapp': lambda t: PolaPPBlock(16, 2, t, 2.),
    }
    kinds = {'swin': (PolarityAttention, WindowMSA),
             'pvt': (PolarityAttention, SpatialReductionAttention),
             'polapp': (PaCSAttention, RotarySelfAttention)}
    for name, build in builds.items():
        assert type(build('L').attn) is kinds[name][0]
        assert type(build('S').attn) is kinds[name][1]
        with pytest.raises(ValueError,
                           match=r"'L' \(polarity.*'S' \(softmax.*'M'"):
            build('M')
