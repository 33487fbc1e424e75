"""PolaPP (PolaFormer++): the authors' reference minis, archs, loading,
sizes, freezing, BatchNorm eval, checkpointing, registration."""
import os.path as osp

import pytest
import torch
from helpers import REPO, reference_root

from pola_mm.models.backbones import PolaPP
from pola_mm.models.layers import PaCSAttention, to_map
from pola_mm.ops import use_implementation

pytestmark = pytest.mark.slow

#: A tiny arch (two blocks in stage 1, layer scale on stages 3-4).
TINY = dict(embed_dims=(16, 32, 32, 64), depths=(2, 1, 1, 1),
            num_heads=(2, 2, 2, 4), layer_scale_init=(None, None, 1., 1.))
MINIS = ['official_polapp_mini', 'official_polapp_mini_nols']


def mini_arch(io: dict) -> dict:
    """PolaPP's arch dict from the authors' kwargs in an ``_io.pth``."""
    a = io['arch']
    return dict(embed_dims=a['embed_dims'], depths=a['depths'],
                num_heads=a['num_heads'], mlp_ratios=a['mlp_ratios'],
                layer_scale_init=[v if on else None for v, on in zip(
                    a['layer_init_values'], a['layerscales'])])


@pytest.fixture(scope='module')
def polapp_dir() -> str:
    return reference_root('official_polapp_mini_nols_io.pth')


@pytest.mark.parametrize('name', MINIS)
def test_reproduces_the_authors_minis(polapp_dir, name):
    """The authors' file loaded through init_cfg reproduces their four
    outputs at 224x224 and 160x248, fast paths on and off."""
    io = torch.load(osp.join(polapp_dir, f'{name}_io.pth'),
                    map_location='cpu', weights_only=True)
    model = PolaPP(arch=mini_arch(io), init_cfg=dict(
        type='Pretrained', checkpoint=osp.join(polapp_dir, f'{name}.pth')))
    model.init_weights()
    model.eval()
    assert set(io['inputs']) == {'224x224', '160x248'}
    for size, x in io['inputs'].items():
        for plain in (False, True):
            with torch.no_grad():
                if plain:
                    with use_implementation('graph'):
                        outs = model(x)
                else:
                    outs = model(x)
            assert len(outs) == 4
            for i, (got, want) in enumerate(zip(outs, io['outputs'][size])):
                assert got.shape == want.shape, (size, i)
                err = (got - want).abs().max().item()
                assert err <= 1e-4, (name, size, plain, i, err)


def test_refuses_a_checkpoint_of_another_arch(polapp_dir):
    model = PolaPP(arch=TINY, init_cfg=dict(
        type='Pretrained',
        checkpoint=osp.join(polapp_dir, 'official_polapp_mini.pth')))
    with pytest.raises(ValueError, match='does not fit this backbone'):
        model.init_weights()
    # nothing was copied, not even the stem whose shapes fit
    ckpt = torch.load(osp.join(polapp_dir, 'official_polapp_mini.pth'),
                      map_location='cpu', weights_only=True)['model']
    stem = 'patch_embed.proj.0.weight'
    assert ckpt[stem].shape == model.state_dict()[stem].shape
    assert not torch.equal(ckpt[stem], model.state_dict()[stem])


def test_loads_a_detector_checkpoint_and_partial_builds(polapp_dir,
                                                        tmp_path):
    """A ``backbone.*`` file (what mmdet saves) loads; a backbone built up
    to stage 2 ignores the later stages' keys."""
    sd = torch.load(osp.join(polapp_dir, 'official_polapp_mini.pth'),
                    map_location='cpu', weights_only=True)['model']
    io = torch.load(osp.join(polapp_dir, 'official_polapp_mini_io.pth'),
                    map_location='cpu', weights_only=True)
    path = str(tmp_path / 'det.pth')
    torch.save({'state_dict': {**{'backbone.' + k: v for k, v in sd.items()},
                               'neck.w': torch.zeros(1)}}, path)
    model = PolaPP(arch=mini_arch(io), out_indices=(1, ),
                   init_cfg=dict(type='Pretrained', checkpoint=path)).eval()
    model.init_weights()
    assert len(model.layers) == 2 and model.layers[1].downsample is None
    assert list(model.extra_norms) == ['1']
    with torch.no_grad():
        out, = model(io['inputs']['160x248'])
    want = io['outputs']['160x248'][1]
    assert (out - want).abs().max() <= 1e-4


