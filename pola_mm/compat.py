"""Narrow compatibility fixes for the modern torch stack.

Four things do not work out of the box with torch >= 2.6 and mmengine 0.10.7:

1. ``torch.load`` defaults to ``weights_only=True`` (torch >= 2.6), and
   mmengine calls it without the argument. Every checkpoint an mmengine
   ``Runner`` saves holds a ``message_hub`` (``HistoryBuffer`` objects with
   numpy arrays, numpy scalars, and the buffer's statistics methods), so
   ``--resume`` and loading a checkpoint for testing fail.
   :func:`allow_runner_checkpoints` adds exactly those types (pola_mm's one
   allow-list, :func:`pola_mm.fileio.runner_checkpoint_safe_globals`) to
   torch's weights-only allow-list, which keeps refusing anything else
   (pickled code in a foreign file is still rejected). It runs when
   :mod:`pola_mm` is imported.

2. ``mmengine.dist.init_dist('pytorch')`` calls ``torch.cuda.set_device`` and
   the Runner's DDP wrapper passes ``device_ids=[LOCAL_RANK]``; both fail on a
   machine without a GPU. :func:`setup_cpu_distributed` initialises a gloo
   process group and sets the model wrapper to ``device_ids=None``, only when
   the launcher is ``'pytorch'`` and CUDA is unavailable. ``tools/train.py``
   and ``tools/test.py`` call it.

3. After a DDP run on gloo, tearing the interpreter down intermittently
   aborts a rank (see :func:`exit_process`); the tools end such runs with it.

4. The Runner's ``compile=True`` compiles the whole ``model.train_step``,
   so dynamo also traces ``OptimWrapper.update_params``: the optimizer
   step, gradient clipping and mmengine's bookkeeping. With a
   ``paramwise_cfg`` (every Swin recipe, mmdet's and ours) mmengine hands
   the optimizer ``ConfigDict`` param groups, which dynamo cannot trace
   (``'UserDefinedDictVariable' object has no attribute 'items'``; mmdet's
   own RetinaNet fails the same way); without one, the warm-up's lr, the
   logged gradient norm and the step counter change every iteration and
   recompile those frames in each of the first iterations. And ``val()`` /
   ``test()`` compile nothing.
   :func:`patch_runner_compile` makes ``compile`` compile the model's
   computation (``model.compile()``: data samples in, losses or
   predictions out) for training, validation and testing, and leaves the
   data preprocessor, the optimizer step and the bookkeeping eager. It
   runs when :mod:`pola_mm` is imported. See ``docs/compat.md``.
"""
import atexit
import logging
import os
import sys
from typing import Any, NoReturn, Optional

import torch
import torch.distributed as torch_dist
from mmengine.config import Config
from mmengine.logging import print_log
from mmengine.model import is_model_wrapper
from mmengine.registry import MODEL_WRAPPERS
from mmengine.runner import Runner
from torch.nn.parallel import DistributedDataParallel

from .fileio.allow_list import (runner_checkpoint_safe_globals,
                                torch_takes_safe_globals)

__all__ = [
    'allow_runner_checkpoints', 'runner_checkpoint_safe_globals',
    'setup_cpu_distributed', 'finish_distributed', 'exit_process',
    'compile_options', 'compile_model', 'patch_runner_compile'
]


def allow_runner_checkpoints() -> bool:
    """Let ``torch.load(weights_only=True)`` read mmengine Runner checkpoints.

    Adds :func:`runner_checkpoint_safe_globals` to torch's allow-list; no-op
    on torch without ``add_safe_globals`` (< 2.4, where loading is not
    weights-only by default, and where pola_mm's own loader,
    :func:`pola_mm.fileio.load_checkpoint_file`, reads Runner checkpoints
    with the same allow-list through its restricted unpickler). Idempotent.

    Returns:
        True if the allow-list was extended.
    """
    if not torch_takes_safe_globals():
        return False
    torch.serialization.add_safe_globals(runner_checkpoint_safe_globals())
    return True


