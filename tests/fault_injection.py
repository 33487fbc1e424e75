"""Faults injected into real training runs (tests/engine/test_resume*.py,
test_checkpoint_atomic.py, test_divergence.py).

Configs import this module with ``custom_imports`` (``tests/`` on
``PYTHONPATH``) and add the hooks to ``custom_hooks``.
"""
import errno
import os
import signal
import time

import torch
from mmengine import dist
from mmengine.hooks import Hook
from mmengine.registry import HOOKS


@HOOKS.register_module()
class BlockAtIterHook(Hook):
    """Before iteration ``at + 1`` runs (``runner.iter == at``), rank 0
    writes ``marker`` and every rank waits to be killed."""

    def __init__(self, at: int, marker: str) -> None:
        self.at = at
        self.marker = marker

    def before_train_iter(self, runner, batch_idx, data_batch=None) -> None:
        if runner.iter != self.at:
            return
        if dist.get_rank() == 0:
            with open(self.marker, 'w') as f:
                f.write(str(runner.iter))
        while True:
            time.sleep(1)


@HOOKS.register_module()
class NaNAtIterHook(Hook):
    """Before iteration ``at + 1``, rank 0 fills the first parameter of
    the model with NaN (its loss becomes NaN; other ranks stay finite
    until the gradients are averaged)."""

    def __init__(self, at: int) -> None:
        self.at = at

    def before_train_iter(self, runner, batch_idx, data_batch=None) -> None:
        if runner.iter == self.at and dist.get_rank() == 0:
            with torch.no_grad():
                next(runner.model.parameters()).fill_(float('nan'))


@HOOKS.register_module()
class InfGradAtIterHook(Hook):
    """In iteration ``at + 1`` the gradient of the first parameter is Inf
    (an fp16 overflow). Keeps that parameter before and after the
    iteration in ``before`` / ``after``."""

    def __init__(self, at: int) -> None:
        self.at = at
        self.handle = None
        self.before = self.after = None

    def before_train_iter(self, runner, batch_idx, data_batch=None) -> None:
        if runner.iter == self.at:
            param = next(runner.model.parameters())
            self.before = param.detach().clone()
            self.handle = param.register_hook(
                lambda grad: torch.full_like(grad, float('inf')))

    def after_train_iter(self, runner, batch_idx, data_batch=None,
                         outputs=None) -> None:
        if self.handle is not None:
            self.handle.remove()
            self.handle = None
            self.after = next(runner.model.parameters()).detach().clone()


@HOOKS.register_module()
class BrokenSaveHook(Hook):
    """While the checkpoint of step ``at`` is written, ``torch.save`` writes
    half of it and then fails: ``mode='error'`` raises ENOSPC (a full
    disk), ``mode='kill'`` SIGKILLs the process, ``mode='sigterm'`` sends
    SIGTERM to the process and completes the write."""

    def __init__(self, at: int, mode: str) -> None:
        self.at = at
        self.mode = mode

    def before_save_checkpoint(self, runner, checkpoint) -> None:
        if checkpoint['meta'].get('iter') != self.at:
            return
        if self.mode == 'sigterm':
            os.kill(os.getpid(), signal.SIGTERM)
            return
        original = torch.save
        mode = self.mode

        def half_save(obj, f, *args, **kwargs):
            torch.save = original
            original(obj, f, *args, **kwargs)
            f.flush()
            f.truncate(f.tell() // 2)
            if mode == 'kill':
                os.kill(os.getpid(), signal.SIGKILL)
            raise OSError(errno.ENOSPC, 'No space left on device (injected)')

        torch.save = half_save


# ----------------------------------------------------------- test helpers
def seg_config(root: str, iters: int = 6, interval: int = 2,
               hooks: tuple = ()) -> str:
    """Write the real ``sem_fpn_pola_pvt_t_ade20k.py`` shrunk as in the e2e
    tests (tiny PVT, 4 images of 32x32, no workers) to ``root/cfg.py``,
    with randomness left in on purpose: drop path 0.1 in the backbone and
    a random flip (p 0.5) in the pipeline, so that an exact resume needs
    the random states. Checkpoints every ``interval`` iterations into
    ``root/work``; ``hooks`` are added to ``custom_hooks``.

    Returns:
        The config path.
    """
    import os.path as osp

    import e2e_data
    data_root = osp.join(root, 'ade')
    if not osp.isdir(data_root):
        e2e_data.make_ade(data_root, num_images=4, size=32)
    cfg = e2e_data.tiny_seg(
        e2e_data.load('sem_fpn_pola_pvt_t_ade20k.py'), dict(
            data_root=data_root), osp.join(root, 'work'), iters=iters,
        size=32)
    cfg.model.backbone.drop_path_rate = 0.1
    for t in cfg.train_dataloader.dataset.pipeline:
        if t.type == 'RandomFlip':
            t.prob = 0.5
    cfg.default_hooks.checkpoint.interval = interval
    cfg.train_cfg.val_interval = iters + 1
    cfg.log_level = 'INFO'
    cfg.custom_imports = dict(
        imports=list(cfg.custom_imports.imports) + ['fault_injection'],
        allow_failed_imports=False)
    cfg.custom_hooks = list(cfg.get('custom_hooks') or []) + list(hooks)
    path = osp.join(root, 'cfg.py')
    cfg.dump(path)
    return path