def _converter():
    """tools/model_converters/pola_official_to_mm.py as a module."""
    import importlib.util
    spec = importlib.util.spec_from_file_location(
        'pola_official_to_mm', osp.join(REPO, 'tools', 'model_converters',
                                        'pola_official_to_mm.py'))
    tool = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tool)
    return tool


def test_converter_output_loads(polapp_dir, tmp_path, capsys):
    """tools/model_converters/pola_official_to_mm.py writes backbone.*
    keys without the recomputed rotary buffers; the result loads through
    init_cfg and gives the authors' outputs."""
    tool = _converter()
    dst = str(tmp_path / 'polapp_mini_mm.pth')
    src = osp.join(polapp_dir, 'official_polapp_mini_nols.pth')
    assert tool.main([src, dst]) == 0
    assert '(PolaPP)' in capsys.readouterr().out
    ckpt = torch.load(dst, map_location='cpu', weights_only=True)
    keys = list(ckpt['state_dict'])
    assert keys and all(k.startswith('backbone.') for k in keys)
    assert not any('RoPE' in k for k in keys)
    io = torch.load(osp.join(polapp_dir, 'official_polapp_mini_nols_io.pth'),
                    map_location='cpu', weights_only=True)
    model = PolaPP(arch=mini_arch(io), out_indices=(0, ), init_cfg=dict(
        type='Pretrained', checkpoint=dst)).eval()
    model.init_weights()
    with torch.no_grad():
        out, = model(io['inputs']['160x248'])
    assert (out - io['outputs']['160x248'][0]).abs().max() <= 1e-4


# ------------------------------------------- the authors' ImageNet classifier
# models/pola.py (their POLA_b*): the last stage without a norm, ``proj``
# Conv2d(C, P, 1), ``norm`` BatchNorm2d(P), Swish, AdaptiveAvgPool2d(1),
# ``head`` Conv2d(P, classes, 1); no ``extra_norms``. main_ema.py saves
# ``model`` (raw weights), ``state_dict_ema``, optimiser, scheduler, a yacs
# ``config``; their downstream code loads ``model``.
CLS_P, CLS_K = 48, 10  # projection and classes of the mini classifier


def authors_classifier_file(polapp_dir: str, folder) -> tuple:
    """``(path, model state dict)`` of the reference mini (with layer
    scale) as the authors' ImageNet classifier, saved as main_ema.py does;
    ``state_dict_ema`` holds other values (every float + 1)."""
    yacs = pytest.importorskip('yacs.config')
    sd = torch.load(osp.join(polapp_dir, 'official_polapp_mini.pth'),
                    map_location='cpu', weights_only=True)['model']
    sd = {k: v for k, v in sd.items() if not k.startswith('extra_norms.')}
    C = sd['layers.3.blocks.0.norm1.norm.weight'].shape[0]
    g = torch.Generator().manual_seed(0)
    # the mini's raw last stage has an rms of about 100 (random layer
    # scales): a proj of that gain keeps the BatchNorm / Swish inputs O(1)
    sd.update({
        'proj.weight': torch.randn(CLS_P, C, 1, 1, generator=g) * C**-0.5 /
        100,
        'proj.bias': torch.randn(CLS_P, generator=g) * 0.1,
        'norm.weight': 1 + 0.3 * torch.randn(CLS_P, generator=g),
        'norm.bias': 0.3 * torch.randn(CLS_P, generator=g),
        'norm.running_mean': 0.2 * torch.randn(CLS_P, generator=g),
        'norm.running_var': 0.5 + torch.rand(CLS_P, generator=g),
        'norm.num_batches_tracked': torch.tensor(1000),
        'head.weight': torch.randn(CLS_K, CLS_P, 1, 1, generator=g) *
        CLS_P**-0.5,
        'head.bias': 0.1 * torch.randn(CLS_K, generator=g),
    })
    config = yacs.CfgNode()
    config.MODEL = yacs.CfgNode()
    config.MODEL.TYPE = 'pola'
    config.MODEL.NAME = 'POLA_mini'
    config.freeze()
    path = str(folder / 'max_acc.pth')
    torch.save({'model': sd,
                'optimizer': {'state': {}, 'param_groups': []},
                'lr_scheduler': {'t_initial': 300},
                'max_accuracy': 80.0, 'max_accuracy_e': 80.2, 'epoch': 300,
                'config': config,
                'state_dict_ema': {k: v + 1 if v.is_floating_point() else v
                                   for k, v in sd.items()}}, path)
    return path, sd


