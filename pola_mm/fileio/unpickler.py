"""pola_mm's restricted unpickler: checkpoint files read as data, never run.

``torch.load(..., pickle_module=inert_pickle_module(record))`` resolves only
the allow-listed globals (tensor rebuilding with checked arguments,
storages, ``OrderedDict``, a few builtins, torch dtypes and the numpy names
of :func:`pola_mm.fileio.allow_list.numpy_globals`); every other global
becomes an :class:`InertObject` that records what the pickle asked for and
calls nothing. :func:`pola_mm.fileio.load_checkpoint_file` uses it for the
files torch's weights-only loader refuses (e.g. the authors' training
checkpoints, which pickle a yacs ``CfgNode``).
"""
import functools
import pickle
import types
from collections import Counter, OrderedDict
from typing import (Any, Callable, Dict, Iterable, List, Mapping, NoReturn,
                    Optional, Tuple)

import _compat_pickle
import torch
from torch import Tensor

from .allow_list import (NUMPY_MULTIARRAY_MODULES, numpy_globals,
                         runner_checkpoint_safe_globals)

__all__ = ['InertObject', 'UnpicklingRefused', 'allowed_globals',
           'inert_pickle_module', 'inert_names', 'runner_checkpoint_globals',
           'runner_pickle_module']


class InertObject:
    """Inert stand-in for a pickled global outside the loader's allow-list.

    It records what the pickle asked for and never calls anything: creating,
    calling, ``__setstate__``, item assignment and ``append``/``extend`` only
    store their arguments.

    Attributes:
        inert_global (str): ``'module.name'`` the pickle referred to
            (``'module.name(...)'`` for the result of calling a stand-in).
        inert_args (tuple): positional arguments it was created with.
        inert_kwargs (dict): keyword arguments it was created with.
        inert_state (Any): the state the pickle passed to ``__setstate__``.
        inert_items (list): ``(key, value)`` pairs set on it (a pickled
            dict subclass, e.g. a yacs ``CfgNode``).
        inert_list (list): values appended to it (a pickled list subclass).
    """

    inert_global = '?'

    def __new__(cls, *args: Any, **kwargs: Any) -> 'InertObject':
        self = object.__new__(cls)
        self.inert_global = cls.inert_global
        self.inert_args = args
        self.inert_kwargs = kwargs
        self.inert_state = None
        self.inert_items = []
        self.inert_list = []
        return self

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        """Accepts anything; everything was recorded by ``__new__``."""

    def __call__(self, *args: Any, **kwargs: Any) -> 'InertObject':
        """Calling a stand-in gives another stand-in; nothing runs."""
        result = InertObject(*args, **kwargs)
        result.inert_global = f'{self.inert_global}(...)'
        return result

    def __setstate__(self, state: Any) -> None:
        self.inert_state = state

    def __setitem__(self, key: Any, value: Any) -> None:
        self.inert_items.append((key, value))

    def append(self, value: Any) -> None:
        """Record an appended value."""
        self.inert_list.append(value)

    def extend(self, values: Iterable) -> None:
        """Record appended values."""
        self.inert_list.extend(values)

    def __repr__(self) -> str:
        return f'<inert {self.inert_global}>'


class _SafeCallable:
    """An allow-listed callable handed to the unpickler. Its state cannot be
    set from a pickle (``BUILD`` on it is refused)."""

    __slots__ = ('_fn', '_name')

    def __init__(self, fn: Optional[Callable], name: str) -> None:
        object.__setattr__(self, '_fn', fn)
        object.__setattr__(self, '_name', name)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if self._fn is None:
            _refuse(f'{self._name} may not be called')
        return self._fn(*args, **kwargs)

    def __setstate__(self, state: Any) -> None:
        _refuse(f'refusing to set state on {self._name}')

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError(f'{self._name} is read-only')

    def __repr__(self) -> str:
        return f'<allowed {self._name}>'


# markers for the tensor types in ``_rebuild_from_type_v2``: never callable
_TENSOR_TYPES = (_SafeCallable(None, 'torch.Tensor'),
                 _SafeCallable(None, 'torch.nn.Parameter'))


class UnpicklingRefused(pickle.UnpicklingError):
    """An allow-listed global was called with arguments it does not
    accept (e.g. a tensor rebuilt by a foreign function)."""


