"""What makes a training run survive faults (installed by ``tools/train.py``).

- :mod:`.atomic_save`: atomic checkpoint writes (temporary file in the
  same folder, flush, fsync, rename);
- :mod:`.rng`: every random generator of a process, captured and restored;
- :mod:`.signals`: SIGTERM stops training between iterations, never inside a
  checkpoint write;
- :mod:`.hooks`: :class:`ResumableCheckpointHook` (atomic saves, old
  checkpoints pruned only after the new one is complete, random states of
  every rank saved and restored on resume) and :class:`InvalidLossHook`
  (a NaN / Inf loss stops training before anything is saved).

Reading a checkpoint back safely (``--resume``, ``load_from``) is
:mod:`pola_mm.fileio`'s job (:func:`pola_mm.fileio.install_checked_loader`).
See docs/reliability.md.
"""
from .atomic_save import (atomic_checkpoint_writes, atomic_save_checkpoint,
                          atomic_write, stale_temporary_files)
from .hooks import InvalidLossHook, NonFiniteLossError, ResumableCheckpointHook
from .rng import get_rng_state, set_rng_state
from .signals import TrainingInterrupted, stop_on_sigterm

__all__ = [
    'atomic_save_checkpoint', 'atomic_write', 'atomic_checkpoint_writes',
    'stale_temporary_files', 'InvalidLossHook',
    'NonFiniteLossError', 'ResumableCheckpointHook', 'get_rng_state',
    'set_rng_state', 'TrainingInterrupted', 'stop_on_sigterm'
]