@pytest.fixture(scope='module')
def authors_classifier(polapp_dir, tmp_path_factory) -> tuple:
    return authors_classifier_file(polapp_dir,
                                   tmp_path_factory.mktemp('polapp_cls'))


def test_loads_the_authors_imagenet_classifier(polapp_dir,
                                               authors_classifier,
                                               monkeypatch):
    """The authors' classifier file loads into the detection backbone: the
    raw ``model`` weights (not the EMA), proj / norm / head dropped,
    ``extra_norms`` fresh, all said in the one load line; a backbone of
    another arch still refuses it."""
    from pola_mm.models import checkpoint
    path, sd = authors_classifier
    logs = []
    monkeypatch.setattr(checkpoint, 'print_log',
                        lambda msg, logger=None: logs.append(msg))
    io = torch.load(osp.join(polapp_dir, 'official_polapp_mini_io.pth'),
                    map_location='cpu', weights_only=True)
    model = PolaPP(arch=mini_arch(io), init_cfg=dict(type='Pretrained',
                                                     checkpoint=path))
    model.init_weights()
    own = model.state_dict()
    backbone = [k for k in sd if k.startswith(('patch_embed.', 'layers.'))
                and 'RoPE' not in k]
    assert backbone and all(torch.equal(own[k], sd[k]) for k in backbone)
    assert sorted(k for k in own if k not in sd) == sorted(
        f'extra_norms.{i}.norm.{p}' for i in range(4)
        for p in ('weight', 'bias'))
    line = logs[-1]
    assert line.startswith('PolaPP: loaded')
    for said in ("PolaPP ImageNet classifier", 'proj / norm / head',
                 'extra_norms.* start fresh', "not 'state_dict_ema'"):
        assert said in line, (said, line)
    other = PolaPP(arch=TINY, init_cfg=dict(type='Pretrained',
                                            checkpoint=path))
    with pytest.raises(ValueError, match='does not fit this backbone'):
        other.init_weights()


def test_converter_maps_the_authors_classifier(authors_classifier,
                                               tmp_path, capsys):
    """The CLI writes backbone.*, neck.{proj,norm}.* and head.fc.* (the 1x1
    conv head as a (classes, P) matrix) from ``model``, not the EMA."""
    from pola_mm.models import convert_official_checkpoint
    path, sd = authors_classifier
    tool = _converter()
    dst = str(tmp_path / 'polapp_cls_mm.pth')
    assert tool.main([path, dst]) == 0
    assert '7 neck (PolaPPClsNeck) + 2 head tensors' in capsys.readouterr(
    ).out
    got = torch.load(dst, map_location='cpu', weights_only=True)['state_dict']
    want = convert_official_checkpoint(sd)
    assert list(got) == list(want)
    assert all(torch.equal(got[k], want[k]) for k in got)
    assert got['head.fc.weight'].shape == (CLS_K, CLS_P)
    assert torch.equal(got['head.fc.weight'], sd['head.weight'][:, :, 0, 0])
    assert torch.equal(got['neck.norm.running_var'], sd['norm.running_var'])
    assert {k.split('.')[0] for k in got} == {'backbone', 'neck', 'head'}
    assert not any('extra_norms' in k or 'RoPE' in k for k in got)


