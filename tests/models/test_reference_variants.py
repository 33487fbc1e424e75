"""The authors' remaining variants, and Pola-PVT at task sizes, against
outputs of the authors' own classes (``tests/reference_variants``, made by
its ``make_references.py`` from ZacharyMeng/PolaFormer and
ZacharyMeng/PolaFormerPP): Pola-Swin's mixed ``'M<n>'`` stage, Pola-PVT's
``la_sr_ratios``, the authors' PVT patch embeddings and ``pos_embed``
resizing at 250x333 and 512x683, and PolaPP-b0."""
import json
import os.path as osp

import pytest
import torch
from helpers import REPO, seeded_state_dict

from pola_mm.models import PolaPP, PolaPVT, PolaSwinTransformer
from pola_mm.models.checkpoint import (backbone_state_dict,
                                       convert_official_checkpoint)

DATA = osp.join(REPO, 'tests', 'reference_variants')
with open(osp.join(DATA, 'variants.json')) as _f:
    META = json.load(_f)


def scale_err(got: torch.Tensor, want: torch.Tensor) -> float:
    """Largest absolute difference over the largest magnitude of ``want``."""
    assert got.shape == want.shape, (got.shape, want.shape)
    return ((got - want).abs().max() / want.abs().max()).item()


def seeded_input(shape, seed: int) -> torch.Tensor:
    """The input ``make_references.py`` fed the authors' model."""
    g = torch.Generator().manual_seed(seed * 1000 + shape[2] * 7 + shape[3])
    return torch.randn(tuple(shape), generator=g)


def authors(name: str):
    """``(authors' state dict, their outputs, metadata)`` of a variant."""
    meta = META[name]
    io = torch.load(osp.join(DATA, f'{name}_io.pth'), map_location='cpu',
                    weights_only=True)
    return seeded_state_dict(meta['layout'], meta['seed']), io, meta


def load_authors(model: torch.nn.Module, sd: dict) -> None:
    converted = convert_official_checkpoint(sd)
    model.load_state_dict(backbone_state_dict(converted), strict=True)


def test_swin_mixed_stage_layout(tmp_path):
    """``attn_layout='LLMS2'`` (their ``M<n>``): stage 3 has two polarity
    blocks then two softmax blocks; the authors' file loads through
    ``init_cfg`` and their pooled features and logits are reproduced."""
    sd, io, meta = authors('pola_swin_mixed')
    kw = meta['kwargs']
    path = str(tmp_path / 'authors.pth')
    torch.save({'model': sd}, path)
    model = PolaSwinTransformer(
        arch=dict(embed_dims=kw['embed_dim'], depths=kw['depths'],
                  num_heads=kw['num_heads']),
        attn_layout=kw['attn_type'], out_indices=(3, ),
        init_cfg=dict(type='Pretrained', checkpoint=path))
    model.init_weights()
    model.eval()
    kinds = [b.attn_type for b in model.layers[2].blocks]
    assert kinds == ['L', 'L', 'S', 'S']
    assert model.layers[2].blocks[0].attn.ref_hw == (14, 14)
    for shape in meta['sizes']:
        key = f'{shape[2]}x{shape[3]}'
        with torch.no_grad():
            feats = model(seeded_input(shape, meta['seed']))[0].mean((2, 3))
        logits = feats @ sd['head.weight'].t() + sd['head.bias']
        assert scale_err(feats, io[key]['features']) <= 1e-4
        assert scale_err(logits, io[key]['logits']) <= 1e-4


@pytest.mark.parametrize('layout', ['LLMS', 'LLMS2x', 'LLSS2', 'LLQS'])
def test_bad_layouts_say_what_is_expected(layout):
    with pytest.raises(ValueError, match="e.g. 'LLMS4'"):
        PolaSwinTransformer(arch='tiny', attn_layout=layout)


def test_pvt_la_sr_ratios():
    """Spatial reduction inside the polarity attention (their
    ``la_sr_ratios='8421'``): their features at 224, and the tables on the
    reduced grids."""
    sd, io, meta = authors('pola_pvt_la_sr')
    kw = meta['kwargs']
    arch = dict(embed_dims=kw['embed_dims'], depths=kw['depths'],
                num_heads=kw['num_heads'], mlp_ratios=kw['mlp_ratios'])
    model = PolaPVT(arch=arch, la_sr_ratios=kw['la_sr_ratios'],
                    out_indices=(3, )).eval()
    load_authors(model, sd)
    assert model.block1[0].attn.ref_hw == (7, 7)
    assert model.block4[0].attn.sr_ratio == 1
    for shape in meta['sizes']:
        key = f'{shape[2]}x{shape[3]}'
        with torch.no_grad():
            feats = model(seeded_input(shape, meta['seed']))[0].mean((2, 3))
        assert scale_err(feats, io[key]['features']) <= 1e-4
    # any other size runs (the tables are resized to the reduced grids)
    with torch.no_grad():
        outs = PolaPVT(arch=arch, la_sr_ratios=(8, 4, 2, 1))(
            torch.randn(1, 3, 250, 333))
    assert [tuple(o.shape[2:]) for o in outs] == [(62, 83), (31, 41),
                                                  (15, 20), (7, 10)]


def test_pvt_at_task_sizes_is_the_authors():
    """The authors' PVT at 250x333 (every stage map) and 512x683 (map
    sizes): patch embeddings without padding, ``pos_embed`` resized
    bilinearly. Their softmax stages run at any size, so the whole stage
    maps are compared."""
    sd, io, meta = authors('pola_pvt_sra_task_sizes')
    kw = meta['kwargs']
    arch = dict(embed_dims=kw['embed_dims'], depths=kw['depths'],
                num_heads=kw['num_heads'], mlp_ratios=kw['mlp_ratios'])
    model = PolaPVT(arch=arch, attn_layout='SSSS').eval()
    load_authors(model, sd)
    for shape in meta['sizes']:
        key = f'{shape[2]}x{shape[3]}'
        x = seeded_input(shape, meta['seed'])
        with torch.no_grad():
            outs = model(x)
        assert [list(o.shape[2:]) for o in outs] == meta['stage_hw'][key]
        feats = outs[-1].mean((2, 3))
        assert scale_err(feats, io[key]['features']) <= 1e-4, key
        for got, want in zip(outs, io[key].get('stages', ())):
            assert scale_err(got, want) <= 1e-4, key
    assert meta['stage_hw']['512x683'] == [[128, 170], [64, 85], [32, 42],
                                           [16, 21]]


def test_polapp_b0_is_the_authors_classifier():
    """PolaPP-b0 (their POLA_b0) in configs/polapp_b0_in1k.py: the same
    parameter count, and their logits from their weights."""
    from mmengine.config import Config
    from mmengine.registry import init_default_scope
    from mmpretrain.registry import MODELS
    sd, io, meta = authors('polapp_b0')
    cfg = Config.fromfile(osp.join(REPO, 'configs', 'polapp_b0_in1k.py'))
    init_default_scope('mmpretrain')
    model = MODELS.build(cfg.model).eval()
    assert sum(p.numel() for p in model.parameters()) == meta['n_params']
    model.load_state_dict(convert_official_checkpoint(sd), strict=True)
    for shape in meta['sizes']:
        key = f'{shape[2]}x{shape[3]}'
        with torch.no_grad():
            logits = model(seeded_input(shape, meta['seed']), mode='tensor')
        assert scale_err(logits, io[key]['logits']) <= 1e-4
    spec = PolaPP.arch_zoo['b0']
    assert spec['embed_dims'] == (32, 64, 128, 384)
    assert spec['depths'] == (2, 2, 2, 2)
