"""Deploy a whole pola_mm model with MMDeploy to ONNX Runtime, verified.

    python -m pola_mm.deployment.deploy DEPLOY_CFG MODEL_CFG CKPT IMG \\
        [IMG ...] --work-dir DIR [--device cpu] [--show] \\
        [--cfg-options K=V ...] [--score-thr 0.3] [--top-k 20] \\
        [--box-rtol 1e-3] [--score-atol 1e-4] [--mask-iou 0.99] \\
        [--logit-rtol 1e-4] [--seed 0] [--save-weights]

(``tools/deployment/deploy.py`` in a checkout runs the same.)

DEPLOY_CFG is an MMDeploy ONNX Runtime deploy config: a file,
``mmdeploy::<path>`` for MMDeploy's stock file ``configs/<path>`` from the
copy that ships with pola_mm (e.g.
``mmdeploy::mmdet/detection/detection_onnxruntime_dynamic.py``; the
``mmdeploy`` wheel ships none), or ``pola_mm_deploy::<path>`` for
pola_mm's own, the stock detection and instance-segmentation configs at
opset 16 (e.g.
``pola_mm_deploy::mmdet/instance-seg/instance-seg_onnxruntime_dynamic-opset16.py``):
use those for two-stage detectors, whose RoIAlign MMDeploy computes like
mmdet's only from opset 16 (the tool says so in one line otherwise).
MODEL_CFG is a pola_mm detector /
segmentor / classifier config: a file, or a name as a config's ``_base_``
list takes it (:func:`resolve_model_config`): ``pola_mm::<path>`` for the
package's own configs (``pola_mm::retinanet_pola_pvt_t.py``), likewise
``mmdet::<folder>/<file>`` and the other installed OpenMMLab packages.
CKPT is its weights (``none``: the initialised model, random weights
drawn from ``--seed``) and IMG the image to export and compare on (any
photo, e.g. matplotlib's sample ``grace_hopper.jpg``; with several, the
file is exported on the first and compared on each). The model is
exported with MMDeploy's ``torch2onnx``, MMDeploy's ONNX Runtime backend
model and PyTorch both run on each IMG, and every difference (boxes,
scores, labels, masks, segmentation labels or logits, class scores) is
printed (after the file a ``mmdeploy::`` name resolved to);
``end2end.onnx`` reaches DIR only when all agree
(:func:`pola_mm.deployment.deploy_and_verify`). Every run that gets to
build the model prints one line on its weights, verified or refused
(``weights: checkpoint CKPT`` or ``weights: random, seeded (--seed
0)...``). ``--show`` also draws both models' results on the first IMG
into DIR (``output_pytorch.jpg``, ``output_onnxruntime.jpg``).

Exit codes: 0 verified, 1 export failed or the models differ, 2 bad
arguments (one line: a missing file, an unknown ``mmdeploy::`` name with
the shipped names, a ``<scope>::`` name that ``_base_`` refuses too, an
unreadable config or override).
"""
import argparse
import os.path as osp
import sys
from typing import Any, Dict, List, Optional

__all__ = ['parse_args', 'resolve_model_config', 'main']


def parse_args(argv: Optional[List[str]] = None) -> argparse.Namespace:
    """The command line (``argv``, default ``sys.argv[1:]``)."""
    from mmengine.config import DictAction

    from .mmdeploy_compare import DEFAULT_TOP_K
    parser = argparse.ArgumentParser(
        description='Export a pola_mm model with MMDeploy to ONNX Runtime; '
        'the file is written only if it agrees with PyTorch on IMG.')
    parser.add_argument('deploy_cfg', help='MMDeploy ONNX Runtime deploy '
                        'config: a file, mmdeploy::PATH (MMDeploy\'s stock '
                        'configs/PATH, shipped with pola_mm) or '
                        'pola_mm_deploy::PATH (pola_mm\'s: the stock '
                        'detection / instance-seg ones at opset 16, for '
                        'two-stage detectors)')
    parser.add_argument('model_cfg', help='pola_mm model config: a file or '
                        'pola_mm::PATH')
    parser.add_argument('checkpoint', help="model weights ('none': the "
                        'initialised model, random weights from --seed)')
    parser.add_argument('img', nargs='+', help='image(s) to compare on; '
                        'the file is exported on the first')
    parser.add_argument('--work-dir', required=True,
                        help='where end2end.onnx is written')
    parser.add_argument('--device', default='cpu', choices=['cpu'],
                        help='device (ONNX Runtime CPU provider)')
    parser.add_argument('--show', action='store_true',
                        help='draw both results into the work dir')
    parser.add_argument('--score-thr', type=float, default=0.3,
                        help='detections with this score or more are all '
                        'compared one to one (default 0.3)')
    parser.add_argument('--top-k', type=int, default=DEFAULT_TOP_K,
                        help='and at least the K best detections of each '
                        'side, whatever their scores (default '
                        f'{DEFAULT_TOP_K})')
    parser.add_argument('--box-rtol', type=float, default=1e-3,
                        help='box tolerance relative to the image size')
    parser.add_argument('--score-atol', type=float, default=1e-4,
                        help='score / class score tolerance')
    parser.add_argument('--mask-iou', type=float, default=0.99,
                        help='least mask IoU of matched detections')
    parser.add_argument('--logit-rtol', type=float, default=1e-4,
                        help='segmentation logit tolerance (relative)')
    parser.add_argument('--seed', type=int, default=0,
                        help="seeds the random weights when CKPT is 'none' "
                        '(default 0)')
    parser.add_argument('--save-weights', action='store_true',
                        help="with CKPT 'none': keep the random weights as "
                        'WORK_DIR/end2end.pth (a checkpoint for this tool '
                        "and mmdet's / mmseg's)")
    parser.add_argument(
        '--cfg-options', nargs='+', action=DictAction, metavar='KEY=VALUE',
        help='override model config settings')
    return parser.parse_args(argv)