def _refuse(what: str) -> NoReturn:
    raise UnpicklingRefused(what)


def _describe(obj: Any) -> str:
    """What a pickled object is, for an error message."""
    if isinstance(obj, InertObject) or (isinstance(obj, type) and
                                        issubclass(obj, InertObject)):
        return obj.inert_global
    if isinstance(obj, _SafeCallable):
        return obj._name
    return type(obj).__name__


def _check_storage(storage: Any) -> None:
    """Raise unless ``storage`` is a storage torch's loader produced."""
    if type(storage) is not torch.storage.TypedStorage or not isinstance(
            getattr(storage, '_untyped_storage', None), torch.UntypedStorage):
        _refuse(f'a tensor is rebuilt from {_describe(storage)}, not from a '
                'storage')


def _check_ints(*values: Any) -> None:
    for value in values:
        items = value if isinstance(value, (tuple, list)) else (value, )
        if not all(type(v) is int for v in items):
            _refuse(f'tensor geometry {_describe(value)} is not made of ints')


def _rebuild_tensor(storage: Any, storage_offset: int, size: Tuple[int, ...],
                    stride: Tuple[int, ...]) -> Tensor:
    """``torch._utils._rebuild_tensor`` with its arguments checked."""
    _check_storage(storage)
    _check_ints(storage_offset, size, stride)
    return torch._utils._rebuild_tensor(storage, storage_offset, tuple(size),
                                        tuple(stride))


def _set_metadata(tensor: Tensor, metadata: Any) -> Tensor:
    """Apply torch's tensor metadata (conj / neg bits): ``{str: bool}``."""
    if metadata:
        if not isinstance(metadata, dict) or not all(
                type(k) is str and type(v) is bool
                for k, v in metadata.items()):
            _refuse('tensor metadata is not a {str: bool} dict')
        torch._C._set_tensor_metadata(tensor, metadata)
    return tensor


def _rebuild_tensor_v2(storage: Any, storage_offset: int, size: Any,
                       stride: Any, requires_grad: Any, backward_hooks: Any,
                       metadata: Any = None) -> Tensor:
    """``torch._utils._rebuild_tensor_v2`` without grad or hooks."""
    return _set_metadata(
        _rebuild_tensor(storage, storage_offset, size, stride), metadata)


def _rebuild_tensor_v3(storage: Any, storage_offset: int, size: Any,
                       stride: Any, requires_grad: Any, backward_hooks: Any,
                       dtype: Any, metadata: Any = None) -> Tensor:
    """``torch._utils._rebuild_tensor_v3`` without grad or hooks."""
    _check_storage(storage)
    _check_ints(storage_offset, size, stride)
    if not isinstance(dtype, torch.dtype):
        _refuse(f'tensor dtype {_describe(dtype)} is not a torch.dtype')
    tensor = torch.empty((0, ), dtype=dtype,
                         device=storage._untyped_storage.device)
    tensor.set_(storage._untyped_storage, storage_offset, tuple(size),
                tuple(stride))
    return _set_metadata(tensor, metadata)


def _rebuild_parameter(data: Any, requires_grad: Any, backward_hooks: Any,
                       state: Any = None) -> Tensor:
    """A pickled ``nn.Parameter``: its data, as a plain tensor."""
    if type(data) is not torch.Tensor:
        _refuse(f'a parameter holds {_describe(data)}, not a tensor')
    return data


_REBUILDERS = {
    '_rebuild_tensor': _SafeCallable(_rebuild_tensor, '_rebuild_tensor'),
    '_rebuild_tensor_v2': _SafeCallable(_rebuild_tensor_v2,
                                        '_rebuild_tensor_v2'),
    '_rebuild_tensor_v3': _SafeCallable(_rebuild_tensor_v3,
                                        '_rebuild_tensor_v3'),
}


def _rebuild_from_type_v2(func: Any, new_type: Any, args: Any,
                          state: Any) -> Tensor:
    """``torch._tensor._rebuild_from_type_v2`` for plain tensors and
    parameters only (``func`` one of the allowed rebuild functions); the
    result stays a plain tensor and ``state`` is not applied."""
    if not any(func is f for f in _REBUILDERS.values()) or not any(
            new_type is t for t in _TENSOR_TYPES) or type(args) is not tuple:
        _refuse(f'a tensor is rebuilt by {_describe(func)} as '
                f'{_describe(new_type)}')
    return func(*args)


