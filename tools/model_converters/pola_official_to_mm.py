#!/usr/bin/env python
"""Convert an authors' PolaFormer checkpoint to an mmpretrain classifier one.

    python tools/model_converters/pola_official_to_mm.py SRC DST

SRC: the authors' file, Pola-Swin, Pola-PVT or PolaPP (PolaFormer++):
``{'model': state_dict}`` (or a plain state dict) or
a full training checkpoint of their code (``model``, ``optimizer``,
``lr_scheduler``, ``max_accuracy``, ``epoch``, ``config``: a yacs
``CfgNode``). It is read by ``pola_mm.fileio.load_checkpoint_file``, which
never runs code from the file: entries torch's weights-only loader refuses
(the ``config``) are kept as inert data and only ``model`` is used.
DST: ``{'state_dict': {backbone.*, head.fc.*}, 'meta': {...}}`` (the
authors' PolaPP ImageNet classifier also ``neck.*``: its ``proj`` / ``norm``,
for ``PolaPPClsNeck``; weights from ``model``, not ``state_dict_ema``) with
plain tensors only (loads with ``torch.load(..., weights_only=True)``),
usable by ``configs/pola_*_in1k.py`` / ``configs/polapp_*_in1k.py``
(``load_from``) and by any backbone ``init_cfg=dict(type='Pretrained',
checkpoint=DST)``.
"""
import argparse
import os
import os.path as osp
import sys
from typing import List, Optional

import torch


def parse_args(argv: Optional[List[str]] = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description="Convert an authors' PolaFormer checkpoint (Pola-Swin / "
        'Pola-PVT / PolaPP) to the mmpretrain classifier layout of pola_mm.')
    parser.add_argument('src', help="the authors' checkpoint (.pth)")
    parser.add_argument('dst', help='where to write the converted checkpoint')
    return parser.parse_args(argv)


def main(argv: Optional[List[str]] = None) -> int:
    args = parse_args(argv)
    if not osp.isfile(args.src):
        print(f'error: {args.src}: no such file', file=sys.stderr)
        return 2
    # Imported here so that --help works without the heavy stack; falls back
    # to the repository root when pola_mm is not installed.
    try:
        import pola_mm  # noqa: F401
    except ImportError:
        sys.path.insert(0, osp.join(osp.dirname(osp.abspath(__file__)),
                                    '..', '..'))
    from pola_mm.fileio import CheckpointFileError, load_checkpoint_file
    from pola_mm.models.checkpoint import (convert_official_checkpoint,
                                           extract_state_dict, official_family)
    try:
        ckpt = load_checkpoint_file(args.src, map_location='cpu')
    except CheckpointFileError as err:
        print(f'error: {err}', file=sys.stderr)
        return 1
    sd = extract_state_dict(ckpt)
    family = official_family(sd) if isinstance(sd, dict) else None
    if family is None:
        print(f"error: {args.src} is not an authors' PolaFormer checkpoint "
              "(expected {'model': state_dict} with 'patch_embed.proj.weight' "
              "(Pola-Swin), 'patch_embed1.proj.weight' (Pola-PVT) or "
              "'patch_embed.proj.0.weight' (PolaPP) and no "
              "'backbone.' prefix)", file=sys.stderr)
        return 1
    converted = convert_official_checkpoint(sd)
    state_dict = {k: v.detach().clone().contiguous() for k, v in
                  converted.items()}
    dropped = sorted(set(sd) - {k.split('.', 1)[1] if k.startswith(
        ('backbone.', 'neck.')) else k for k in converted} - {
            k for k in sd if k.startswith('head.') or k.startswith('norm.')})
    meta = dict(source=osp.basename(args.src),
                family='polapp' if family == 'polapp' else f'pola_{family}',
                converter='pola_mm.models.checkpoint.'
                'convert_official_checkpoint')
    os.makedirs(osp.dirname(osp.abspath(args.dst)), exist_ok=True)
    torch.save({'state_dict': state_dict, 'meta': meta}, args.dst)
    n_back = sum(k.startswith('backbone.') for k in state_dict)
    n_neck = sum(k.startswith('neck.') for k in state_dict)
    name = {'pvt': 'Pola-PVT', 'swin': 'Pola-Swin', 'polapp': 'PolaPP'}
    print(f'{args.src} ({name[family]})'
          f' -> {args.dst}: {n_back} backbone + '
          + (f'{n_neck} neck (PolaPPClsNeck) + ' if n_neck else '')
          + f'{len(state_dict) - n_back - n_neck} head tensors'
          + (f'; dropped {len(dropped)} recomputed buffers' if dropped else '')
          + ("; dropped the authors' unused final norm" if family == 'pvt'
             else ''))
    return 0


if __name__ == '__main__':
    sys.exit(main())
