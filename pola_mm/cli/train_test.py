"""The train and test commands: ``tools/train.py`` and ``tools/test.py``.

One pair of tools serves mmdet, mmseg and mmpretrain configs: the codebase is
chosen by the config's ``default_scope`` (the Runner imports its modules
through the registries), and the few scope-specific options (``--out``,
``--show-dir``) are translated here. Of the OpenMMLab packages only
mmengine is imported.
"""
import argparse
import os
import os.path as osp
from typing import List, Optional, Sequence

from mmengine.config import Config, DictAction
from mmengine.logging import print_log
from mmengine.runner import Runner

from ..config_errors import build_error_line
from ..engine import NonFiniteLossError, TrainingInterrupted, stop_on_sigterm
from ..fileio import CheckpointFileError, install_checked_loader
from ..models.from_config import ConfigFileError, load_config
from .data_paths import first_missing
from .distributed import finish_distributed, setup_cpu_distributed
from .quiet import quiet_tool_warnings

__all__ = [
    'ToolError', 'train_parser', 'test_parser',
    'prepare_train_config', 'prepare_test_config', 'build_runner',
    'train_main', 'test_main', 'run_tool', 'add_reliability_hooks'
]

LAUNCHERS = ('none', 'pytorch', 'slurm', 'mpi')


class ToolError(Exception):
    """A user-facing error: the tools print its message, not a traceback."""


def train_parser() -> argparse.ArgumentParser:
    """Command line of ``tools/train.py``."""
    parser = argparse.ArgumentParser(
        description='Train a model from an mmdet / mmseg / mmpretrain config')
    parser.add_argument('config', help='config file path')
    parser.add_argument('--work-dir', help='where to save logs and models '
                        '(default: work_dirs/<config name>)')
    parser.add_argument(
        '--resume', nargs='?', const='auto', default=None, metavar='PATH',
        help='resume from PATH, or without PATH from the latest checkpoint '
        'in the work dir')
    parser.add_argument('--amp', action='store_true',
                        help='mixed precision training (AmpOptimWrapper, '
                        'dynamic loss scale)')
    parser.add_argument('--auto-scale-lr', action='store_true',
                        help='scale the lr by total batch size / '
                        'auto_scale_lr.base_batch_size')
    _add_common(parser)
    return parser


def test_parser() -> argparse.ArgumentParser:
    """Command line of ``tools/test.py``."""
    parser = argparse.ArgumentParser(
        description='Test a checkpoint with an mmdet / mmseg / mmpretrain '
        'config')
    parser.add_argument('config', help='config file path')
    parser.add_argument('checkpoint', help='checkpoint file (path or URL)')
    parser.add_argument('--work-dir', help='where to save the test logs '
                        '(default: work_dirs/<config name>)')
    parser.add_argument('--out', help='dump the predictions to this .pkl '
                        'file')
    parser.add_argument('--show-dir', help='save drawn predictions here '
                        '(mmdet: relative to work_dir/<timestamp>)')
    _add_common(parser)
    return parser


def _add_common(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        '--cfg-options', nargs='+', action=DictAction, metavar='KEY=VALUE',
        help='override config settings, e.g. train_cfg.max_iters=10')
    parser.add_argument('--launcher', choices=LAUNCHERS, default='none',
                        help='job launcher')
    # torch.distributed.launch passes --local-rank (torch >= 2.0) or
    # --local_rank; torchrun sets LOCAL_RANK instead
    parser.add_argument('--local_rank', '--local-rank', type=int, default=0)


def _read_config(path: str, cfg_options: Optional[dict] = None) -> Config:
    """:func:`pola_mm.models.from_config.load_config` for the tools: a
    missing or unreadable file is a :class:`ToolError` (one line, exit 2).
    """
    try:
        return load_config(path, cfg_options)
    except (FileNotFoundError, ConfigFileError) as exc:
        raise ToolError(str(exc)) from None


def _setup_launcher(cfg: Config, launcher: str, local_rank: int) -> None:
    if 'LOCAL_RANK' not in os.environ:
        os.environ['LOCAL_RANK'] = str(local_rank)
    cfg.launcher = launcher
    setup_cpu_distributed(cfg, launcher)


def _set_work_dir(cfg: Config, config_path: str,
                  work_dir: Optional[str]) -> None:
    # --work-dir > config's work_dir > work_dirs/<config name>
    if work_dir is not None:
        cfg.work_dir = work_dir
    elif cfg.get('work_dir') is None:
        cfg.work_dir = osp.join('./work_dirs',
                                osp.splitext(osp.basename(config_path))[0])


