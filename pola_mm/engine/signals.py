"""SIGTERM (what schedulers send before pre-empting a job) stops training,
never inside a checkpoint write.

``tools/train.py`` calls :func:`stop_on_sigterm`. Outside a checkpoint write
the signal raises :class:`TrainingInterrupted` at once; during one (see
:func:`pola_mm.engine.atomic_save.atomic_checkpoint_writes`) it is held
until the checkpoint and ``last_checkpoint`` are complete, then raised. The
tool ends with exit code 143 (128 + SIGTERM), the usual code of a
terminated process, so schedulers and torchrun see a failed run.
"""
import signal
import threading
from contextlib import contextmanager
from typing import Any, Iterator, Optional

__all__ = ['TrainingInterrupted', 'stop_on_sigterm', 'signals_held']

_state = dict(held=0, pending=None)


class TrainingInterrupted(BaseException):
    """Training was stopped by a signal. A ``BaseException`` (like
    ``KeyboardInterrupt``) so that no ``except Exception`` swallows it."""

    def __init__(self, signum: int) -> None:
        self.signum = signum
        super().__init__(f'stopped by {signal.Signals(signum).name}')


def _handler(signum: int, frame: Any) -> None:
    if _state['held']:
        _state['pending'] = signum
        return
    raise TrainingInterrupted(signum)


def stop_on_sigterm() -> bool:
    """Install the SIGTERM handler (main thread only; elsewhere Python does
    not allow it). Returns True if installed."""
    if threading.current_thread() is not threading.main_thread():
        return False
    signal.signal(signal.SIGTERM, _handler)
    return True


@contextmanager
def signals_held() -> Iterator[None]:
    """Hold a SIGTERM that arrives inside the block until it ends."""
    _state['held'] += 1
    try:
        yield
    finally:
        _state['held'] -= 1
    pending: Optional[int] = _state['pending']
    if not _state['held'] and pending is not None:
        _state['pending'] = None
        raise TrainingInterrupted(pending)
