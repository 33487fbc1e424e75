"""Build the reference outputs of the authors' remaining variants.

Run once by a maintainer, with the authors' repositories checked out (their
code is not part of pola_mm)::

    python tests/reference_variants/make_references.py \
        --polaformer PATH/TO/ZacharyMeng/PolaFormer \
        --polaformerpp PATH/TO/ZacharyMeng/PolaFormerPP

It imports the authors' model files from those folders, builds each variant
with the deterministic weights of :func:`helpers.seeded_state_dict` (so no
weight file is stored), runs it on seeded inputs and writes, next to this
script, ``variants.json`` (per variant: the authors' constructor arguments,
parameter layout in their names and order, parameter count, seeds, inputs'
shapes, stage map sizes) and ``<variant>_io.pth`` (the authors' outputs).
``tests/models/test_reference_variants.py`` checks pola_mm against them.
Needs ``timm`` and ``einops`` (the authors' imports); ``fvcore``, imported
but unused by their PolaFormer++ file, is stubbed when missing.
"""
import argparse
import functools
import importlib.util
import json
import os.path as osp
import sys
import types

import torch

HERE = osp.dirname(osp.abspath(__file__))
sys.path.insert(0, osp.dirname(HERE))  # tests/, for helpers
from helpers import seeded_state_dict  # noqa: E402

#: Variants: module file (relative to a repository), class or factory,
#: constructor kwargs (PVT: with the blocks' LayerNorm eps 1e-6 of their
#: ``pola_pvt_*`` factories), input sizes, weight seed.
SWIN_MIXED = dict(repo='polaformer', file='models/pola_swin.py',
                  cls='PolaSwinTransformer',
                  kwargs=dict(img_size=224, patch_size=4, embed_dim=32,
                              depths=[2, 2, 4, 2], num_heads=[1, 2, 4, 8],
                              window_size=56, attn_type='LLMS2',
                              num_classes=1000, alpha=4, kernel_size=5),
                  sizes=[[2, 3, 224, 224]], seed=11)
PVT_LA_SR = dict(repo='polaformer', file='models/pola_pvt.py',
                 cls='PyramidVisionTransformer',
                 kwargs=dict(img_size=224, patch_size=4,
                             embed_dims=[32, 64, 160, 256],
                             num_heads=[1, 2, 5, 8], mlp_ratios=[8, 8, 4, 4],
                             qkv_bias=True, depths=[1, 1, 1, 1],
                             sr_ratios=[8, 4, 2, 1], la_sr_ratios='8421',
                             attn_type='LLLL', alpha=4, kernel_size=5),
                 sizes=[[2, 3, 224, 224]], seed=12)
# Softmax (PVT v1 SRA) stages run at any size in the authors' code, so this
# one shows their patch embeddings and pos_embed resizing at task sizes.
PVT_SRA = dict(repo='polaformer', file='models/pola_pvt.py',
               cls='PyramidVisionTransformer',
               kwargs=dict(img_size=224, patch_size=4,
                           embed_dims=[16, 32, 64, 128],
                           num_heads=[1, 2, 4, 8], mlp_ratios=[4, 4, 4, 4],
                           qkv_bias=True, depths=[1, 1, 1, 1],
                           sr_ratios=[8, 4, 2, 1], attn_type='SSSS'),
               sizes=[[1, 3, 224, 224], [1, 3, 250, 333], [1, 3, 512, 683]],
               seed=13)
POLAPP_B0 = dict(repo='polaformerpp', file='polaformer++/models/pola.py',
                 cls='POLA_b0', kwargs={}, sizes=[[2, 3, 224, 224]], seed=14)
VARIANTS = dict(pola_swin_mixed=SWIN_MIXED, pola_pvt_la_sr=PVT_LA_SR,
                pola_pvt_sra_task_sizes=PVT_SRA, polapp_b0=POLAPP_B0)


def load_module(path: str, name: str) -> types.ModuleType:
    try:
        import fvcore.nn  # noqa: F401
    except ImportError:  # imported, never used, by their pola.py
        stub = types.ModuleType('fvcore.nn')
        stub.FlopCountAnalysis = stub.flop_count_table = None
        sys.modules.setdefault('fvcore', types.ModuleType('fvcore'))
        sys.modules['fvcore.nn'] = stub
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # timm's register_model looks it up
    spec.loader.exec_module(module)
    return module


def seeded_input(shape, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed * 1000 + shape[2] * 7 + shape[3])
    return torch.randn(tuple(shape), generator=g)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument('--polaformer', required=True)
    parser.add_argument('--polaformerpp', required=True)
    args = parser.parse_args()
    roots = dict(polaformer=args.polaformer, polaformerpp=args.polaformerpp)
    meta = {}
    for name, v in VARIANTS.items():
        module = load_module(osp.join(roots[v['repo']], v['file']),
                             f'authors_{name}')
        torch.manual_seed(0)
        kwargs = dict(v['kwargs'])
        if v['cls'] == 'PyramidVisionTransformer':  # as their pola_pvt_*
            kwargs['norm_layer'] = functools.partial(torch.nn.LayerNorm,
                                                     eps=1e-6)
        model = getattr(module, v['cls'])(**kwargs).eval()
        sd = model.state_dict()
        params = dict(model.named_parameters())
        keep = [(k, list(t.shape)) for k, t in sd.items()
                if k in params or k.rsplit('.', 1)[-1] in (
                    'running_mean', 'running_var', 'num_batches_tracked')]
        model.load_state_dict(seeded_state_dict(keep, v['seed']),
                              strict=False)
        stage_hw = {}
        outputs = {}
        for shape in v['sizes']:
            x = seeded_input(shape, v['seed'])
            key = f'{shape[2]}x{shape[3]}'
            seen = []
            hooks = []
            if v['cls'] == 'PyramidVisionTransformer':
                for i in range(4):
                    hooks.append(getattr(model, f'patch_embed{i + 1}')
                                 .register_forward_hook(
                                     lambda m, a, o, seen=seen:
                                     seen.append(o[1])))
                    hooks.append(getattr(model, f'block{i + 1}')[-1]
                                 .register_forward_hook(
                                     lambda m, a, o, seen=seen:
                                     seen.append(o)))
            with torch.no_grad():
                if v['cls'] == 'POLA_b0':
                    out = {'logits': model(x)}
                elif v['cls'] == 'PolaSwinTransformer':
                    feats = model.forward_features(x)
                    out = {'features': feats, 'logits': model.head(feats)}
                else:
                    out = {'features': model.forward_features(x)}
            for h in hooks:
                h.remove()
            if seen:  # (H, W) then tokens, per stage -> NCHW maps
                hws = [tuple(seen[2 * i]) for i in range(4)]
                maps = [seen[2 * i + 1].transpose(1, 2).reshape(
                    shape[0], -1, *hws[i]) for i in range(4)]
                stage_hw[key] = [list(hw) for hw in hws]
                if shape[2:] == [250, 333]:  # elsewhere map sizes only
                    out['stages'] = maps
            outputs[key] = out
        meta[name] = dict(
            cls=v['cls'], file=v['file'], kwargs=v['kwargs'], seed=v['seed'],
            sizes=v['sizes'], layout=keep, stage_hw=stage_hw,
            n_params=sum(p.numel() for p in model.parameters()))
        torch.save(outputs, osp.join(HERE, f'{name}_io.pth'))
        print(name, meta[name]['n_params'],
              {k: list(o) for k, o in outputs.items()})
    with open(osp.join(HERE, 'variants.json'), 'w') as f:
        json.dump(meta, f, indent=1)
        f.write('\n')


if __name__ == '__main__':
    main()
