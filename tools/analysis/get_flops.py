#!/usr/bin/env python
"""Parameters and FLOPs of the model of a config, on a synthetic input.

    python tools/analysis/get_flops.py CONFIG [--shape H W] \
        [--cfg-options K=V ...] [--json FILE] [--shapes-only]

Works for mmpretrain classifiers, mmdet detectors and mmseg segmentors (no
dataset, no checkpoint needed). 1 FLOP = 1 multiply-add; the polarity
attention is counted by its formula; a two-stage detector's box heads on
the RPN's test proposals (1000) and its mask heads on the test detections
(100), as the published numbers (docs/flops.md). Examples::

    python tools/analysis/get_flops.py configs/pola_swin_t_in1k.py
    python tools/analysis/get_flops.py configs/mask_rcnn_pola_swin_t.py \
        --shape 800 1280
    python tools/analysis/get_flops.py \
        mmdet::swin/mask-rcnn_swin-t-p4-w7_fpn_1x_coco.py --shape 800 1280
"""
import argparse
import json
import os.path as osp
import sys
from typing import List, Optional

sys.path.insert(0, osp.dirname(osp.dirname(osp.dirname(osp.abspath(
    __file__)))))


def parse_args(argv: Optional[List[str]] = None) -> argparse.Namespace:
    from mmengine.config import DictAction
    parser = argparse.ArgumentParser(
        description='Parameters and FLOPs (1 FLOP = 1 multiply-add) of the '
        'model of an mmdet / mmseg / mmpretrain config')
    parser.add_argument('config', help='config file path, or a config of '
                        'an installed package: mmdet::swin/...py')
    parser.add_argument('--shape', type=int, nargs='+', default=[224, 224],
                        metavar='N', help='input size: H W, or one N for '
                        'N x N (default 224 224)')
    parser.add_argument(
        '--cfg-options', nargs='+', action=DictAction, metavar='KEY=VALUE',
        help='override config settings; replace a dict with KEY._delete_='
        'True KEY.a=1 ..., e.g. model.backbone.arch._delete_=True '
        'model.backbone.arch.embed_dims=16 ...')
    parser.add_argument('--json', metavar='FILE',
                        help='also write the counts (per module) here')
    parser.add_argument('--shapes-only', action='store_true',
                        help='do not compute the matrix products and convs '
                        '(zeros of their shapes): the same count, several '
                        'times faster')
    return parser.parse_args(argv)


def resolve_config(path: str) -> str:
    """``pkg::rel/path.py`` (mmdet, mmseg, mmpretrain, pola_mm) -> the file
    in that package's configs, as mmengine resolves ``_base_`` entries;
    anything else unchanged."""
    if '::' not in path or osp.isfile(path):
        return path
    from mmengine.utils import get_installed_path
    package, rel = path.split('::', 1)
    try:
        root = get_installed_path(package)
    except Exception:  # not installed
        return path
    for sub in ('.mim/configs', 'configs'):
        candidate = osp.join(root, sub, rel)
        if osp.isfile(candidate):
            return candidate
    return path


def main(argv: Optional[List[str]] = None) -> int:
    args = parse_args(argv)
    if len(args.shape) == 1:
        shape = (args.shape[0], args.shape[0])
    elif len(args.shape) == 2:
        shape = (args.shape[0], args.shape[1])
    else:
        print(f'error: --shape takes H W or N, got {args.shape}',
              file=sys.stderr)
        return 2
    # pola_mm:: registered before reading
    import pola_mm  # noqa: F401
    from pola_mm.cli import quiet_tool_warnings
    quiet_tool_warnings()
    from pola_mm.analysis.flops import format_report, model_complexity
    from pola_mm.config_errors import build_error_line
    from pola_mm.models.from_config import load_config
    try:
        cfg = load_config(resolve_config(args.config), args.cfg_options)
        _, report, kind = model_complexity(cfg, shape,
                                           compute=not args.shapes_only)
    except (FileNotFoundError, ValueError) as exc:  # ConfigFileError too
        print(f'error: {exc}', file=sys.stderr)
        return 2
    except (KeyError, TypeError) as exc:  # an unknown type, a wrong key
        line = build_error_line(exc)
        if line is None:
            raise
        print(f'error: {line}', file=sys.stderr)
        return 2
    print(format_report(report, kind, shape))
    if args.json:
        with open(args.json, 'w') as f:
            json.dump(dict(config=args.config, shape=list(shape), kind=kind,
                           flops=report.total, by_module=report.by_module,
                           by_op=report.by_op, params=report.params,
                           rois=report.rois), f,
                      indent=1)
    return 0


if __name__ == '__main__':
    sys.exit(main())
