"""PolaPP (PolaFormer++) in timm: ``polapp_b*`` are the authors' ImageNet
classifiers and equal the mm classifier (configs/polapp_b*_in1k.py) and the
mm backbone, and their features reproduce the authors' reference minis."""
import importlib.util
import os.path as osp

import pytest
import timm
import torch
from helpers import REPO, randomise, reference_root

import pola_mm.timm as pola_timm
from pola_mm.models import PolaPP

pytestmark = pytest.mark.slow

#: timm's and the mm models must agree to this (float32, same weights).
EQUAL = 1e-5


def _polapp_tests():
    """tests/models/test_polapp.py, for its reference-mini helpers (the
    authors' classifier file, the rest of their ``POLA.forward``)."""
    path = osp.join(REPO, 'tests', 'models', 'test_polapp.py')
    spec = importlib.util.spec_from_file_location('_polapp_helpers', path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


T = _polapp_tests()


@pytest.fixture(scope='module')
def polapp_dir() -> str:
    return reference_root('official_polapp_mini_nols_io.pth')


@pytest.fixture(scope='module')
def authors_classifier(polapp_dir, tmp_path_factory) -> tuple:
    """``(path, state dict)``: the reference mini as the authors' ImageNet
    classifier file (main_ema.py's layout, with a yacs config)."""
    return T.authors_classifier_file(polapp_dir,
                                     tmp_path_factory.mktemp('polapp_cls'))


def test_registered_b0_to_b5_as_the_authors_classifiers():
    """Every arch of the backbone is a timm model with the authors'
    widths, projection (2560 for b5) and drop path, and its config."""
    assert sorted(PolaPP.arch_zoo) == [f'b{i}' for i in range(6)]
    for arch in sorted(PolaPP.arch_zoo):
        name = f'polapp_{arch}'
        with torch.device('meta'):
            model = timm.create_model(name)
        zoo = PolaPP.arch_zoo[arch]
        assert model.backbone.num_features == list(zoo['embed_dims'])
        assert model.num_features == (2560 if arch == 'b5' else 2048)
        assert model.neck.proj.in_channels == zoo['embed_dims'][-1]
        assert model.backbone.drop_path_rate == zoo['drop_path_rate']
        assert len(model.backbone.extra_norms) == 0
        cfg = model.pretrained_cfg
        assert cfg['first_conv'] + '.weight' in model.state_dict()
        assert cfg['classifier'] == 'head.fc'
        assert cfg['origin_url'] == pola_timm.POLAPP_WEIGHTS
        assert 'PolaFormer++' in cfg['paper_name']
        assert (cfg['crop_pct'], cfg['crop_mode'], cfg['interpolation']) == \
            (0.875, 'squash', 'bicubic')


def test_features_equal_the_mm_backbone():
    """Same weights: ``features_only`` returns exactly the mm backbone's
    four outputs (with its ``extra_norms``), at an odd, non-square size,
    and every indices / norm variant agrees."""
    arch = T.TINY
    mm = PolaPP(arch=arch, out_indices=(0, 1, 2, 3)).eval()
    randomise(mm, seed=5)
    feats = timm.create_model('polapp_b1', arch=arch,
                              features_only=True).eval()
    sd = pola_timm.checkpoint_filter_fn(mm.state_dict(), feats.model)
    feats.model.load_state_dict(sd, strict=True)
    assert feats.feature_info.channels() == [16, 32, 32, 64]
    assert feats.feature_info.reduction() == [4, 8, 16, 32]
    x = torch.randn(2, 3, 45, 61)
    with torch.no_grad():
        want = mm(x)
        got = feats(x)
        raw = feats.model.forward_intermediates(x, intermediates_only=True)
    assert len(got) == 4
    for w, g in zip(want, got):
        assert g.shape == w.shape
        assert (g - w).abs().max().item() <= EQUAL
    # without norm: the stages' raw outputs, which extra_norms normalise
    for i, (r, w) in enumerate(zip(raw, want)):
        n = mm.extra_norms[str(i)]
        normed = n(r.flatten(2).transpose(1, 2)).transpose(1, 2)
        assert (normed.reshape(w.shape) - w).abs().max().item() <= EQUAL


def test_features_reproduce_the_authors_minis(polapp_dir):
    """The authors' backbone file through timm's pretrained path: the
    features are the authors' four outputs at both reference sizes."""
    for name in T.MINIS:
        io = torch.load(osp.join(polapp_dir, f'{name}_io.pth'),
                        map_location='cpu', weights_only=True)
        feats = timm.create_model(
            'polapp_b1', arch=T.mini_arch(io), features_only=True,
            pretrained=True, pretrained_cfg_overlay=dict(
                file=osp.join(polapp_dir, f'{name}.pth'))).eval()
        for size, x in io['inputs'].items():
            with torch.no_grad():
                outs = feats(x)
            for got, want in zip(outs, io['outputs'][size]):
                assert (got - want).abs().max().item() <= 1e-4, (name, size)


def test_classifier_equals_the_authors_and_the_mm_classifier(
        polapp_dir, authors_classifier, tmp_path):
    """The authors' classifier file loaded by timm (pretrained_cfg_overlay)
    gives, within 1e-5: the authors' logits (their ``POLA.forward`` after
    the last stage, computed from the mm backbone's raw last stage), and
    the logits of the mm classifier of configs/polapp_b1_in1k.py loaded
    from the converted file."""
    path, sd = authors_classifier
    io = torch.load(osp.join(polapp_dir, 'official_polapp_mini_io.pth'),
                    map_location='cpu', weights_only=True)
    arch = T.mini_arch(io)
    model = timm.create_model(
        'polapp_b1', arch=arch, projection=T.CLS_P, num_classes=T.CLS_K,
        pretrained=True, pretrained_cfg_overlay=dict(file=path)).eval()
    backbone = PolaPP(arch=arch, out_indices=(3, ), with_extra_norms=False,
                      init_cfg=dict(type='Pretrained',
                                    checkpoint=path)).eval()
    backbone.init_weights()
    for size, x in io['inputs'].items():
        with torch.no_grad():
            got = model(x)
            want = T.authors_classifier_logits(backbone(x)[0], sd)
            pooled = model.forward_head(model.forward_features(x),
                                        pre_logits=True)
        assert got.shape == (x.shape[0], T.CLS_K)
        assert pooled.shape == (x.shape[0], T.CLS_P)
        assert 0.5 < want.abs().max() < 20  # Swish in its curved range
        assert (got - want).abs().max().item() <= EQUAL, size

    pytest.importorskip('mmpretrain.models')
    from mmengine.config import Config
    from mmengine.registry import init_default_scope
    from mmengine.runner import load_checkpoint
    cfg = Config.fromfile(osp.join(REPO, 'configs', 'polapp_b1_in1k.py'))
    cfg.model.backbone.arch = arch
    cfg.model.neck.update(in_channels=arch['embed_dims'][3],
                          out_channels=T.CLS_P)
    cfg.model.head.update(in_channels=T.CLS_P, num_classes=T.CLS_K)
    init_default_scope('mmpretrain')
    from mmpretrain.registry import MODELS
    mm = MODELS.build(cfg.model)
    dst = str(tmp_path / 'cls.pth')
    assert T._converter().main([path, dst]) == 0
    load_checkpoint(mm, dst, map_location='cpu', strict=True)
    mm.eval()
    # the same parameter names: the timm model's state dict is the mm one's
    assert set(model.state_dict()) == set(mm.state_dict())
    for size, x in io['inputs'].items():
        with torch.no_grad():
            got = model(x)
            want = mm(x, mode='tensor')
        assert (got - want).abs().max().item() <= EQUAL, size


def test_pruning_and_intermediates_of_the_classifier():
    """forward_intermediates: all four raw stages; the final output is the
    neck's map; pruning to a stage drops the later stages and the neck and
    leaves forward_features at that stage."""
    model = timm.create_model('polapp_b1', arch=T.TINY, num_classes=3).eval()
    x = torch.randn(1, 3, 64, 80)
    with torch.no_grad():
        final, inter = model.forward_intermediates(x)
        assert [tuple(t.shape) for t in inter] == [
            (1, 16, 16, 20), (1, 32, 8, 10), (1, 32, 4, 5), (1, 64, 2, 3)]
        assert final.shape == (1, 2048, 2, 3)
        torch.testing.assert_close(final, model.forward_features(x))
        take = model.prune_intermediate_layers([1])
        assert take == [1]
        assert model.neck is None and len(model.backbone.layers) == 2
        assert model.backbone.layers[1].downsample is None
        torch.testing.assert_close(model.forward_features(x), inter[1])
        # the head went with the pruning (timm's prune_head): no pooling
        torch.testing.assert_close(model(x), inter[1])
        model.reset_classifier(5, 'avg')
        assert model(x).shape == (1, 5)
    with pytest.raises(ValueError, match='not built'):
        model.forward_intermediates(x, indices=[2])
