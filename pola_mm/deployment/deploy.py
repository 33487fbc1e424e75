"""Deploy a whole pola_mm model with MMDeploy to ONNX Runtime, verified.

    python -m pola_mm.deployment.deploy DEPLOY_CFG MODEL_CFG CKPT IMG \\
        --work-dir DIR [--device cpu] [--show] [--cfg-options K=V ...] \\
        [--score-thr 0.3] [--box-rtol 1e-3] [--score-atol 1e-4] \\
        [--mask-iou 0.99] [--logit-rtol 1e-4]

(``tools/deployment/deploy.py`` in a checkout runs the same.)

DEPLOY_CFG is an MMDeploy ONNX Runtime deploy config: a file, or
``mmdeploy::<path>`` for MMDeploy's stock file ``configs/<path>`` from the
copy that ships with pola_mm (e.g.
``mmdeploy::mmdet/detection/detection_onnxruntime_dynamic.py``; the
``mmdeploy`` wheel ships none). MODEL_CFG is a pola_mm detector /
segmentor / classifier config: a file, or ``pola_mm::<path>`` for the
package's own configs (``pola_mm::retinanet_pola_pvt_t.py``; likewise
``mmdet::`` and the other installed OpenMMLab packages). CKPT is its
weights (``none``: the initialised model) and IMG the image to export and
compare on. The model is exported with MMDeploy's ``torch2onnx``,
MMDeploy's ONNX Runtime backend model and PyTorch both run on IMG, and
every difference (boxes, scores, labels, masks, segmentation labels or
logits, class scores) is printed (after the file a ``mmdeploy::`` name
resolved to); ``end2end.onnx`` reaches DIR only when
all agree (:func:`pola_mm.deployment.deploy_and_verify`). ``--show`` also
draws both models' results into DIR (``output_pytorch.jpg``,
``output_onnxruntime.jpg``).

Exit codes: 0 verified, 1 export failed or the models differ, 2 bad
arguments (one line: a missing file, an unknown ``mmdeploy::`` name with
the shipped names, an unreadable config or override).
"""
import argparse
import importlib.util
import os.path as osp
import sys
from typing import List, Optional

__all__ = ['parse_args', 'resolve_model_config', 'main']


def parse_args(argv: Optional[List[str]] = None) -> argparse.Namespace:
    from mmengine.config import DictAction
    parser = argparse.ArgumentParser(
        description='Export a pola_mm model with MMDeploy to ONNX Runtime; '
        'the file is written only if it agrees with PyTorch on IMG.')
    parser.add_argument('deploy_cfg', help='MMDeploy ONNX Runtime deploy '
                        'config: a file or mmdeploy::PATH (MMDeploy\'s stock '
                        'configs/PATH, shipped with pola_mm)')
    parser.add_argument('model_cfg', help='pola_mm model config: a file or '
                        'pola_mm::PATH')
    parser.add_argument('checkpoint', help="model weights ('none': the "
                        'initialised model)')
    parser.add_argument('img', help='image to export and compare on')
    parser.add_argument('--work-dir', required=True,
                        help='where end2end.onnx is written')
    parser.add_argument('--device', default='cpu', choices=['cpu'],
                        help='device (ONNX Runtime CPU provider)')
    parser.add_argument('--show', action='store_true',
                        help='draw both results into the work dir')
    parser.add_argument('--score-thr', type=float, default=0.3,
                        help='detections compared one to one (default 0.3)')
    parser.add_argument('--box-rtol', type=float, default=1e-3,
                        help='box tolerance relative to the image size')
    parser.add_argument('--score-atol', type=float, default=1e-4,
                        help='score / class score tolerance')
    parser.add_argument('--mask-iou', type=float, default=0.99,
                        help='least mask IoU of matched detections')
    parser.add_argument('--logit-rtol', type=float, default=1e-4,
                        help='segmentation logit tolerance (relative)')
    parser.add_argument(
        '--cfg-options', nargs='+', action=DictAction, metavar='KEY=VALUE',
        help='override model config settings')
    return parser.parse_args(argv)


def resolve_model_config(path: str) -> str:
    """The file of a model config: ``<package>::<path>`` (``pola_mm::``,
    ``mmdet::``, ...) is ``<path>`` under the installed package's
    ``.mim/configs``, anything else a path, returned as given (a missing
    file is reported by the caller)."""
    if '::' not in path:
        return path
    package, rel = path.split('::', 1)
    try:
        spec = importlib.util.find_spec(package) if package else None
    except (ImportError, ValueError):
        spec = None
    if spec is None or not spec.submodule_search_locations:
        return path
    return osp.join(list(spec.submodule_search_locations)[0], '.mim',
                    'configs', rel)


def main(argv: Optional[List[str]] = None) -> int:
    """Run the tool; returns the exit code."""
    args = parse_args(argv)
    checkpoint = None if args.checkpoint.lower() == 'none' \
        else args.checkpoint
    from pola_mm.deployment.mmdeploy_verify import (DeployError,
                                                    DeployInputError,
                                                    deploy_and_verify,
                                                    draw_results,
                                                    resolve_deploy_config)
    try:
        deploy_cfg = resolve_deploy_config(args.deploy_cfg)
    except DeployInputError as exc:
        print(f'error: {exc}', file=sys.stderr)
        return 2
    if deploy_cfg != args.deploy_cfg:
        print(f'deploy config: {deploy_cfg}')
    model_cfg = resolve_model_config(args.model_cfg)
    for what, path, given in (
            ('deploy config', deploy_cfg, args.deploy_cfg),
            ('model config', model_cfg, args.model_cfg),
            ('checkpoint', checkpoint, checkpoint), ('image', args.img,
                                                     args.img)):
        if path is not None and not osp.isfile(path):
            print(f'error: {what} not found: {given}', file=sys.stderr)
            return 2
    try:
        report = deploy_and_verify(
            deploy_cfg, model_cfg, checkpoint, args.img, args.work_dir,
            args.device, cfg_options=args.cfg_options,
            score_thr=args.score_thr, box_rtol=args.box_rtol,
            score_atol=args.score_atol, mask_iou=args.mask_iou,
            logit_rtol=args.logit_rtol)
    except DeployError as exc:
        print(f'error: {exc}', file=sys.stderr)
        return 2 if isinstance(exc, DeployInputError) else 1
    for check in report.checks:
        print(check)
    sizes = ', '.join('x'.join(map(str, s[2:])) for s in report.input_shapes)
    print(f'verified: {report.onnx_file} ({report.task}, input {sizes})')
    if args.show:
        for path in draw_results(deploy_cfg, model_cfg, checkpoint,
                                 report.onnx_file, args.img, args.work_dir,
                                 args.device, args.cfg_options):
            print(f'drawn: {path}')
    return 0


if __name__ == '__main__':
    sys.exit(main())
