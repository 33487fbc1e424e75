"""Safe reading of checkpoint files: the restricted unpickler and pola_mm's
one allow-list of the globals a checkpoint may name.

- :mod:`.allow_list`: the allow-list (numpy, mmengine's ``HistoryBuffer``),
  for torch's weights-only loader and for the restricted unpickler;
- :mod:`.unpickler`: the restricted unpickler (:class:`InertObject`
  stand-ins, nothing from the file ever runs);
- :mod:`.safe_load`: :func:`load_checkpoint_file`, the one way pola_mm reads
  a checkpoint file, and :class:`CheckpointFileError`.
"""
from .allow_list import numpy_globals, runner_checkpoint_safe_globals
from .safe_load import CheckpointFileError, load_checkpoint_file
from .unpickler import InertObject

__all__ = [
    'CheckpointFileError', 'InertObject', 'load_checkpoint_file',
    'numpy_globals', 'runner_checkpoint_safe_globals'
]
