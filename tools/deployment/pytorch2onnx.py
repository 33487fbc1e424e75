#!/usr/bin/env python
"""Export the backbone of a pola_mm config to ONNX and verify it.

    python tools/deployment/pytorch2onnx.py CONFIG [CKPT] --shape H W \\
        --out FILE [--exporter dynamo|torchscript] [--opset N] [--dynamic] \\
        [--rtol 1e-4] [--cfg-options K=V ...]

Builds ``model.backbone`` of CONFIG (a classifier, detector or segmentor
config), loads CKPT if given (the authors' file, a converted classifier, a
detector / segmentor checkpoint or a backbone state dict; never runs code
from the file), exports it at H x W, runs the file in onnxruntime on the
same input as PyTorch and prints the max abs difference of every output.
The file is written to FILE only when every difference is within RTOL times
the output's scale (its max abs value); otherwise the tool exits with 1 and
says which outputs differ. ``--dynamic`` leaves the batch size free (dynamo
exporter; checked at batch 1 and 3); the spatial size is fixed.

Exit codes: 0 verified, 1 export failed or outputs differ, 2 bad arguments.
"""
import argparse
import os.path as osp
import sys
from typing import List, Optional

sys.path.insert(0, osp.dirname(osp.dirname(osp.dirname(osp.abspath(
    __file__)))))


def parse_args(argv: Optional[List[str]] = None) -> argparse.Namespace:
    from mmengine.config import DictAction
    parser = argparse.ArgumentParser(
        description='Export the backbone of a pola_mm config to ONNX and '
        'verify the file with onnxruntime.')
    parser.add_argument('config', help='classifier / detector / segmentor '
                        'config with a pola_mm model.backbone')
    parser.add_argument('checkpoint', nargs='?', default=None,
                        help='weights (optional; default: the initialised '
                        'backbone, the config\'s init_cfg is ignored)')
    parser.add_argument('--shape', type=int, nargs=2, required=True,
                        metavar=('H', 'W'), help='input height and width')
    parser.add_argument('--out', required=True, help='the .onnx file')
    parser.add_argument('--exporter', choices=['dynamo', 'torchscript'],
                        default='dynamo',
                        help='torch.onnx.export(dynamo=True) (default) or '
                        'the TorchScript tracer (dynamo=False)')
    parser.add_argument('--opset', type=int, default=None,
                        help='ONNX opset (default: the exporter\'s)')
    parser.add_argument('--dynamic', action='store_true',
                        help='free batch dimension (dynamo exporter)')
    parser.add_argument('--rtol', type=float, default=1e-4,
                        help='allowed max abs difference per output, '
                        'relative to its max abs value (default 1e-4)')
    parser.add_argument(
        '--cfg-options', nargs='+', action=DictAction, metavar='KEY=VALUE',
        help='override config settings, e.g. a smaller arch: '
        'model.backbone.arch._delete_=True model.backbone.arch.embed_dims=16 '
        '...')
    return parser.parse_args(argv)


def main(argv: Optional[List[str]] = None) -> int:
    args = parse_args(argv)
    if not osp.isfile(args.config):
        print(f'error: config file not found: {args.config}', file=sys.stderr)
        return 2
    if args.checkpoint is not None and '://' not in args.checkpoint \
            and not osp.isfile(args.checkpoint):
        print(f'error: checkpoint not found: {args.checkpoint}',
              file=sys.stderr)
        return 2
    if min(args.shape) < 1 or args.rtol <= 0:
        print('error: --shape needs positive H W and --rtol a positive '
              'number', file=sys.stderr)
        return 2
    from pola_mm.deployment import (ExportError, build_backbone,
                                    export_and_verify)
    try:
        model = build_backbone(args.config, args.checkpoint,
                               args.cfg_options)
        checks = export_and_verify(model, tuple(args.shape), args.out,
                                   args.exporter, args.opset, args.dynamic,
                                   args.rtol)
    except (ExportError, ValueError, KeyError, TypeError,
            FileNotFoundError) as err:
        print(f'error: {err}', file=sys.stderr)
        return 1
    for check in checks:
        print(check)
    print(f'{args.out}: {type(model).__name__} at {args.shape[0]}x'
          f'{args.shape[1]} ({args.exporter} exporter'
          f'{", dynamic batch" if args.dynamic else ""}) agrees with '
          f'PyTorch in onnxruntime')
    return 0


if __name__ == '__main__':
    sys.exit(main())
