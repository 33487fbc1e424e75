"""Hooks that ``tools/train.py`` adds to every training run.

:class:`ResumableCheckpointHook` replaces mmengine's ``CheckpointHook``
(same arguments): checkpoints and ``last_checkpoint`` are written
atomically, outdated checkpoints are deleted only after the new one is
complete, and the random states of every rank travel in the checkpoint so
that ``--resume`` continues the uninterrupted run bit for bit.

:class:`InvalidLossHook` stops training at the first iteration whose loss
(or any loss term) is NaN or Inf, before a checkpoint of the broken weights
can be written.

Both register in mmengine's root ``HOOKS`` registry, so mmdet, mmseg and
mmpretrain configs find them by name.
"""
import functools
import math
import os
import os.path as osp
import sys
from typing import Any, Dict, Iterator, List, Optional, Sequence

import torch
from mmengine import dist
from mmengine.hooks import CheckpointHook, Hook
from mmengine.logging import print_log
from mmengine.registry import HOOKS
from mmengine.runner import EpochBasedTrainLoop

from .atomic_save import (atomic_checkpoint_writes, atomic_write,
                          stale_temporary_files)
from .rng import get_rng_state, set_rng_state

__all__ = ['ResumableCheckpointHook', 'InvalidLossHook', 'NonFiniteLossError']


class _RestoreBeforeBatch:
    """Wraps an ``IterBasedTrainLoop``'s data iterator on resume: the loop
    first draws ``skip`` batches to reach its position (mmengine replays the
    data it already trained on); just before the next batch is drawn, the
    random states of the checkpoint are restored, which is where the
    uninterrupted run stood when it saved them."""

    def __init__(self, iterator: Iterator, skip: int,
                 state: Dict[str, Any]) -> None:
        self.iterator = iterator
        self.skip = skip
        self.state: Optional[Dict[str, Any]] = state

    def __iter__(self) -> '_RestoreBeforeBatch':
        return self

    def __next__(self) -> Any:
        if self.skip > 0:
            self.skip -= 1
        elif self.state is not None:
            set_rng_state(self.state)
            self.state = None
        return next(self.iterator)