def resolve_model_config(path: str) -> str:
    """The file of a model config, named as in a config's ``_base_`` list.

    ``<scope>::<path>`` goes through mmengine's own reader of ``_base_``
    entries (``Config._get_cfg_path``) with pola_mm's scope registered
    (:func:`pola_mm_startup.register_config_scope`, as the start-up hook
    and ``import pola_mm`` do): the tool accepts exactly the names a
    ``_base_`` list accepts. ``pola_mm::`` names any config of
    ``configs/``, complete (``pola_mm::retinanet_pola_pvt_t.py``,
    ``pola_mm::demo/mask_rcnn_pola_swin_shapes.py``) or a snippet
    (``pola_mm::_base_/...``); ``mmdet::mask_rcnn/<file>`` (mmengine wants
    a folder for every other scope) an installed package's. Anything else
    is a path, returned as given (a missing file is reported by the
    caller).

    Raises:
        ValueError: ``path`` names a scope that mmengine refuses (no such
            scope, no folder, not installed) or a file that does not exist;
            the message says why in one line.
    """
    if '::' not in path:
        return path
    from mmengine.config import Config

    from pola_mm_startup import register_config_scope
    register_config_scope()
    try:
        return Config._get_cfg_path(path, '')[0]
    except (AssertionError, FileNotFoundError, ImportError,
            ValueError) as exc:
        raise ValueError(f'{path}: {exc}') from exc


def _verified_line(report: Any) -> str:
    """The last line of a verified run: the file, the task, the input
    sizes and, for detectors, how many detections were compared."""
    sizes = ', '.join('x'.join(map(str, s[2:])) for s in report.input_shapes)
    line = f'verified: {report.onnx_file} ({report.task}, input {sizes})'
    torch_n, backend_n = report.detections_compared
    if torch_n or backend_n:
        line += (f'; {torch_n} PyTorch and {backend_n} ONNX Runtime '
                 'detections compared')
    return line


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
    try:
        model_cfg = resolve_model_config(args.model_cfg)
    except ValueError as exc:
        print(f'error: model config {exc}', file=sys.stderr)
        return 2
    for what, path, given in (
            ('deploy config', deploy_cfg, args.deploy_cfg),
            ('model config', model_cfg, args.model_cfg),
            ('checkpoint', checkpoint, checkpoint),
            *(('image', img, img) for img in args.img)):
        if path is not None and not osp.isfile(path):
            print(f'error: {what} not found: {given}', file=sys.stderr)
            return 2
    if args.top_k < 0:
        print(f'error: --top-k needs 0 or more, got {args.top_k}',
              file=sys.stderr)
        return 2
    advice = _advice(deploy_cfg, model_cfg, args.cfg_options)
    from pola_mm.deployment.onnx_build import weights_line
    hint = '--save-weights keeps them next to the file (end2end.pth)'
    try:
        report = deploy_and_verify(
            deploy_cfg, model_cfg, checkpoint, args.img, args.work_dir,
            args.device, cfg_options=args.cfg_options,
            score_thr=args.score_thr, box_rtol=args.box_rtol,
            score_atol=args.score_atol, mask_iou=args.mask_iou,
            logit_rtol=args.logit_rtol, top_k=args.top_k, seed=args.seed,
            save_weights=args.save_weights)
    except DeployError as exc:
        if not isinstance(exc, DeployInputError):
            # a refused run says what it ran, as a verified one does
            print(weights_line(checkpoint, args.seed), flush=True)
        print(f'error: {exc}', file=sys.stderr)
        return 2 if isinstance(exc, DeployInputError) else 1
    for check in report.checks:
        print(check)
    print(weights_line(checkpoint, args.seed, report.weights_file, hint))
    print(_verified_line(report))
    if advice:  # a failure says it in its message
        print(f'note: {advice}')
    if args.show:
        # random weights are drawn by PyTorch only where they were saved
        weights = checkpoint or report.weights_file
        for path in draw_results(deploy_cfg, model_cfg, weights,
                                 report.onnx_file, args.img[0], args.work_dir,
                                 args.device, args.cfg_options):
            print(f'drawn: {path}')
    return 0


def _advice(deploy_cfg: str, model_cfg: str,
            cfg_options: Optional[Dict[str, Any]]) -> Optional[str]:
    """The line for a two-stage detector exported below opset 16
    (:func:`~pola_mm.deployment.mmdeploy_export.roi_align_advice`); None
    where there is none or the configs cannot be read (the verification
    reports those)."""
    from pola_mm.deployment.mmdeploy_export import (DeployError,
                                                    load_deploy_configs,
                                                    roi_align_advice)
    try:
        deploy, model = load_deploy_configs(deploy_cfg, model_cfg,
                                            cfg_options)
    except DeployError:
        return None
    return roi_align_advice(deploy, model)


if __name__ == '__main__':
    sys.exit(main())