def authors_classifier_logits(stage4: torch.Tensor, sd: dict
                              ) -> torch.Tensor:
    """The rest of the authors' ``POLA.forward`` (models/pola.py) after the
    layers, in plain torch: ``proj``, ``norm`` (BatchNorm2d, eval, eps
    1e-5), ``MemoryEfficientSwish`` (x * sigmoid(x)), ``avgpool``, ``head``
    (1x1 conv), ``flatten(1)``. ``(B, C, h, w)`` -> ``(B, classes)``."""
    import torch.nn.functional as F
    x = F.conv2d(stage4, sd['proj.weight'], sd['proj.bias'])
    x = F.batch_norm(x, sd['norm.running_mean'], sd['norm.running_var'],
                     sd['norm.weight'], sd['norm.bias'], False, 0.1, 1e-5)
    x = x * torch.sigmoid(x)
    x = F.adaptive_avg_pool2d(x, 1)
    return F.conv2d(x, sd['head.weight'], sd['head.bias']).flatten(1)


def test_classifier_config_gives_the_authors_logits(polapp_dir,
                                                    authors_classifier,
                                                    tmp_path):
    """configs/polapp_b1_in1k.py's classifier (mini arch), loaded from the
    converted authors' file as ``load_from`` does, gives the authors'
    logits. Their last stage's raw output is the input of the reference
    model's ``extra_norms.3``, whose output is checked against theirs."""
    pytest.importorskip('mmpretrain.models')
    from mmengine.config import Config
    from mmengine.registry import init_default_scope
    from mmengine.runner import load_checkpoint
    path, sd = authors_classifier
    io = torch.load(osp.join(polapp_dir, 'official_polapp_mini_io.pth'),
                    map_location='cpu', weights_only=True)
    arch = mini_arch(io)
    cfg = Config.fromfile(osp.join(REPO, 'configs', 'polapp_b1_in1k.py'))
    cfg.model.backbone.arch = arch
    cfg.model.neck.update(in_channels=arch['embed_dims'][3],
                          out_channels=CLS_P)
    cfg.model.head.update(in_channels=CLS_P, num_classes=CLS_K)
    init_default_scope('mmpretrain')
    from mmpretrain.registry import MODELS
    classifier = MODELS.build(cfg.model)
    assert type(classifier.neck).__name__ == 'PolaPPClsNeck'
    assert len(classifier.backbone.extra_norms) == 0
    dst = str(tmp_path / 'cls.pth')
    assert _converter().main([path, dst]) == 0
    load_checkpoint(classifier, dst, map_location='cpu', strict=True)
    classifier.eval()
    reference = PolaPP(arch=arch, init_cfg=dict(
        type='Pretrained',
        checkpoint=osp.join(polapp_dir, 'official_polapp_mini.pth'))).eval()
    reference.init_weights()
    raw = []
    reference.extra_norms['3'].register_forward_hook(
        lambda m, args, out: raw.append(args[0]))
    for size, x in io['inputs'].items():
        with torch.no_grad():
            outs = reference(x)
            got = classifier(x, mode='tensor')
        assert (outs[3] - io['outputs'][size][3]).abs().max() <= 1e-4
        stage4 = to_map(raw.pop(), outs[3].shape[2:])
        want = authors_classifier_logits(stage4, sd)
        assert got.shape == (x.shape[0], CLS_K)
        assert 0.5 < want.abs().max() < 20  # Swish in its curved range
        err = (got - want).abs().max().item()
        assert err <= 1e-4, (size, err)


def test_cls_neck_checks_its_input_and_inits_as_the_authors():
    """PolaPPClsNeck: (..., (B, C, H, W)) -> ((B, P), ); a map of other
    channels gets one error naming the fix; the authors' conv init."""
    from pola_mm.models import PolaPPClsNeck
    neck = PolaPPClsNeck(in_channels=64, out_channels=256)
    neck.init_weights()
    assert 0.015 < neck.proj.weight.std() < 0.025
    assert (neck.proj.bias == 0).all()
    assert (neck.norm.weight == 1).all() and (neck.norm.bias == 0).all()
    out, = neck((torch.randn(2, 32, 8, 8), torch.randn(2, 64, 5, 3)))
    assert out.shape == (2, 256)
    with pytest.raises(ValueError, match="in_channels to the backbone's"):
        neck((torch.randn(2, 32, 8, 8), ))