def sync_bn_to_bn(node: Any) -> int:
    """Replace ``SyncBN`` / ``MMSyncBN`` norm configs by ``BN`` in place.

    torch's SyncBatchNorm only runs on CUDA tensors; every mmseg decode head
    uses it. Only called on the CPU distributed path.

    Args:
        node: a config (dict / list) tree, edited in place.

    Returns:
        How many norm configs were changed.
    """
    count = 0
    if isinstance(node, dict):
        if node.get('type') in ('SyncBN', 'MMSyncBN'):
            node['type'] = 'BN'
            count += 1
        for value in node.values():
            count += sync_bn_to_bn(value)
    elif isinstance(node, (list, tuple)):
        for value in node:
            count += sync_bn_to_bn(value)
    return count


def setup_cpu_distributed(cfg: Config, launcher: str) -> bool:
    """Make ``--launcher pytorch`` work on a machine without CUDA (gloo).

    mmengine's ``init_dist('pytorch')`` calls ``torch.cuda.set_device`` and
    its default DDP wrapper passes ``device_ids=[LOCAL_RANK]``; neither works
    on CPU. When ``launcher == 'pytorch'`` and CUDA is unavailable this
    initialises the default process group with the gloo backend from the
    torchrun environment (``RANK``, ``WORLD_SIZE``, ``MASTER_ADDR``,
    ``MASTER_PORT``), which makes the Runner skip ``init_dist``, and sets
    ``cfg.model_wrapper_cfg['device_ids'] = None`` (keeping any wrapper type
    and options the config chose); ``SyncBN`` norms in ``cfg.model`` become
    ``BN``. Otherwise it does nothing.

    Args:
        cfg: the config the Runner will be built from; edited in place.
        launcher: the ``--launcher`` value.

    Returns:
        True if the CPU path was set up.
    """
    if launcher != 'pytorch' or torch.cuda.is_available():
        return False
    if not torch_dist.is_available():
        raise RuntimeError('torch.distributed is not available in this torch '
                           'build; use --launcher none')
    if not torch_dist.is_initialized():
        torch_dist.init_process_group(backend='gloo')
    env_cfg = cfg.get('env_cfg') or {}
    dist_cfg = dict(env_cfg.get('dist_cfg') or {})
    dist_cfg['backend'] = 'gloo'
    env_cfg['dist_cfg'] = dist_cfg
    cfg.env_cfg = env_cfg
    wrapper = cfg.get('model_wrapper_cfg')
    if wrapper is None:
        # what Runner.wrap_model builds by default, minus the GPU device ids
        wrapper = dict(
            type='MMDistributedDataParallel',
            broadcast_buffers=False,
            find_unused_parameters=cfg.get('find_unused_parameters', False))
    wrapper = dict(wrapper)
    wrapper.setdefault('type', 'MMDistributedDataParallel')
    wrapper_cls = MODEL_WRAPPERS.get(wrapper['type'])
    if isinstance(wrapper_cls, type) and issubclass(wrapper_cls,
                                                    DistributedDataParallel):
        wrapper['device_ids'] = None
    cfg.model_wrapper_cfg = wrapper
    swapped = sync_bn_to_bn(cfg.model)
    if swapped:
        print_log(
            f'pola_mm: SyncBN needs CUDA; {swapped} SyncBN norm configs run '
            'as BN on CPU (statistics per process)', logger='current')
    print_log(
        f'pola_mm: CUDA unavailable, distributed on CPU with gloo '
        f'(rank {torch_dist.get_rank()}/{torch_dist.get_world_size()})',
        logger='current')
    return True


_finished: dict = {}  # what finish_distributed tore down (for exit_process)


def finish_distributed() -> bool:
    """Tear the default process group down after a finished run.

    mmengine's Runner never calls ``destroy_process_group``. A barrier first
    lets every rank finish its last collective; then the group is destroyed
    while Python is still fully alive. Does nothing outside a distributed
    run. A gloo group that DDP has used survives this (see
    :func:`exit_process`).

    Returns:
        True if a process group was destroyed.
    """
    if not (torch_dist.is_available() and torch_dist.is_initialized()):
        return False
    backend = str(torch_dist.get_backend())
    torch_dist.barrier()
    torch_dist.destroy_process_group()
    _finished['gloo'] = 'gloo' in backend
    return True


