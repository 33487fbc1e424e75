"""Safe reading of checkpoint files: the restricted unpickler and pola_mm's
one allow-list of the globals a checkpoint may name.

- :mod:`.allow_list`: the allow-list (numpy, mmengine's ``HistoryBuffer``),
  for torch's weights-only loader and for the restricted unpickler;
- :mod:`.unpickler`: the restricted unpickler (:class:`InertObject`
  stand-ins, nothing from the file ever runs);
- :mod:`.safe_load`: :func:`load_checkpoint_file`, the one way pola_mm reads
  a checkpoint file, :class:`CheckpointFileError`, and
  :func:`install_checked_loader`, which makes it mmengine's loader of local
  files in the tools (``--resume``, ``load_from``, ``tools/test.py``).

Writing checkpoints (atomically) is :mod:`pola_mm.engine.atomic_save`'s
job; converting the authors' weights and loading them into a backbone is
:mod:`pola_mm.models.checkpoint`'s.
"""
from .allow_list import numpy_globals, runner_checkpoint_safe_globals
from .safe_load import (CheckpointFileError, install_checked_loader,
                        load_checkpoint_file)
from .unpickler import InertObject

__all__ = [
    'CheckpointFileError', 'InertObject', 'load_checkpoint_file',
    'install_checked_loader', 'numpy_globals',
    'runner_checkpoint_safe_globals'
]