def prepare_train_config(args: argparse.Namespace) -> Config:
    """Build the Runner config for ``tools/train.py`` from parsed args."""
    cfg = _read_config(args.config, args.cfg_options)
    _setup_launcher(cfg, args.launcher, args.local_rank)
    _set_work_dir(cfg, args.config, args.work_dir)

    if args.amp:
        optim_wrapper = cfg.get('optim_wrapper')
        if optim_wrapper is None:
            raise ToolError('--amp needs an optim_wrapper in the config')
        if optim_wrapper.get('type', 'OptimWrapper') == 'AmpOptimWrapper':
            raise ToolError('--amp: the config already uses AmpOptimWrapper')
        optim_wrapper['type'] = 'AmpOptimWrapper'
        optim_wrapper['loss_scale'] = 'dynamic'

    if args.auto_scale_lr:
        scale = cfg.get('auto_scale_lr')
        if not scale or 'base_batch_size' not in scale:
            raise ToolError('--auto-scale-lr needs auto_scale_lr = '
                            'dict(base_batch_size=...) in the config')
        scale['enable'] = True

    add_reliability_hooks(cfg)

    if args.resume == 'auto':
        cfg.resume = True
        cfg.load_from = None
    elif args.resume is not None:
        if '://' not in args.resume and not osp.isfile(args.resume):
            raise ToolError(f'checkpoint to resume from not found: '
                            f'{args.resume}')
        cfg.resume = True
        cfg.load_from = args.resume
    return cfg


def _raise_if_missing(cfg: Config, mode: str) -> None:
    """One line (:class:`ToolError`) for the first dataset, annotation file
    or pretrained checkpoint the config needs that is not on disk
    (:func:`pola_mm.cli.data_paths.first_missing`)."""
    missing = first_missing(cfg, mode)
    if missing:
        raise ToolError(missing)


def add_reliability_hooks(cfg: Config) -> None:
    """Make a training config crash-safe and divergence-safe, in place.

    mmengine's ``CheckpointHook`` becomes
    :class:`pola_mm.engine.ResumableCheckpointHook` (same arguments: atomic
    saves, random states for an exact ``--resume``), and
    :class:`pola_mm.engine.InvalidLossHook` is added to ``custom_hooks``
    unless the config has one. A checkpoint hook of another type is kept,
    with a warning.
    """
    hooks = cfg.get('default_hooks')
    if hooks is None:
        cfg.default_hooks = hooks = dict()
    ckpt = hooks.get('checkpoint')
    if ckpt is None:
        hooks['checkpoint'] = dict(type='ResumableCheckpointHook')
    elif ckpt.get('type') in ('CheckpointHook', 'mmengine.CheckpointHook',
                              'ResumableCheckpointHook'):
        ckpt['type'] = 'ResumableCheckpointHook'
    else:
        print_log(f'pola_mm: default_hooks.checkpoint is {ckpt.get("type")}, '
                  'not CheckpointHook: checkpoints are not written '
                  'atomically and --resume does not restore random states',
                  logger='current', level=30)
    custom = list(cfg.get('custom_hooks') or [])
    if not any(isinstance(h, dict) and h.get('type') in (
            'InvalidLossHook', 'pola_mm.InvalidLossHook') for h in custom):
        custom.append(dict(type='InvalidLossHook'))
    cfg.custom_hooks = custom


def _scope(cfg: Config) -> str:
    return cfg.get('default_scope') or 'mmengine'


def _add_dump_metric(cfg: Config, out: str) -> None:
    if not out.endswith(('.pkl', '.pickle')):
        raise ToolError(f'--out must end with .pkl or .pickle: {out}')
    # mmdet's DumpDetResults also encodes masks; elsewhere the generic one
    dump_type = 'DumpDetResults' if _scope(cfg) == 'mmdet' else 'DumpResults'
    dump = dict(type=dump_type, out_file_path=out)
    evaluator = cfg.get('test_evaluator')
    if evaluator is None:
        cfg.test_evaluator = [dump]
    elif isinstance(evaluator, (list, tuple)):
        cfg.test_evaluator = list(evaluator) + [dump]
    elif 'metrics' in evaluator:
        metrics = evaluator['metrics']
        metrics = list(metrics) if isinstance(metrics,
                                              (list, tuple)) else [metrics]
        evaluator['metrics'] = metrics + [dump]
    else:
        cfg.test_evaluator = [evaluator, dump]