def exit_process(code: int) -> NoReturn:
    """End a tool's process with ``code``.

    After a run whose gloo group :func:`finish_distributed` destroyed, the
    interpreter's teardown is skipped. Once DDP has used a gloo group, the
    group and its worker threads outlive ``destroy_process_group`` (even
    after the DDP module is deleted), and tearing the interpreter down
    around them aborts a rank now and then (SIGABRT, "terminate called
    without an active exception") after the run has succeeded, so torchrun
    reports the job as failed: 4 of 30 two-process DDP runs here with torch
    2.14 (after :func:`finish_distributed`), 0 of 30 with this exit. The
    ``atexit`` handlers still run, and the log handlers and standard streams
    are flushed first. Everywhere else (NCCL, single process) this is
    ``sys.exit(code)``.
    """
    if not _finished.get('gloo'):
        sys.exit(code)
    run_exitfuncs = getattr(atexit, '_run_exitfuncs', None)
    if run_exitfuncs is not None:
        run_exitfuncs()
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # closed or broken stream
            pass
    os._exit(code)


def compile_options(compile_cfg: Any) -> Optional[dict]:
    """The ``torch.compile`` keyword arguments of a Runner's ``compile``.

    Read as mmengine reads it: ``None`` or ``False`` -> None (no
    compilation), ``True`` -> ``{}`` (torch's defaults), a dict -> a copy of
    it (``backend``, ``mode``, ``dynamic``, ``fullgraph``, ``options``).

    Raises:
        TypeError: for any other value.
    """
    if compile_cfg is None or compile_cfg is False:
        return None
    if compile_cfg is True:
        return {}
    if isinstance(compile_cfg, dict):
        return dict(compile_cfg)
    raise TypeError(
        f'`compile` should be a dict or bool, got {type(compile_cfg)}')


def compile_model(model: torch.nn.Module, options: dict) -> bool:
    """``torch.compile`` the computation of a Runner's model, once.

    Compiles the module's call (``nn.Module.compile``) of the model inside
    any wrapper (DDP calls it), so every ``train_step`` / ``val_step`` /
    ``test_step`` runs its forward compiled while the steps themselves --
    data preprocessing, loss parsing, the optimizer step, logging -- stay
    eager. ``copy.deepcopy`` (EMA hooks) copies the module uncompiled.

    Args:
        model: the Runner's model, wrapped or not.
        options: keyword arguments of ``torch.compile``.

    Returns:
        True if the model was compiled now, False if it already was.
    """
    module = model.module if is_model_wrapper(model) else model
    if getattr(module, '_compiled_call_impl', None) is not None:
        return False
    module.compile(**options)
    return True


# mmengine's Runner methods that patch_runner_compile replaced, by name
_RUNNER_ORIGINAL: dict = {}


def _maybe_compile(self: Runner, target: str) -> None:
    """``Runner._maybe_compile`` of :func:`patch_runner_compile`."""
    options = compile_options(self.cfg.get('compile', None))
    if options is None:
        return
    if compile_model(self.model, options):
        self.logger.info(
            f'pola_mm: the model\'s forward is compiled with '
            f'torch.compile({options}) for {target} and every later step; '
            'preprocessing and the optimizer step stay eager (pola_mm.compat)'
            '. The first iterations will be slow.')


def _val(self: Runner) -> dict:
    """``Runner.val`` that honours ``compile`` (mmengine's compiles only
    for training)."""
    self._maybe_compile('val_step')
    return _RUNNER_ORIGINAL['val'](self)


def _test(self: Runner) -> dict:
    """``Runner.test`` that honours ``compile``."""
    self._maybe_compile('test_step')
    return _RUNNER_ORIGINAL['test'](self)


def patch_runner_compile() -> bool:
    """Make the Runner's ``compile`` option compile the model's computation.

    Replaces ``Runner._maybe_compile`` (mmengine 0.10: ``torch.compile`` of
    the whole ``model.train_step``, optimizer step included) by
    :func:`compile_model` and makes ``Runner.val`` / ``Runner.test`` call it
    too. Idempotent.

    Returns:
        True if the Runner was patched now.
    """
    if _RUNNER_ORIGINAL:
        return False
    for name in ('_maybe_compile', 'val', 'test'):
        _RUNNER_ORIGINAL[name] = getattr(Runner, name)
    Runner._maybe_compile = _maybe_compile
    Runner.val = _val
    Runner.test = _test
    return True


allow_runner_checkpoints()
patch_runner_compile()
