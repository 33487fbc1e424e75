"""Every random generator a training process draws from, as plain data.

mmengine seeds the generators once when the Runner is built and does not
save their states in checkpoints, so a resumed run draws other random
numbers (drop path, dropout, RoI sampling, batch augments, data pipelines
in the main process) than the uninterrupted run would have. These helpers
capture and restore them; the states are tensors, numpy arrays and Python
ints, which ``torch.load(weights_only=True)`` reads.
"""
import random
from typing import Any, Dict

import numpy as np
import torch

__all__ = ['get_rng_state', 'set_rng_state']


def get_rng_state() -> Dict[str, Any]:
    """The states of Python's ``random``, numpy's global generator, torch's
    CPU generator and (when CUDA is initialised) every CUDA generator."""
    state: Dict[str, Any] = dict(
        python=random.getstate(),
        numpy=np.random.get_state(),
        torch=torch.get_rng_state())
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state['cuda'] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: Dict[str, Any]) -> None:
    """Restore a state of :func:`get_rng_state` (CUDA states only where
    CUDA is available)."""
    version, internal, gauss = state['python']
    random.setstate((version, tuple(internal), gauss))
    np.random.set_state(tuple(state['numpy']))
    torch.set_rng_state(state['torch'])
    if 'cuda' in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state['cuda'])