def _encode_latin1(text: Any, encoding: Any = 'latin1') -> bytes:
    """``_codecs.encode`` as protocol-2 pickles use it for bytes."""
    if type(text) is not str or encoding not in ('latin1', 'latin-1'):
        _refuse('_codecs.encode is only allowed on (str, "latin1")')
    return text.encode('latin-1')


def _numpy_globals() -> Dict[Tuple[str, str], Any]:
    """:func:`~pola_mm.fileio.allow_list.numpy_globals` with the array and
    scalar constructors checked: a plain ``ndarray`` only, a real
    ``numpy.dtype`` only."""
    table = numpy_globals()
    if not table:  # pragma: no cover - numpy comes with torch
        return table
    import numpy as np
    reconstruct_fn = table[NUMPY_MULTIARRAY_MODULES[0], '_reconstruct']
    scalar_fn = table[NUMPY_MULTIARRAY_MODULES[0], 'scalar']

    def reconstruct(subtype: Any, shape: Any, dtype: Any) -> Any:
        if subtype is not np.ndarray:
            _refuse(f'a numpy array of type {_describe(subtype)}')
        return reconstruct_fn(np.ndarray, shape, dtype)

    def scalar(dtype: Any, *data: Any) -> Any:
        if not isinstance(dtype, np.dtype):
            _refuse(f'a numpy scalar of dtype {_describe(dtype)}')
        return scalar_fn(dtype, *data)

    for module in NUMPY_MULTIARRAY_MODULES:
        table[module, '_reconstruct'] = _SafeCallable(
            reconstruct, 'numpy _reconstruct')
        table[module, 'scalar'] = _SafeCallable(scalar, 'numpy scalar')
    return table


@functools.lru_cache(maxsize=None)
def allowed_globals() -> Dict[Tuple[str, str], Any]:
    """The allow-list: ``(module, name) -> object`` handed to the pickle."""
    table: Dict[Tuple[str, str], Any] = {
        ('collections', 'OrderedDict'): OrderedDict,
        ('builtins', 'set'): set,
        ('builtins', 'frozenset'): frozenset,
        ('builtins', 'complex'): complex,
        ('builtins', 'slice'): slice,
        ('builtins', 'bytes'): bytes,
        ('builtins', 'bytearray'): bytearray,
        ('_codecs', 'encode'): _SafeCallable(_encode_latin1, '_codecs.encode'),
        ('torch', 'Size'): torch.Size,
        ('torch', 'device'): torch.device,
        ('torch', 'UntypedStorage'): torch.UntypedStorage,
        ('torch', 'Tensor'): _TENSOR_TYPES[0],
        ('torch._tensor', 'Tensor'): _TENSOR_TYPES[0],
        ('torch.nn.parameter', 'Parameter'): _TENSOR_TYPES[1],
        ('torch._tensor', '_rebuild_from_type_v2'): _SafeCallable(
            _rebuild_from_type_v2, '_rebuild_from_type_v2'),
        ('torch._utils', '_rebuild_parameter'): _SafeCallable(
            _rebuild_parameter, '_rebuild_parameter'),
        ('torch._utils', '_rebuild_parameter_with_state'): _SafeCallable(
            _rebuild_parameter, '_rebuild_parameter_with_state'),
    }
    for name, fn in _REBUILDERS.items():
        table['torch._utils', name] = fn
    for name in dir(torch):
        value = getattr(torch, name, None)
        if isinstance(value, torch.dtype):
            table['torch', name] = value
    table.update(_numpy_globals())
    return table