def test_detection_config_loads_the_authors_classifier(polapp_dir,
                                                       authors_classifier):
    """mask_rcnn_polapp_b3.py's backbone (mini arch) with init_cfg at the
    authors' classifier file builds and loads it when the detector is
    initialised."""
    pytest.importorskip('mmdet.models')
    from mmengine.config import Config
    from mmengine.registry import init_default_scope
    path, sd = authors_classifier
    io = torch.load(osp.join(polapp_dir, 'official_polapp_mini_io.pth'),
                    map_location='cpu', weights_only=True)
    arch = mini_arch(io)
    cfg = Config.fromfile(osp.join(REPO, 'configs', 'mask_rcnn_polapp_b3.py'))
    assert cfg.model.backbone.init_cfg.type == 'Pretrained'
    cfg.model.backbone.arch = arch
    cfg.model.backbone.init_cfg.checkpoint = path
    cfg.model.neck.in_channels = list(arch['embed_dims'])
    init_default_scope('mmdet')
    from mmdet.registry import MODELS
    detector = MODELS.build(cfg.model)
    detector.init_weights()
    own = detector.backbone.state_dict()
    for key in ('patch_embed.proj.0.weight', 'layers.3.blocks.0.gamma_2',
                'layers.0.blocks.0.attn.s1', 'layers.2.downsample.norm.'
                'running_var'):
        assert torch.equal(own[key], sd[key]), key


@pytest.mark.parametrize('arch', ['b1', 'b2', 'b3', 'b4', 'b5'])
def test_published_archs(arch):
    """b1-b5 build with the authors' definitions (reference README table):
    stage channels = embed dims, blocks, heads, FFN width 3.5 C, layer-scale
    init, drop path; PaCS in stages 1-2, softmax in 3-4."""
    spec = PolaPP.arch_zoo[arch]
    with torch.device('meta'):
        model = PolaPP(arch=arch)
    assert model.num_features == list(spec['embed_dims'])
    assert model.drop_path_rate == spec['drop_path_rate']
    for i, stage in enumerate(model.layers):
        C = spec['embed_dims'][i]
        assert len(stage.blocks) == spec['depths'][i]
        for blk in stage.blocks:
            assert type(blk.attn).__name__ == (
                'PaCSAttention' if i < 2 else 'RotarySelfAttention')
            assert blk.attn.num_heads == spec['num_heads'][i]
            assert blk.ffn.fc1.out_features == int(3.5 * C)
            assert blk.gamma_1.shape == (1, C, 1, 1)
        assert (stage.downsample is None) == (i == 3)
    with torch.device('cpu'):
        blk = PolaPP(arch=arch, out_indices=(0, )).layers[0].blocks[0]
    assert (blk.gamma_1 == spec['layer_scale_init'][0]).all()


def test_bad_arguments_say_what_is_valid():
    with pytest.raises(ValueError, match="valid names are \\['b0'"):
        PolaPP(arch='b9')
    with pytest.raises(KeyError, match='num_heads'):
        PolaPP(arch=dict(embed_dims=(16, ) * 4, depths=(1, ) * 4))
    with pytest.raises(ValueError, match='one entry per stage'):
        PolaPP(arch=dict(TINY, mlp_ratios=(2, 2)))
    with pytest.raises(ValueError, match='must lie in'):
        PolaPP(arch=TINY, out_indices=(4, ))
    with pytest.raises(ValueError, match=r'\(B, 3, H, W\)'):
        PolaPP(arch=TINY)(torch.zeros(3, 32, 32))
    # one 32x32 image in training: 1x1 into the last BatchNorm
    with pytest.raises(ValueError, match='batch of 2 or more'):
        PolaPP(arch=TINY).train()(torch.zeros(1, 3, 32, 32))
    PolaPP(arch=TINY, norm_eval=True).train()(torch.zeros(1, 3, 32, 32))
    PolaPP(arch=TINY).train()(torch.zeros(1, 3, 33, 32))


