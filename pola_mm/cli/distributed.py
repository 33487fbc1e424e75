"""Start and end the processes of ``tools/train.py`` and ``tools/test.py``.

Called by the tools (:mod:`.train_test`), not by ``import pola_mm``; where
CUDA is available and for single-process runs they change nothing.

- :func:`setup_cpu_distributed`: ``mmengine.dist.init_dist('pytorch')``
  calls ``torch.cuda.set_device`` and the Runner's DDP wrapper passes
  ``device_ids=[LOCAL_RANK]``; both fail on a machine without a GPU. This
  initialises a gloo process group and sets the model wrapper to
  ``device_ids=None``, only when the launcher is ``'pytorch'`` and CUDA is
  unavailable (``SyncBN`` norms, CUDA-only, become ``BN``:
  :func:`sync_bn_to_bn`).
- :func:`finish_distributed` and :func:`exit_process`: after a DDP run on
  gloo, tearing the interpreter down intermittently aborts a rank; the
  tools destroy the process group and end such runs without the teardown.

docs/compat.md has the failures and their tests.
"""
import atexit
import logging
import os
import sys
from typing import Any, NoReturn

import torch
import torch.distributed as torch_dist
from mmengine.config import Config
from mmengine.logging import print_log
from mmengine.registry import MODEL_WRAPPERS
from torch.nn.parallel import DistributedDataParallel

__all__ = ['sync_bn_to_bn', 'setup_cpu_distributed', 'finish_distributed',
           'exit_process']


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
