"""Export the backbone (or, with --whole, the whole model) of a pola_mm
config to ONNX and verify it.

    python -m pola_mm.deployment.pytorch2onnx CONFIG [CKPT] [--shape H W] \\
        [--out FILE] [--whole] [--exporter dynamo|torchscript] [--opset N] \\
        [--dynamic] [--rtol 1e-4] [--seed 0] [--save-weights] \\
        [--cfg-options K=V ...]

(``tools/deployment/pytorch2onnx.py`` in a checkout runs the same.)
CONFIG is a config file or a name as a config's ``_base_`` list takes it
(``pola_mm::mask_rcnn_pola_swin_t.py``, the installed package's own:
:func:`~pola_mm.deployment.deploy.resolve_model_config`).

Builds ``model.backbone`` of CONFIG (a classifier, detector or segmentor
config), or with ``--whole`` the whole model in its ``mode='tensor'``
forward (normalised images in; class scores and box regressions of every
level, segmentation logits or class logits out; no data preprocessor, no
NMS), loads CKPT if given (never runs code from the file), exports it at
H x W, runs the file in ONNX Runtime and, when the ``openvino`` package is
installed, OpenVINO on the same inputs as PyTorch and prints the max abs
difference of every output.

Defaults: ``--shape`` is the config's test size (its test pipeline's
``Resize`` scale or ``CenterCrop``, padded as its data preprocessor pads:
800x1344 for the detectors, 224x224 for the classifiers; one line says
so), ``--out`` ``work_dirs/<config name>/<config name>_backbone.onnx``
(``_whole.onnx`` with ``--whole``), so ``python -m
pola_mm.deployment.pytorch2onnx CONFIG --dynamic`` is a complete command.
Without CKPT the weights are random, drawn from ``--seed`` (default 0: the
same seed gives the same file); one line says so (on every run that built
the model, refused ones too), and ``--save-weights`` writes them next to FILE
(``FILE`` without ``.onnx``, plus ``.pth``: ``{'state_dict': ...}``, which
this tool reads back as CKPT).

``--dynamic`` frees the batch size, height and width (both exporters). The
file is then also checked at three other sizes (none a multiple of 32, two
larger than H x W) and at batch 3. What each exporter supports:

- torchscript (``dynamo=False``): every backbone and whole model, dynamic
  or not, opsets 11 to 21;
- dynamo (``torch.export``, the default): every backbone and whole model,
  dynamic or not, at opsets 18 to 21. With an older torch (without
  torch.fx's ``backed_size_oblivious``), Pola-Swin (and models built on
  it) with ``--dynamic`` is the exception: torch.export there turns its
  shifted windows' counts into guards that fix the size
  (docs/deployment.md). Without ``--exporter`` the tool then says so in
  one line and exports with torchscript; with ``--exporter dynamo`` it
  refuses with one error, nothing written.

What it writes, only when every difference is within RTOL times the
output's scale (its max abs value) in every runtime and at every size:

- FILE, the graph;
- FILE.data next to it when the weights are stored outside the graph (the
  dynamo exporter does this; the TorchScript one above 2 GB). FILE refers
  to it by that relative name: keep the two together (they can be moved or
  copied to any folder together). A FILE.data of an earlier export is
  removed when the new FILE holds its weights itself.

Both are exported under their final names into a private temporary folder
next to FILE, verified there, then moved into place (FILE.data first, FILE
last). When the outputs differ, the export fails or the run is interrupted,
that folder is removed: nothing is left, and files already at FILE stay as
they were.

Exit codes: 0 verified (files written); 1 export failed, refused or outputs
differ (the message says which); 2 bad arguments or inputs: a missing,
unreadable, truncated or corrupt config or checkpoint, a config without a
pola_mm backbone, a checkpoint of another arch, an opset outside the
exporter's range, an unwritable FILE (one line naming the problem and the
fix); 130 interrupted (Ctrl-C).
"""
import argparse
import math
import os.path as osp
import sys
from typing import List, Optional

__all__ = ['parse_args', 'check_args', 'fill_defaults', 'weights_path',
           'main']