@pytest.mark.parametrize('hw', [(64, 64), (33, 47), (5, 3), (1, 1)])
def test_any_size_gives_ceil_strides(hw):
    model = PolaPP(arch=TINY)
    model.init_weights()
    outs = model(torch.randn(2, 3, *hw))
    for i, o in enumerate(outs):
        s = 2**(i + 2)
        assert o.shape == (2, TINY['embed_dims'][i], -(-hw[0] // s),
                           -(-hw[1] // s))
    sum(o.square().mean() for o in outs).backward()
    missing = [n for n, p in model.named_parameters() if p.grad is None]
    assert missing == []


def test_out_indices_build_only_what_is_used():
    model = PolaPP(arch=TINY, out_indices=(0, 2))
    assert len(model.layers) == 3
    assert sorted(model.extra_norms) == ['0', '2']
    outs = model(torch.randn(1, 3, 32, 40))
    assert [o.shape[1] for o in outs] == [16, 32]
    sum(o.sum() for o in outs).backward()
    assert [n for n, p in model.named_parameters() if p.grad is None] == []


def test_frozen_stages_and_norm_eval():
    model = PolaPP(arch=TINY, frozen_stages=1, norm_eval=True)
    model.train()
    frozen = [n for n, p in model.named_parameters() if not p.requires_grad]
    assert frozen and all(
        n.startswith(('patch_embed.', 'layers.0.', 'extra_norms.0.'))
        for n in frozen)
    assert all(p.requires_grad for n, p in model.named_parameters()
               if n.startswith('layers.1.'))
    assert not model.patch_embed.training
    assert not model.layers[0].training and model.layers[1].training
    bns = [m for m in model.modules()
           if isinstance(m, torch.nn.BatchNorm2d)]
    assert bns and not any(m.training for m in bns)
    stats = model.layers[1].downsample.norm.running_mean.clone()
    model(torch.randn(2, 3, 32, 32))
    assert torch.equal(stats, model.layers[1].downsample.norm.running_mean)
    # without norm_eval the unfrozen BatchNorms train
    model = PolaPP(arch=TINY, frozen_stages=0).train()
    assert not model.patch_embed.proj[1].training
    assert model.layers[0].downsample.norm.training


def test_with_cp_same_gradients_and_drop_path():
    torch.manual_seed(0)
    a = PolaPP(arch=TINY, drop_path_rate=0.)
    b = PolaPP(arch=TINY, drop_path_rate=0., with_cp=True)
    b.load_state_dict(a.state_dict())
    a.eval(), b.eval()  # BatchNorm statistics fixed, no drop path
    x = torch.randn(1, 3, 32, 32, requires_grad=True)
    for m in (a, b):
        sum(o.sum() for o in m(x)).backward()
    for (n, p), q in zip(a.named_parameters(), b.parameters()):
        torch.testing.assert_close(p.grad, q.grad, msg=n)
    # drop path: random in training, off in eval
    # (every stage: the early blocks' rates are small, 0 and 0.225)
    c = PolaPP(arch=TINY, drop_path_rate=0.9).train()
    y = torch.randn(2, 3, 32, 32)
    torch.manual_seed(1)
    o1 = c(y)
    torch.manual_seed(2)
    o2 = c(y)
    assert not all(torch.equal(a, b) for a, b in zip(o1, o2))
    torch.manual_seed(1)
    assert all(torch.equal(a, b) for a, b in zip(o1, c(y)))
    c.eval()
    assert all(torch.equal(a, b) for a, b in zip(c(y), c(y)))


def test_built_from_the_shared_layers():
    """One house style: the backbone file holds only the backbone; blocks,
    attentions, FFN, stem and the drop path come from ``layers/`` (the drop
    path is the one of every backbone, ``bricks.DropPath``)."""
    import inspect

    import pola_mm.models.backbones.polapp as polapp_file
    from pola_mm.models import layers
    from pola_mm.models.layers.bricks import DropPath
    defined = [n for n, v in vars(polapp_file).items() if inspect.isclass(v)
               and v.__module__ == polapp_file.__name__]
    assert defined == ['PolaPP']
    model = PolaPP(arch=TINY, drop_path_rate=0.4)
    blocks = [b for b in model.modules() if isinstance(b, layers.PolaPPBlock)]
    rates = [b.drop_path.drop_prob if isinstance(b.drop_path, DropPath)
             else 0. for b in blocks]
    assert rates == pytest.approx([0., .1, .2, .3, .4])
    assert isinstance(blocks[0].drop_path, torch.nn.Identity)
    assert isinstance(model.patch_embed, layers.ConvStem)
    assert isinstance(model.layers[0].downsample, layers.ConvDownsample)
    assert isinstance(blocks[0].ffn, layers.ConvFFN)
    assert isinstance(blocks[-1].attn, layers.RotarySelfAttention)


def test_init_matches_the_authors():
    model = PolaPP(arch=TINY)
    model.init_weights()
    for m in model.modules():
        if isinstance(m, PaCSAttention):
            assert (m.s1 == 0).all() and (m.s2 == 0).all()
    assert (model.layers[2].blocks[0].gamma_1 == 1).all()
    # no layer scale in stage 1: no parameter (the authors' layout)
    assert model.layers[0].blocks[0].gamma_1 is None
    assert not any('gamma' in k for k in
                   model.layers[0].blocks[0].state_dict())
    conv = model.patch_embed.proj[3]  # trunc-normal, std .02, zero bias
    assert 0.015 < conv.weight.std() < 0.025 and (conv.bias == 0).all()


@pytest.mark.parametrize('scope', ['mmdet', 'mmseg', 'mmpretrain'])
def test_builds_from_each_scope(scope):
    import importlib

    from mmengine.registry import DefaultScope
    registry = importlib.import_module(f'{scope}.registry').MODELS
    with DefaultScope.overwrite_default_scope(scope):
        for type_ in ('PolaPP', 'pola_mm.PolaPP'):
            model = registry.build(dict(type=type_, arch=TINY,
                                        out_indices=(3, )))
            assert isinstance(model, PolaPP)


@pytest.mark.parametrize('dtype', [torch.bfloat16, torch.float16])
def test_autocast_trains(dtype):
    """Under CPU autocast the whole backbone runs forward and backward (PaCS
    in float32 inside) with finite outputs and gradients. (At 64x64 the
    last downsampling BatchNorm sees 2x2 maps; on 1x1 maps with a batch of
    2 its training statistics are degenerate and bf16 gradients can
    overflow whatever the attention does.)"""
    torch.manual_seed(0)
    model = PolaPP(arch=TINY)
    model.init_weights()
    with torch.autocast('cpu', dtype=dtype):
        outs = model(torch.randn(2, 3, 64, 64))
    assert all(torch.isfinite(o).all() for o in outs)
    assert outs[0].dtype == dtype  # autocast reached the stem and stage 1
    sum(o.float().square().mean() for o in outs).backward()
    assert all(torch.isfinite(p.grad).all() for p in model.parameters())


def test_init_weights_reinitialises_every_layer():
    """init_weights applies PolaPP's own rule once (no second rule undoing
    a first): from a model whose parameters are all 1, convs are
    trunc-normal with zero bias, Linear layers PyTorch's default, norms
    ones and zeros, PaCS temperatures zero."""
    import torch.nn as nn
    torch.manual_seed(0)
    model = PolaPP(arch=dict(TINY, embed_dims=(64, 64, 64, 64)))
    with torch.no_grad():
        for p in model.parameters():
            p.fill_(1.)
    model.init_weights()
    for name, m in model.named_modules():
        if isinstance(m, nn.Conv2d) and m.weight.numel() > 1000:
            assert 0.015 < m.weight.std() < 0.025, name
            assert m.bias is None or not m.bias.any(), name
        elif isinstance(m, nn.Linear):
            bound = 1 / m.in_features ** 0.5  # kaiming_uniform(a=sqrt(5))
            assert m.weight.abs().max() <= bound, name
            assert m.weight.std() > bound / 4, name
        elif isinstance(m, nn.LayerNorm):
            assert (m.weight == 1).all() and not m.bias.any(), name
        elif isinstance(m, PaCSAttention):
            assert not m.s1.any() and not m.s2.any(), name