def _pickle_module(name: str, table: Mapping[Tuple[str, str], Any],
                   other: Callable[[str], Any]) -> types.ModuleType:
    """A ``pickle_module`` for ``torch.load`` whose unpickler resolves the
    globals of ``table`` and hands every other ``'module.name'`` to
    ``other`` (which returns a stand-in or raises)."""

    class Unpickler(pickle.Unpickler):

        def find_class(self, module: str, name: str) -> Any:
            if (module, name) in _compat_pickle.NAME_MAPPING:
                module, name = _compat_pickle.NAME_MAPPING[module, name]
            else:
                module = _compat_pickle.IMPORT_MAPPING.get(module, module)
            allowed = table.get((module, name))
            if allowed is not None:
                return allowed
            return other(f'{module}.{name}')

    def load(file: Any, **kwargs: Any) -> Any:
        return Unpickler(file, **kwargs).load()

    module = types.ModuleType(name)
    module.Unpickler = Unpickler
    module.load = load
    module.UnpicklingError = pickle.UnpicklingError
    return module


def inert_pickle_module(record: Dict[str, int]) -> types.ModuleType:
    """A ``pickle_module`` for ``torch.load`` whose unpickler resolves only
    allow-listed globals; every other global becomes an :class:`InertObject`
    subclass (counted in ``record``), so loading executes nothing."""
    classes: Dict[str, type] = {}

    def stand_in(qualname: str) -> type:
        record[qualname] = record.get(qualname, 0) + 1
        if qualname not in classes:
            classes[qualname] = type('InertObject', (InertObject, ), {
                'inert_global': qualname,
                '__module__': __name__,
                '__qualname__': 'InertObject'
            })
        return classes[qualname]

    return _pickle_module('pola_mm_inert_pickle', allowed_globals(),
                          stand_in)


@functools.lru_cache(maxsize=None)
def runner_checkpoint_globals() -> Dict[Tuple[str, str], Any]:
    """:func:`allowed_globals` plus what an mmengine Runner checkpoint needs
    beyond it: ``collections.Counter`` (which torch's own weights-only list
    holds from 2.4 on) and, from pola_mm's one allow-list
    (:func:`~pola_mm.fileio.allow_list.runner_checkpoint_safe_globals`),
    ``HistoryBuffer`` and the ``getattr`` stand-in that hands out its
    statistics methods only. numpy keeps the checked constructors of
    :func:`allowed_globals`."""
    table = dict(allowed_globals())
    # in torch's own weights-only list (>= 2.4), not in 2.1's: the
    # milestones of mmengine's MultiStepParamScheduler
    table['collections', 'Counter'] = Counter
    for entry in runner_checkpoint_safe_globals():
        obj, qualname = entry if isinstance(entry, tuple) else (
            entry, f'{entry.__module__}.{entry.__qualname__}')
        module, name = qualname.rsplit('.', 1)
        if (module, name) not in table:
            table[module, name] = obj if isinstance(obj, type) else \
                _SafeCallable(obj, qualname)
    return table


def runner_pickle_module() -> types.ModuleType:
    """A ``pickle_module`` for ``torch.load`` that reads what torch's
    weights-only loader reads once :mod:`pola_mm.compat` has extended it
    (:func:`runner_checkpoint_globals`) and refuses every other global
    (:class:`UnpicklingRefused`, ``Unsupported global: GLOBAL module.name``,
    as torch words it): nothing outside the allow-list is resolved or run.

    For a torch whose weights-only loader takes no allow-list (< 2.4, no
    ``torch.serialization.add_safe_globals``), where
    :func:`pola_mm.fileio.load_checkpoint_file` reads Runner checkpoints
    with it."""

    def refuse(qualname: str) -> NoReturn:
        _refuse(f'Unsupported global: GLOBAL {qualname}')

    return _pickle_module('pola_mm_runner_pickle', runner_checkpoint_globals(),
                          refuse)


def inert_names(obj: Any, limit: int = 100000) -> List[str]:
    """``module.name`` of every :class:`InertObject` reachable in ``obj``."""
    found: Dict[str, None] = OrderedDict()
    seen = set()
    todo = [obj]
    while todo and len(seen) < limit:
        item = todo.pop()
        if id(item) in seen:
            continue
        seen.add(id(item))
        if isinstance(item, InertObject):
            found[item.inert_global.split('(')[0]] = None
            todo.extend([item.inert_args, item.inert_kwargs, item.inert_state,
                         item.inert_items, item.inert_list])
        elif isinstance(item, Mapping):
            todo.extend(item.keys())
            todo.extend(item.values())
        elif isinstance(item, (list, tuple, set, frozenset)):
            todo.extend(item)
    return list(found)