@HOOKS.register_module()
class ResumableCheckpointHook(CheckpointHook):
    """mmengine's ``CheckpointHook`` with crash-safe saves and exact resume.

    Takes exactly ``CheckpointHook``'s arguments. Differences:

    - the checkpoint file and ``last_checkpoint`` are written atomically
      (:func:`pola_mm.engine.atomic_write`); a SIGTERM during the write is
      held until both are complete;
    - with ``max_keep_ckpts``, outdated checkpoints are deleted after the new
      one is written (mmengine deletes first: with ``max_keep_ckpts=1`` a
      crash during the save left no checkpoint at all);
    - ``meta['rng_states']`` holds the random states of every rank (Python,
      numpy, torch CPU and CUDA), gathered when the checkpoint is saved; on
      ``--resume`` each rank restores its own where the uninterrupted run
      drew its next batch (epoch-based loops: before the next epoch's data
      loader starts; iteration-based loops: after mmengine has replayed the
      data up to the checkpoint);
    - validation runs with the random states saved before it and restored
      after it, so a resumed run (which does not repeat that validation)
      draws the same random numbers as the uninterrupted one;
    - temporary files left by a process killed while writing are deleted
      when training starts.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._resume_state: Optional[Dict[str, Any]] = None
        self._val_state: Optional[Dict[str, Any]] = None

    # ------------------------------------------------------------- saving
    def _save_checkpoint_with_step(self, runner, step: int,
                                   meta: dict) -> None:
        """Save ``filename_tmpl.format(step)``; same bookkeeping as
        mmengine, but atomic, random states included, pruning last."""
        meta = dict(meta, rng_states=self._gathered_rng_states())
        outdated: List[str] = []
        if self.max_keep_ckpts > 0 and not (self.keep_ckpt_ids and
                                            self.keep_ckpt_ids[-1] == step):
            if len(self.keep_ckpt_ids) == self.max_keep_ckpts:
                outdated.append(self.file_backend.join_path(
                    self.out_dir,
                    self.filename_tmpl.format(self.keep_ckpt_ids.popleft())))
            self.keep_ckpt_ids.append(step)
            runner.message_hub.update_info('keep_ckpt_ids',
                                           list(self.keep_ckpt_ids))
        ckpt_filename = self.filename_tmpl.format(step)
        self.last_ckpt = self.file_backend.join_path(self.out_dir,
                                                     ckpt_filename)
        runner.message_hub.update_info('last_ckpt', self.last_ckpt)
        with atomic_checkpoint_writes():
            runner.save_checkpoint(
                self.out_dir,
                ckpt_filename,
                self.file_client_args,
                save_optimizer=self.save_optimizer,
                save_param_scheduler=self.save_param_scheduler,
                meta=meta,
                by_epoch=self.by_epoch,
                backend_args=self.backend_args,
                **self.args)
            if not dist.is_main_process():
                return
            text = str(self.last_ckpt).encode()
            atomic_write(
                osp.join(runner.work_dir, 'last_checkpoint'),
                lambda f: f.write(text))
        for path in outdated:
            if self.file_backend.isfile(path):
                self.file_backend.remove(path)
            elif self.file_backend.isdir(path):  # deepspeed checkpoints
                self.file_backend.rmtree(path)

    def _save_best_checkpoint(self, runner, metrics) -> None:
        with atomic_checkpoint_writes():
            super()._save_best_checkpoint(runner, metrics)

    @staticmethod
    def _gathered_rng_states() -> List[Dict[str, Any]]:
        """Random states of every rank (index = rank); a collective call:
        every rank saves at the same step."""
        state = get_rng_state()
        if dist.get_world_size() > 1:
            return dist.all_gather_object(state)
        return [state]

    # ------------------------------------------------------------ resuming
    def before_train(self, runner) -> None:
        super().before_train(runner)
        if dist.is_main_process() and osp.isdir(str(self.out_dir)):
            for path in stale_temporary_files(str(self.out_dir)):
                os.remove(path)
                print_log(f'pola_mm: removed {path}, left by a process that '
                          'was killed while writing a checkpoint',
                          logger='current')
        loop = runner.train_loop
        if self._resume_state is not None and hasattr(
                loop, 'dataloader_iterator'):
            loop.dataloader_iterator = _RestoreBeforeBatch(
                loop.dataloader_iterator, loop.iter, self._resume_state)
            self._resume_state = None

    def before_train_epoch(self, runner) -> None:
        if self._resume_state is not None:  # epoch-based loops
            set_rng_state(self._resume_state)
            self._resume_state = None

    def after_load_checkpoint(self, runner, checkpoint: dict) -> None:
        """On ``--resume``, keep this rank's random states for
        :meth:`before_train` / :meth:`before_train_epoch`."""
        if not getattr(runner, '_resume', False):
            return  # load_from: fine-tuning starts fresh
        states = (checkpoint.get('meta') or {}).get('rng_states')
        world = dist.get_world_size()
        if states is None:
            print_log(
                'pola_mm: the checkpoint holds no random states (saved '
                'without ResumableCheckpointHook): the resumed run draws '
                'other random numbers than the uninterrupted one would have',
                logger='current', level=30)
        elif len(states) != world:
            print_log(
                f'pola_mm: the checkpoint holds the random states of '
                f'{len(states)} processes, this run has {world}: not '
                'restored (the resumed run is not bit-exact)',
                logger='current', level=30)
        else:
            self._resume_state = states[dist.get_rank()]

    # ---------------------------------------------------------- validation
    def before_val(self, runner) -> None:
        self._val_state = get_rng_state()

    def after_val(self, runner) -> None:
        if self._val_state is not None:
            set_rng_state(self._val_state)
            self._val_state = None


class NonFiniteLossError(RuntimeError):
    """Training stopped because a loss became NaN or Inf."""


def _report_divergence(exc_type, exc, tb, previous) -> None:
    """``sys.excepthook`` while :class:`InvalidLossHook` trains: a
    :class:`NonFiniteLossError` that reaches the top of a program (the
    upstream packages' ``tools/train.py`` do not catch it) is one line on
    stderr instead of a traceback; Python then exits with 1. Anything else
    goes to the hook that was installed before."""
    if issubclass(exc_type, NonFiniteLossError):
        print(f'error: {exc}', file=sys.stderr, flush=True)
    else:
        previous(exc_type, exc, tb)


@HOOKS.register_module()
class InvalidLossHook(Hook):
    """Stop training at the first NaN / Inf loss, naming the iteration and
    the loss terms.

    Checks every loss the model logs (``loss`` and each term of the
    ``outputs`` of ``train_step``) after every ``interval``-th iteration;
    in a distributed run the verdict is shared (one all-reduce of one
    number), so every rank stops at the same iteration. It runs after the
    logger and before the checkpoint hook (priority ``LOW``): the broken
    iteration is logged, but its weights are never saved, so the newest
    checkpoint (``last_checkpoint``) is the last good one. The run ends
    with :class:`NonFiniteLossError`; ``tools/train.py`` prints its message
    and exits with code 3. Under a tool that does not catch it (mmdet's,
    mmseg's, mmpretrain's ``tools/train.py``, ``mim train``) the hook's
    ``sys.excepthook``, chained in ``before_run``, prints the same single
    line instead of a traceback and Python exits with 1.

    Under ``AmpOptimWrapper`` the loss is computed before scaling: a
    gradient overflow that the dynamic loss scale absorbs (the step is
    skipped, the scale halved) does not stop training; only a non-finite
    loss does.

    Args:
        interval: check every ``interval`` iterations (1: at most the
            broken iteration itself runs).
    """

    priority = 'LOW'

    def __init__(self, interval: int = 1) -> None:
        if not isinstance(interval, int) or interval < 1:
            raise ValueError(f'InvalidLossHook: interval must be a positive '
                             f'int, got {interval!r}')
        self.interval = interval

    def before_run(self, runner) -> None:
        """Make a divergence that no tool catches end in one line (see
        :func:`_report_divergence`); chained to the installed excepthook,
        once per process."""
        if getattr(sys.excepthook, 'func', None) is not _report_divergence:
            sys.excepthook = functools.partial(_report_divergence,
                                               previous=sys.excepthook)

    def after_train_iter(self, runner, batch_idx: int,
                         data_batch: Any = None,
                         outputs: Optional[Dict[str, Any]] = None) -> None:
        if not self.every_n_train_iters(runner, self.interval):
            return
        terms = self._terms(outputs or {})
        bad = not all(math.isfinite(v) for v in terms.values())
        if dist.get_world_size() > 1:
            flag = torch.tensor([float(bad)])
            dist.all_reduce(flag, op='sum')
            if float(flag) == 0:
                return
            per_rank = dist.all_gather_object(terms)
        elif not bad:
            return
        else:
            per_rank = [terms]
        raise NonFiniteLossError(self._message(runner, per_rank))

    @staticmethod
    def _terms(outputs: Dict[str, Any]) -> Dict[str, float]:
        """The logged loss values as floats (tensors averaged)."""
        terms = {}
        for name, value in outputs.items():
            if isinstance(value, torch.Tensor):
                value = value.detach().float().mean().item()
            elif isinstance(value, Sequence) and value and all(
                    isinstance(v, torch.Tensor) for v in value):
                value = sum(v.detach().float().mean().item() for v in value)
            if isinstance(value, (int, float)) and 'loss' in name:
                terms[name] = float(value)
        return terms

    @staticmethod
    def _message(runner, per_rank: List[Dict[str, float]]) -> str:
        lines = []
        for rank, terms in enumerate(per_rank):
            bad = [k for k, v in terms.items() if not math.isfinite(v)]
            if not bad:
                continue
            values = ', '.join(f'{k}={v:.4g}' for k, v in terms.items())
            who = f'rank {rank}: ' if len(per_rank) > 1 else ''
            lines.append(f'{who}non-finite {", ".join(bad)} ({values})')
        last = osp.join(runner.work_dir, 'last_checkpoint')
        fix = ('Lower the learning rate, lengthen the warm-up or clip '
               'gradients (optim_wrapper.clip_grad)')
        if osp.isfile(last):
            with open(last) as f:
                kept = f'the last good checkpoint is {f.read().strip()}'
            then = f'{fix}, then --resume from it'
        else:
            kept = 'no checkpoint had been saved yet'
            then = f'{fix}, then train again from the start'
        where = f'iteration {runner.iter + 1}'
        if isinstance(runner.train_loop, EpochBasedTrainLoop):
            where += f' (epoch {runner.epoch + 1})'
        return (f'training diverged at {where}: {"; ".join(lines)}. '
                'Stopped before '
                f'saving the broken weights; {kept}. {then}')