def parse_args(argv: Optional[List[str]] = None) -> argparse.Namespace:
    """The command line (``argv``, default ``sys.argv[1:]``)."""
    from mmengine.config import DictAction
    parser = argparse.ArgumentParser(
        description='Export the backbone (or --whole model) of a pola_mm '
        'config to ONNX and verify the file in ONNX Runtime and OpenVINO '
        '(when installed). Exporters: torchscript supports every model, '
        'dynamic or not, at opsets 11-21; dynamo (default) every model at '
        'opsets 18-21 (with an older torch not Pola-Swin with --dynamic).')
    parser.add_argument('config', help='classifier / detector / segmentor '
                        'config with a pola_mm model.backbone: a file or '
                        'pola_mm::PATH (the package\'s own configs)')
    parser.add_argument('checkpoint', nargs='?', default=None,
                        help='weights (optional; default: the initialised '
                        'model, the config\'s init_cfg is ignored)')
    parser.add_argument('--shape', type=int, nargs=2, default=None,
                        metavar=('H', 'W'), help='input height and width '
                        '(default: the config\'s test size, e.g. 800 1344 '
                        'for a detector)')
    parser.add_argument('--out', default=None,
                        help='the .onnx file to write (external weights, if '
                        'any, go to OUT.data next to it; default: '
                        'work_dirs/CONFIG_NAME/CONFIG_NAME_backbone.onnx, '
                        '_whole.onnx with --whole)')
    parser.add_argument('--whole', action='store_true',
                        help='export the whole classifier / detector / '
                        'segmentor (mode="tensor": normalised images in, '
                        'raw head outputs out) instead of its backbone')
    parser.add_argument('--exporter', choices=['dynamo', 'torchscript'],
                        default=None,
                        help='torch.onnx.export(dynamo=True) (the default; '
                        'opsets 18-21; with an older torch it cannot free the '
                        'height/width of Pola-Swin: with --dynamic and no '
                        '--exporter the tool then says so in one line and '
                        'uses the TorchScript exporter) or the TorchScript '
                        'tracer (dynamo=False; opsets 11-21; every model)')
    parser.add_argument('--opset', type=int, default=None,
                        help='ONNX opset (default: the exporter\'s; '
                        'torchscript 11-21, dynamo 18-21)')
    parser.add_argument('--dynamic', action='store_true',
                        help='free batch size, height and width (both '
                        'exporters); also verified at three other sizes '
                        'and batch 3')
    parser.add_argument('--rtol', type=float, default=1e-4,
                        help='allowed max abs difference per output, '
                        'relative to its max abs value (default 1e-4)')
    parser.add_argument('--seed', type=int, default=0,
                        help='seeds the random weights when no CKPT is given '
                        '(default 0)')
    parser.add_argument('--save-weights', action='store_true',
                        help='also write the weights the file was exported '
                        'from next to it (OUT without .onnx, .pth), e.g. the '
                        'random ones, to compare the file with PyTorch')
    parser.add_argument(
        '--cfg-options', nargs='+', action=DictAction, metavar='KEY=VALUE',
        help='override config settings, e.g. a smaller arch: '
        'model.backbone.arch._delete_=True model.backbone.arch.embed_dims=16 '
        '...')
    return parser.parse_args(argv)


def check_args(args: argparse.Namespace) -> Optional[str]:
    """What is wrong with the arguments, as one line naming the fix; None
    when nothing is. A scoped CONFIG (``pola_mm::<path>``) is replaced by
    its file."""
    from .deploy import resolve_model_config
    try:
        args.config = resolve_model_config(args.config)
    except ValueError as exc:
        return f'config {exc}'
    if not osp.isfile(args.config):
        return (f'config file not found: {args.config}; check the path '
                '(e.g. configs/mask_rcnn_pola_swin_t.py or '
                'pola_mm::mask_rcnn_pola_swin_t.py)')
    ckpt = args.checkpoint
    if ckpt is not None and '://' not in ckpt and not osp.isfile(ckpt):
        return (f'checkpoint not found: {ckpt}; check the path, or leave '
                'out CKPT to export the initialised backbone')
    if args.shape is not None and min(args.shape) < 1:
        return f'--shape needs a positive H and W, got {args.shape}'
    if not (args.rtol > 0 and math.isfinite(args.rtol)):
        return f'--rtol needs a positive number, got {args.rtol:g}'
    if args.opset is not None:
        from .onnx_opsets import OPSETS
        lo, hi = OPSETS[args.exporter or 'dynamo']
        if not lo <= args.opset <= hi:
            return (f'--opset {args.opset}: the {args.exporter} exporter is '
                    f'supported at opsets {lo} to {hi}'
                    + ('; use --exporter torchscript for opsets 11 to 17'
                       if args.exporter != 'torchscript' and args.opset < lo
                       else ''))
    if args.out is not None and osp.isdir(args.out):
        return (f'--out {args.out} is a folder; pass the path of the .onnx '
                'file to write')
    return None