def _enable_visualization(cfg: Config, show_dir: str) -> None:
    scope = _scope(cfg)
    hooks = cfg.get('default_hooks') or {}
    hook = hooks.get('visualization')
    if hook is None:
        raise ToolError('--show-dir needs a `visualization` entry in '
                        'default_hooks of the config')
    if scope == 'mmdet':
        hook['draw'] = True
        hook['test_out_dir'] = show_dir
    elif scope == 'mmseg':
        hook['draw'] = True
        if cfg.get('visualizer') is None:
            raise ToolError('--show-dir needs a `visualizer` in the config')
        cfg.visualizer['save_dir'] = show_dir
    elif scope == 'mmpretrain':
        hook['enable'] = True
        hook['out_dir'] = show_dir
        hook['interval'] = 1
    else:
        raise ToolError(f'--show-dir is not supported for default_scope '
                        f'{scope!r} (mmdet, mmseg, mmpretrain are)')


def prepare_test_config(args: argparse.Namespace) -> Config:
    """Build the Runner config for ``tools/test.py`` from parsed args."""
    if '://' not in args.checkpoint and not osp.isfile(args.checkpoint):
        raise ToolError(f'checkpoint not found: {args.checkpoint}')
    cfg = _read_config(args.config, args.cfg_options)
    _setup_launcher(cfg, args.launcher, args.local_rank)
    _set_work_dir(cfg, args.config, args.work_dir)
    cfg.load_from = args.checkpoint
    cfg.resume = False
    if args.out:
        _add_dump_metric(cfg, args.out)
    if args.show_dir:
        _enable_visualization(cfg, args.show_dir)
    return cfg


def build_runner(cfg: Config) -> Runner:
    """``Runner.from_cfg`` or the config's ``runner_type``."""
    if 'runner_type' in cfg:
        from mmengine.registry import RUNNERS
        return RUNNERS.build(cfg)
    return Runner.from_cfg(cfg)


def train_main(argv: Optional[Sequence[str]] = None) -> None:
    """Entry point of ``tools/train.py``."""
    args = train_parser().parse_args(argv)
    install_checked_loader(allow_inert=False)
    stop_on_sigterm()
    cfg = prepare_train_config(args)
    _raise_if_missing(cfg, 'train')
    runner = build_runner(cfg)
    runner.train()
    finish_distributed()


def test_main(argv: Optional[Sequence[str]] = None) -> dict:
    """Entry point of ``tools/test.py``; returns the metrics."""
    args = test_parser().parse_args(argv)
    install_checked_loader(allow_inert=False)
    cfg = prepare_test_config(args)
    _raise_if_missing(cfg, 'test')
    runner = build_runner(cfg)
    metrics = runner.test()
    finish_distributed()
    return metrics


def run_tool(main, argv: Optional[List[str]] = None) -> int:
    """Run ``main(argv)``; expected failures are one line, no traceback.

    Exit codes: 0 done; 2 bad input (:class:`ToolError`, a checkpoint
    file that cannot be read: :class:`CheckpointFileError`, or a config
    mistake that mmengine met while building: an unknown ``type`` or a key
    its class does not take, :func:`~pola_mm.config_errors.build_error_line`;
    any other ``KeyError`` or ``TypeError`` keeps its traceback); 3 training
    diverged (:class:`NonFiniteLossError`); 143 stopped by SIGTERM
    (:class:`TrainingInterrupted`; checkpoints on disk are complete).
    """
    import sys
    quiet_tool_warnings()
    try:
        main(argv)
    except (ToolError, CheckpointFileError) as exc:
        print(f'error: {exc}', file=sys.stderr)
        return 2
    except (KeyError, TypeError) as exc:
        line = build_error_line(exc)
        if line is None:  # not a config mistake: a bug, keep its traceback
            raise
        print(f'error: {line}', file=sys.stderr)
        return 2
    except NonFiniteLossError as exc:
        print(f'error: {exc}', file=sys.stderr)
        return 3
    except TrainingInterrupted as exc:
        print(f'pola_mm: training {exc}; every checkpoint on disk is '
              'complete, continue with --resume', file=sys.stderr)
        return 128 + exc.signum
    return 0
