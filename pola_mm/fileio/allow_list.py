"""The globals a checkpoint file may name: pola_mm's one allow-list.

Two loaders read it:

- torch's own weights-only unpickler, extended by
  :func:`pola_mm.compat.allow_runner_checkpoints` with
  :func:`runner_checkpoint_safe_globals` (what an mmengine ``Runner``
  checkpoint needs beyond torch's defaults);
- pola_mm's restricted unpickler (:mod:`pola_mm.fileio.unpickler`), which
  takes :func:`numpy_globals` and wraps the two numpy functions in checks of
  their arguments; on a torch whose weights-only loader takes no allow-list
  (< 2.4, :func:`torch_takes_safe_globals`), its Runner mode
  (``runner_pickle_module``) takes :func:`runner_checkpoint_safe_globals`
  too and reads Runner checkpoints in torch's place.

Both take numpy from :func:`numpy_globals`, the one list of numpy names.
"""
import importlib
import pickle
from typing import Any, Callable, Dict, List, Tuple, Union

__all__ = ['NUMPY_DTYPES', 'numpy_globals', 'runner_checkpoint_safe_globals',
           'torch_takes_safe_globals']

#: numpy dtypes a checkpoint may hold as arrays or scalars (log values,
#: counts, accuracies).
NUMPY_DTYPES: Tuple[str, ...] = (
    'bool', 'int8', 'int16', 'int32', 'int64', 'uint8', 'uint16', 'uint32',
    'uint64', 'float16', 'float32', 'float64')

#: Where numpy's pickles find ``_reconstruct`` and ``scalar``: numpy 2
#: writes ``numpy._core.multiarray``, numpy 1 wrote ``numpy.core.multiarray``.
NUMPY_MULTIARRAY_MODULES: Tuple[str, ...] = (
    'numpy._core.multiarray', 'numpy.core.multiarray')


def torch_takes_safe_globals() -> bool:
    """Whether torch's weights-only loader takes an allow-list
    (``torch.serialization.add_safe_globals``, torch >= 2.4).

    Where it does, :func:`pola_mm.compat.allow_runner_checkpoints` adds
    :func:`runner_checkpoint_safe_globals` to it; where it does not,
    :func:`pola_mm.fileio.load_checkpoint_file` reads the files torch's
    loader refuses with :func:`pola_mm.fileio.unpickler.runner_pickle_module`
    (the same allow-list). Checked on the running torch, not on its version.
    """
    import torch
    return hasattr(torch.serialization, 'add_safe_globals')


def numpy_globals() -> Dict[Tuple[str, str], Any]:
    """numpy arrays, dtypes and scalars: ``(module, name) -> object``.

    ``numpy.ndarray``, ``numpy.dtype``, the dtype class of each of
    :data:`NUMPY_DTYPES` (numpy >= 1.20 has one class per dtype) and the
    array and scalar constructors ``_reconstruct`` and ``scalar`` under both
    module names of :data:`NUMPY_MULTIARRAY_MODULES`. The objects are
    numpy's own; a loader that calls them with pickled arguments checks
    those first (see :mod:`pola_mm.fileio.unpickler`).

    Returns:
        The table; empty without numpy.
    """
    try:
        import numpy as np
    except ImportError:  # pragma: no cover - numpy comes with torch
        return {}
    # numpy 2: numpy._core; numpy 1.26: numpy._core.multiarray is a shim of
    # numpy.core.multiarray, but the attribute np._core exists only once
    # something imported it, without .multiarray; older numpy: numpy.core
    try:
        multiarray = importlib.import_module('numpy._core.multiarray')
    except ImportError:
        multiarray = importlib.import_module('numpy.core.multiarray')
    table: Dict[Tuple[str, str], Any] = {
        ('numpy', 'ndarray'): np.ndarray,
        ('numpy', 'dtype'): np.dtype,
    }
    for module in NUMPY_MULTIARRAY_MODULES:
        table[module, '_reconstruct'] = multiarray._reconstruct
        table[module, 'scalar'] = multiarray.scalar
    for name in NUMPY_DTYPES:
        dtype_cls = type(np.dtype(name))
        if dtype_cls is not np.dtype:
            table[dtype_cls.__module__, dtype_cls.__qualname__] = dtype_cls
    return table


def _history_buffer_attr(obj: Any, name: str) -> Callable:
    """Stand-in for ``builtins.getattr`` while unpickling a checkpoint.

    ``HistoryBuffer.__getstate__`` saves its statistics methods, which pickle
    writes as ``getattr(HistoryBuffer, 'min')``. Only that lookup is allowed:
    the class must be ``HistoryBuffer`` and the attribute one of its
    registered statistics methods.
    """
    from mmengine.logging import HistoryBuffer
    methods = set(HistoryBuffer._statistics_methods) | {
        'min', 'max', 'current', 'mean'
    }
    if obj is HistoryBuffer and name in methods:
        return getattr(obj, name)
    raise pickle.UnpicklingError(
        f'pola_mm: refusing getattr({obj!r}, {name!r}) while loading with '
        'weights_only=True; only HistoryBuffer statistics methods are allowed')


def runner_checkpoint_safe_globals() -> List[Union[Any, Tuple[Any, str]]]:
    """The globals an mmengine Runner checkpoint needs beyond torch's own.

    Observed in checkpoints saved by ``Runner.save_checkpoint`` (mmengine
    0.10.7, numpy 1.x and 2.x names): ``HistoryBuffer``, its statistics
    methods (via a restricted ``getattr``), and numpy arrays, dtypes and
    scalars (:func:`numpy_globals`).

    Returns:
        A list for :func:`torch.serialization.add_safe_globals`.
    """
    from mmengine.logging import HistoryBuffer
    entries: List[Union[Any, Tuple[Any, str]]] = [
        HistoryBuffer,
        (_history_buffer_attr, 'builtins.getattr'),
    ]
    entries.extend((obj, f'{module}.{name}')
                   for (module, name), obj in numpy_globals().items())
    return entries