def fill_defaults(args: argparse.Namespace) -> List[str]:
    """Give ``--shape`` and ``--out`` their defaults where they were not
    passed (the config's test size; a file under ``work_dirs/``).

    Returns:
        One line per default taken, to print.

    Raises:
        ExportInputError: the config's test size cannot be read.
    """
    from .onnx_defaults import config_test_size, default_onnx_path
    notes = []
    if args.shape is None:
        args.shape = list(config_test_size(args.config, args.cfg_options))
        notes.append(f'shape: {args.shape[0]}x{args.shape[1]}, the test '
                     'size of the config (--shape H W for another)')
    if args.out is None:
        args.out = default_onnx_path(args.config, args.whole)
        notes.append(f'out: {args.out} (--out FILE for another)')
    return notes


def weights_path(out: str) -> str:
    """Where ``--save-weights`` writes the weights: next to ``out``, its
    name without ``.onnx`` plus ``.pth``."""
    stem = out[:-len('.onnx')] if out.endswith('.onnx') else out
    return stem + '.pth'


def compared_values(checks: List) -> int:
    """How many output values the checks compared, in all."""
    return sum(math.prod(c.shape) for c in checks)


def main(argv: Optional[List[str]] = None) -> int:
    """Run the tool; returns the exit code (argparse exits with 2 itself on
    malformed arguments)."""
    args = parse_args(argv)
    problem = check_args(args)
    if problem is not None:
        print(f'error: {problem}', file=sys.stderr)
        return 2
    from .onnx_build import (build_backbone, build_model, save_state_dict,
                             weights_line)
    from .onnx_errors import ExportError, ExportInputError
    from .onnx_export import export_and_verify
    from .onnx_files import external_data_files
    from .onnx_refusal import DynamicExportRefused
    from .onnx_verify import available_runtimes
    try:
        notes = fill_defaults(args)
    except ExportInputError as err:
        print(f'error: {err}', file=sys.stderr)
        return 2
    for note in notes:
        print(note)
    runtimes = available_runtimes()
    chosen = args.exporter is not None
    args.exporter = args.exporter or 'dynamo'

    def export():
        return export_and_verify(model, tuple(args.shape), args.out,
                                 args.exporter, args.opset, args.dynamic,
                                 args.rtol, dynamic_hw=args.dynamic,
                                 runtimes=runtimes)

    model = None

    def said_weights() -> None:
        # every run that built the model says what its weights are, the
        # refused ones too (before their error)
        if model is not None:
            print(weights_line(args.checkpoint, args.seed), flush=True)

    try:
        build = build_model if args.whole else build_backbone
        model = build(args.config, args.checkpoint, args.cfg_options,
                      seed=args.seed)
        try:
            checks = export()
        except DynamicExportRefused:
            if chosen or not args.dynamic:
                raise
            # the default exporter cannot free this model's height/width:
            # the one that can, said in one line
            print(f'note: torch.export of this torch cannot free '
                  f'the height/width of {type(model).__name__} (Pola-Swin\'s '
                  'shifted windows); '
                  'exporting with the TorchScript exporter instead '
                  '(--exporter torchscript)', file=sys.stderr)
            args.exporter = 'torchscript'
            if args.opset is not None and args.opset < 11:
                raise
            checks = export()
    except ExportInputError as err:
        said_weights()
        print(f'error: {err}', file=sys.stderr)
        return 2
    except ExportError as err:
        said_weights()
        print(f'error: {err}', file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        said_weights()
        print(f'interrupted: nothing was written to {args.out}',
              file=sys.stderr)
        return 130
    for check in checks:
        print(check)
    saved = (save_state_dict(model, weights_path(args.out))
             if args.save_weights else None)
    print(weights_line(args.checkpoint, args.seed, saved,
                       f'--save-weights writes them to '
                       f'{weights_path(args.out)}'))
    what = (type(model.model).__name__ if args.whole else
            type(model).__name__)
    sizes = sorted({c.shape for c in checks if c.name == checks[0].name})
    print(f'{args.out}: {what} exported at {args.shape[0]}x'
          f'{args.shape[1]} ({args.exporter} exporter'
          f'{", dynamic batch, height and width" if args.dynamic else ""}) '
          f'agrees with PyTorch in {" and ".join(runtimes)} '
          f'({len(checks) // len(runtimes)} outputs checked, '
          f'{compared_values(checks) // len(runtimes)} values compared per '
          f'runtime, first output shapes {sizes})')
    if 'openvino' not in runtimes:
        print('note: openvino is not installed, so the file was checked in '
              'onnxruntime only (pip install openvino to check both)')
    folder = osp.dirname(args.out)
    for name in external_data_files(args.out):
        print(f'{osp.join(folder, name)}: its weights, referred to by name; '
              'keep the two files together')
    return 0


if __name__ == '__main__':
    from ..cli import quiet_tool_warnings
    quiet_tool_warnings()
    sys.exit(main())
