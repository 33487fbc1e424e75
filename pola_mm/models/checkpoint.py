"""Checkpoint conversion (authors' layout -> pola_mm) and pretrained loading.

The authors' classifiers (``{'model': state_dict}``) use the same module
names as pola_mm's backbones, so conversion is a prefix rename:

- every backbone key gets ``backbone.``; ``head.*`` becomes ``head.fc.*``
  (mmpretrain ``LinearClsHead``);
- Pola-Swin's final ``norm.*`` becomes ``backbone.norm3.*`` (the output norm
  of the last stage);
- Pola-PVT's final ``norm.*`` is dropped: the published classifier never
  applies it;
- the recomputed buffers ``relative_position_index`` and ``attn_mask`` are
  dropped;
- PolaPP (PolaFormer++) keeps every name; its recomputed rotary buffers
  ``layers.i.RoPE.angle`` / ``RoPE_linear.angle`` are dropped. The authors'
  ImageNet classifier (``POLA_b*``) ends in ``proj`` (1x1 conv), ``norm``
  (BatchNorm) and a 1x1-conv ``head``: ``proj.*`` / ``norm.*`` become
  ``neck.proj.*`` / ``neck.norm.*`` (pola_mm's ``PolaPPClsNeck``) and the
  head's ``(classes, P, 1, 1)`` weight becomes
  ``head.fc.weight`` ``(classes, P)``. A backbone loading such a file keeps
  only ``backbone.*`` (the classifier's ``extra_norms`` do not exist and
  start fresh, as in the authors' downstream code).

Every file pola_mm reads for weights goes through
:func:`load_checkpoint_file`: ``torch.load(weights_only=True)`` first, and for
files torch refuses (the authors' training checkpoints pickle a yacs
``CfgNode``) a restricted unpickler that resolves only an allow-list of
globals and turns every other one into an inert :class:`InertObject`, so no
code from the file ever runs.
"""
import _compat_pickle
import functools
import os
import os.path as osp
import pickle
import re
import tarfile
import types
import zipfile
from collections import OrderedDict
from itertools import zip_longest
from typing import (Any, BinaryIO, Callable, Dict, Iterable, List, Mapping,
                    NoReturn, Optional, Tuple)

import torch
from mmengine.logging import print_log
from torch import Tensor

SWIN_SENTINEL = 'patch_embed.proj.weight'
PVT_SENTINEL = 'patch_embed1.proj.weight'
POLAPP_SENTINEL = 'patch_embed.proj.0.weight'  # PolaPP's conv stem
_POLAPP_ROPE = re.compile(r'^layers\.\d+\.(RoPE|RoPE_linear)\.angle$')
_DROPPED_BUFFERS = ('relative_position_index', 'attn_mask')
_POLA_ONLY = re.compile(r'^norm[0-3]\.')


def official_family(state_dict: Mapping[str, Tensor]) -> Optional[str]:
    """``'swin'`` / ``'pvt'`` / ``'polapp'`` for a state dict in the
    authors' layout, else ``None``.

    The authors' layout is recognised by its sentinel key
    (``patch_embed.proj.weight`` for Swin, ``patch_embed1.proj.weight`` for
    PVT, ``patch_embed.proj.0.weight`` for PolaPP), no ``backbone.`` prefix
    and none of pola_mm's output norms ``norm0..3``.
    """
    keys = list(state_dict.keys())
    if any(k.startswith('backbone.') for k in keys):
        return None
    if any(_POLA_ONLY.match(k) for k in keys):
        return None
    if SWIN_SENTINEL in state_dict:
        return 'swin'
    if PVT_SENTINEL in state_dict:
        return 'pvt'
    if POLAPP_SENTINEL in state_dict:
        return 'polapp'
    return None


def is_polapp_classifier(state_dict: Mapping[str, Tensor]) -> bool:
    """Whether ``state_dict`` is the authors' PolaPP ImageNet classifier
    (``POLA_b*``: the PolaPP layout with its ``proj`` 1x1 conv and ``head``)
    rather than their detection / segmentation backbone."""
    return official_family(state_dict) == 'polapp' and \
        'proj.weight' in state_dict and 'head.weight' in state_dict


def convert_official_checkpoint(
        state_dict: Mapping[str, Tensor]) -> 'OrderedDict[str, Tensor]':
    """Convert the authors' state dict to mmpretrain's classifier layout.

    Safe to run twice: a dict that is not in the authors' layout (e.g.
    already converted) is returned unchanged (as a new OrderedDict).

    Args:
        state_dict: the authors' ``checkpoint['model']``.

    Returns:
        ``backbone.*`` + ``head.fc.*`` keys (PolaPP classifiers also
        ``neck.*``), tensors unchanged but for the PolaPP 1x1-conv head
        weight, flattened to ``(classes, P)``.
    """
    family = official_family(state_dict)
    if family is None:
        return OrderedDict(state_dict)
    out: 'OrderedDict[str, Tensor]' = OrderedDict()
    for key, value in state_dict.items():
        if key.rsplit('.', 1)[-1] in _DROPPED_BUFFERS or (
                family == 'polapp' and _POLAPP_ROPE.match(key)):
            continue
        if key.startswith('head.'):
            if family == 'polapp' and value.dim() == 4:  # 1x1 conv head
                value = value.flatten(1)
            out['head.fc.' + key[len('head.'):]] = value
        elif family == 'polapp' and key.startswith(('proj.', 'norm.')):
            out['neck.' + key] = value  # the classifier's PolaPPClsNeck
        elif key.startswith('norm.'):
            if family == 'swin':
                out['backbone.norm3.' + key[len('norm.'):]] = value
            # PVT: the published forward does not apply the final norm.
        else:
            out['backbone.' + key] = value
    return out


def backbone_state_dict(
        state_dict: Mapping[str, Tensor]) -> 'OrderedDict[str, Tensor]':
    """Backbone-only keys of a state dict, without the ``backbone.`` prefix.

    Accepts the authors' layout (converted first), a classifier / detector
    checkpoint (``backbone.*`` kept, everything else dropped) or a plain
    backbone state dict (returned as is).
    """
    sd = convert_official_checkpoint(state_dict)
    if any(k.startswith('backbone.') for k in sd):
        return OrderedDict((k[len('backbone.'):], v) for k, v in sd.items()
                           if k.startswith('backbone.'))
    return OrderedDict(sd)


def extract_state_dict(checkpoint: Mapping) -> Mapping[str, Tensor]:
    """The state dict inside a loaded checkpoint file (``state_dict``,
    ``model`` or ``module`` entry, else the mapping itself)."""
    for name in ('state_dict', 'model', 'module'):
        if isinstance(checkpoint, Mapping) and name in checkpoint and \
                isinstance(checkpoint[name], Mapping):
            return checkpoint[name]
    return checkpoint


# ---------------------------------------------------------------------------
# Safe loading of checkpoint files
# ---------------------------------------------------------------------------
class CheckpointFileError(ValueError):
    """A checkpoint file that cannot be read; the message names the file and
    what is wrong with it."""


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


class _Refused(pickle.UnpicklingError):
    """An allow-listed global was called with arguments it does not
    accept (e.g. a tensor rebuilt by a foreign function)."""


def _refuse(what: str) -> NoReturn:
    raise _Refused(what)


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
    """numpy arrays, dtypes and scalars (numpy 1.x and 2.x module names)."""
    try:
        import numpy as np
    except ImportError:  # pragma: no cover - numpy comes with torch
        return {}
    core = getattr(np, '_core', None) or np.core
    multiarray = core.multiarray

    def reconstruct(subtype: Any, shape: Any, dtype: Any) -> Any:
        if subtype is not np.ndarray:
            _refuse(f'a numpy array of type {_describe(subtype)}')
        return multiarray._reconstruct(np.ndarray, shape, dtype)

    def scalar(dtype: Any, *data: Any) -> Any:
        if not isinstance(dtype, np.dtype):
            _refuse(f'a numpy scalar of dtype {_describe(dtype)}')
        return multiarray.scalar(dtype, *data)

    table: Dict[Tuple[str, str], Any] = {
        ('numpy', 'ndarray'): np.ndarray,
        ('numpy', 'dtype'): np.dtype,
    }
    for module in ('numpy.core.multiarray', 'numpy._core.multiarray'):
        table[module, '_reconstruct'] = _SafeCallable(
            reconstruct, 'numpy _reconstruct')
        table[module, 'scalar'] = _SafeCallable(scalar, 'numpy scalar')
    dtypes = getattr(np, 'dtypes', None)
    for name in dir(dtypes) if dtypes is not None else ():
        value = getattr(dtypes, name)
        if isinstance(value, type) and issubclass(value, np.dtype):
            table['numpy.dtypes', name] = value
    return table


@functools.lru_cache(maxsize=None)
def _allowed_globals() -> Dict[Tuple[str, str], Any]:
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


def _inert_pickle_module(record: Dict[str, int]) -> types.ModuleType:
    """A ``pickle_module`` for ``torch.load`` whose unpickler resolves only
    allow-listed globals; every other global becomes an :class:`InertObject`
    subclass (counted in ``record``), so loading executes nothing."""
    classes: Dict[str, type] = {}

    class Unpickler(pickle.Unpickler):

        def find_class(self, module: str, name: str) -> Any:
            if (module, name) in _compat_pickle.NAME_MAPPING:
                module, name = _compat_pickle.NAME_MAPPING[module, name]
            else:
                module = _compat_pickle.IMPORT_MAPPING.get(module, module)
            allowed = _allowed_globals().get((module, name))
            if allowed is not None:
                return allowed
            qualname = f'{module}.{name}'
            record[qualname] = record.get(qualname, 0) + 1
            if qualname not in classes:
                classes[qualname] = type('InertObject', (InertObject, ), {
                    'inert_global': qualname,
                    '__module__': __name__,
                    '__qualname__': 'InertObject'
                })
            return classes[qualname]

    def load(file: Any, **kwargs: Any) -> Any:
        return Unpickler(file, **kwargs).load()

    module = types.ModuleType('pola_mm_inert_pickle')
    module.Unpickler = Unpickler
    module.load = load
    module.UnpicklingError = pickle.UnpicklingError
    return module


def _file_kind(f: BinaryIO) -> str:
    """What an open binary file holds: ``'zip'`` (torch.save),
    ``'torchscript'``, ``'zip-not-torch'``, ``'broken-zip'``, ``'tar'``,
    ``'legacy'`` (torch < 1.6 pickle stream), ``'empty'`` or ``'unknown'``.
    Leaves ``f`` at its start."""
    head = f.read(4)
    f.seek(0)
    try:
        if not head:
            return 'empty'
        if head.startswith(b'PK'):
            try:
                with zipfile.ZipFile(f) as archive:
                    records = [n.split('/', 1)[-1]
                               for n in archive.namelist()]
            except (zipfile.BadZipFile, OSError, ValueError):
                return 'broken-zip'
            if 'constants.pkl' in records:
                return 'torchscript'
            return 'zip' if 'data.pkl' in records else 'zip-not-torch'
        if tarfile.is_tarfile(f):
            return 'tar'
        return 'legacy' if head[:1] == b'\x80' else 'unknown'
    finally:
        f.seek(0)


_KIND_ERRORS = {
    'empty': 'the file is empty',
    'broken-zip': 'truncated or corrupt: it starts like a torch.save zip '
    'archive but has no readable central directory (an interrupted '
    'download?)',
    'torchscript': 'a TorchScript archive, not a checkpoint; pola_mm never '
    'runs TorchScript code (save the model\'s state_dict() instead)',
    'zip-not-torch': 'a zip archive without data.pkl, not written by '
    'torch.save',
    'tar': 'in the legacy tar format of PyTorch < 0.4, which pola_mm does not '
    'read (re-save it with a current torch)',
}


def _local_path(filename: str) -> Tuple[str, Optional[Callable[[], None]]]:
    """A local path for ``filename`` (a path or URL) and an optional
    clean-up. http(s) files are downloaded once into torch's hub cache
    (as mmengine does); other schemes go through mmengine's file backends."""
    if not isinstance(filename, (str, os.PathLike)):
        raise TypeError(f'checkpoint must be a path or URL, got {filename!r}')
    filename = os.fspath(filename)
    if filename.startswith(('http://', 'https://')):
        from urllib.parse import urlparse
        cache = osp.join(torch.hub.get_dir(), 'checkpoints')
        os.makedirs(cache, exist_ok=True)
        path = osp.join(cache, osp.basename(urlparse(filename).path))
        if not osp.isfile(path):
            print_log(f'pola_mm: downloading {filename} to {path}',
                      logger='current')
            torch.hub.download_url_to_file(filename, path, progress=False)
        return path, None
    if '://' in filename:
        from mmengine.fileio import get_local_path
        context = get_local_path(filename)
        return context.__enter__(), lambda: context.__exit__(None, None, None)
    return filename, None


def _weights_key(checkpoint: Mapping) -> Optional[str]:
    """The entry :func:`extract_state_dict` takes the weights from."""
    for name in ('state_dict', 'model', 'module'):
        if name in checkpoint and isinstance(checkpoint[name], Mapping):
            return name
    return None


def _inert_names(obj: Any, limit: int = 100000) -> List[str]:
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


def load_checkpoint_file(filename: str,
                         map_location: Any = 'cpu',
                         allow_inert: bool = True) -> Dict[str, Any]:
    """Load a checkpoint file without ever running code from it.

    First ``torch.load(weights_only=True)``. If torch refuses the file (e.g.
    the authors' training checkpoints, which pickle their yacs ``CfgNode``
    under ``'config'``), it is read again by an unpickler that resolves only
    an allow-list (tensor rebuilding, storages, ``OrderedDict``, numpy
    arrays and scalars, a few builtins) and turns every other global into an
    :class:`InertObject`: such entries come back as inert data and are never
    used; the weights (``'state_dict'``, ``'model'`` or ``'module'``, else
    the top level) must be tensors. One log line names the inert entries.

    Args:
        filename: a local path, an http(s) URL (cached in torch's hub
            directory) or another mmengine file-backend URI.
        map_location: as for ``torch.load``.
        allow_inert: if False, a file that ``torch.load(weights_only=True)``
            refuses is refused (:class:`CheckpointFileError`) instead of
            being read inertly (``tools/train.py``: a checkpoint to resume
            from must be a Runner checkpoint, which loads weights-only).

    Returns:
        The checkpoint mapping; take the weights with
        :func:`extract_state_dict`.

    Raises:
        FileNotFoundError: no such file.
        CheckpointFileError: not a checkpoint, truncated or corrupt, or its
            weights are not a ``{name: tensor}`` mapping.
    """
    path, cleanup = _local_path(filename)
    try:
        return _load_file(path, str(filename), map_location, allow_inert)
    finally:
        if cleanup is not None:
            cleanup()


def _load_file(path: str, filename: str, map_location: Any,
               allow_inert: bool = True) -> Dict[str, Any]:
    """:func:`load_checkpoint_file` of a local ``path``."""
    if not osp.isfile(path):
        raise FileNotFoundError(f'checkpoint {filename}: no such file')
    if path.endswith('.safetensors'):  # no pickle in this format
        try:
            checkpoint = torch.load(path, map_location=map_location,
                                    weights_only=True)
        except Exception as err:
            raise CheckpointFileError(
                f'checkpoint {filename}: cannot be read '
                f'({type(err).__name__}: {_first_line(err)})') from None
        return _checked(checkpoint, filename, None)
    # one open file for the checks and the loads
    with open(path, 'rb') as f:
        kind = _file_kind(f)
        if kind in _KIND_ERRORS:
            raise CheckpointFileError(f'checkpoint {filename}: '
                                      f'{_KIND_ERRORS[kind]}')
        if kind == 'unknown':
            raise CheckpointFileError(
                f'checkpoint {filename}: not a PyTorch checkpoint (it starts '
                f'with {f.read(8)!r}; torch.save writes a zip archive)')
        try:
            return _checked(
                torch.load(f, map_location=map_location, weights_only=True),
                filename, None)
        except CheckpointFileError:
            raise
        except Exception as err:  # refused by the weights-only unpickler
            if not allow_inert:
                _refuse_weights_only(filename, err)
            f.seek(0)
        record: Dict[str, int] = {}
        try:
            checkpoint = torch.load(
                f, map_location=map_location, weights_only=False,
                pickle_module=_inert_pickle_module(record))
        except _Refused as err:
            raise CheckpointFileError(
                f'checkpoint {filename}: refused: {err} (pola_mm reads plain '
                'tensors and data only; nothing in the file was run)'
            ) from None
        except Exception as err:
            raise CheckpointFileError(
                f'checkpoint {filename}: cannot be read '
                f'({type(err).__name__}: {_first_line(err)}); is it '
                'truncated, corrupt or not a PyTorch checkpoint?') from None
    return _checked(checkpoint, filename, record)


def _refuse_weights_only(filename: str, err: BaseException) -> NoReturn:
    """The error for a file that weights-only loading cannot read, when
    the inert fallback is not allowed."""
    if isinstance(err, pickle.UnpicklingError):
        # torch's message: "Weights only load failed ... Unsupported global:
        # GLOBAL module.name ..."; keep the global it names
        found = re.search(r'(?:Unsupported global|GLOBAL)[:\s]+(?:GLOBAL\s+)?'
                          r'([\w.]+)', str(err))
        what = f'it pickles {found.group(1)}' if found else _first_line(err)
        raise CheckpointFileError(
            f'checkpoint {filename}: refused: {what}, which weights-only '
            'loading does not allow (nothing in the file was run); a Runner '
            'checkpoint written by tools/train.py holds only tensors, numbers '
            'and mmengine log buffers') from None
    raise CheckpointFileError(
        f'checkpoint {filename}: cannot be read ({type(err).__name__}: '
        f'{_first_line(err)}); is it truncated, corrupt or not a PyTorch '
        'checkpoint?') from None


def _checked(checkpoint: Any, filename: str,
             record: Optional[Dict[str, int]]) -> Dict[str, Any]:
    """Check that a loaded checkpoint holds ``{name: tensor}`` weights; for
    an inert load (``record`` of the stand-in globals), detach the weights
    and log what was kept as inert data."""
    if not isinstance(checkpoint, Mapping):
        what = checkpoint.inert_global if isinstance(
            checkpoint, InertObject) else type(checkpoint).__name__
        raise CheckpointFileError(
            f'checkpoint {filename}: holds a pickled {what}, not a checkpoint '
            'dict; pola_mm loads state dicts only (save '
            'model.state_dict())')
    key = _weights_key(checkpoint)
    weights = checkpoint[key] if key is not None else checkpoint
    for name, value in weights.items():
        if type(name) is not str or not isinstance(value, Tensor):
            what = value.inert_global if isinstance(
                value, InertObject) else type(value).__name__
            where = f'{key!r} entry {name!r}' if key else f'entry {name!r}'
            raise CheckpointFileError(
                f'checkpoint {filename}: {where} is not a tensor but {what}; '
                "expected a 'state_dict', 'model' or 'module' entry mapping "
                'names to tensors (or such a mapping at the top level), got '
                f'entries {_summarise([str(k) for k in checkpoint])}')
    if record is None:
        return checkpoint
    clean: 'OrderedDict[str, Tensor]' = OrderedDict(
        (name, value.detach()) for name, value in weights.items())
    if key is None:
        checkpoint = clean
    else:
        checkpoint = dict(checkpoint)
        checkpoint[key] = clean
    inert = [f'{k!r} ({", ".join(names)})' for k, names in (
        (k, _inert_names(v)) for k, v in checkpoint.items() if k != key)
        if names]
    if not inert and record:
        inert = [f'stand-ins for {", ".join(sorted(record))}']
    source = repr(key) if key is not None else 'the top level'
    print_log(
        f'pola_mm: {filename}: torch.load(weights_only=True) refuses this '
        "file; read it with pola_mm's restricted unpickler, which executes "
        'nothing. Loaded as inert data and not used: '
        f'{"; ".join(inert) or "nothing"}; weights taken from {source}.',
        logger='current')
    return checkpoint


def _first_line(err: BaseException) -> str:
    """The first non-empty line of an exception message."""
    lines = [ln.strip() for ln in str(err).splitlines() if ln.strip()]
    return lines[0] if lines else ''


def load_pretrained(module: torch.nn.Module,
                    checkpoint: str,
                    expected_missing: Callable[[str], bool],
                    expected_unexpected: Callable[[str], bool],
                    expected_checkpoint: str,
                    prefix: Optional[str] = None) -> None:
    """Load a pretrained checkpoint into a backbone, strictly.

    The file may be an authors' checkpoint, a converted mmpretrain
    classifier, a detector/segmentor checkpoint or a plain backbone state
    dict. Everything is validated before any weight is copied, so a
    checkpoint that does not fit leaves the module untouched.

    Args:
        module: the backbone.
        checkpoint: path or URL (read with :func:`load_checkpoint_file`).
        expected_missing: predicate for module keys that may be absent
            (e.g. new output norms).
        expected_unexpected: predicate for checkpoint keys that are fine to
            ignore (stages not built, the authors' unused norm).
        expected_checkpoint: text naming what the module expects, for the
            error message.
        prefix: optional prefix (e.g. ``'backbone.'``) to select and strip.

    Raises:
        ValueError: missing, unexpected or shape-mismatched keys.
    """
    is_remote = '://' in str(checkpoint)
    if not is_remote and not osp.isfile(checkpoint):
        raise FileNotFoundError(
            f'Pretrained checkpoint {checkpoint!r} not found (relative to '
            f'{os.getcwd()!r}). Put the ImageNet weights there (the authors\' '
            'release or a file converted by '
            'tools/model_converters/pola_official_to_mm.py), point '
            'model.backbone.init_cfg.checkpoint at them, or train from '
            'scratch with --cfg-options model.backbone.init_cfg=None.')
    ckpt = load_checkpoint_file(checkpoint, map_location='cpu')
    sd = extract_state_dict(ckpt)
    if prefix:
        if not prefix.endswith('.'):
            prefix += '.'
        sd = OrderedDict((k[len(prefix):], v) for k, v in sd.items()
                         if k.startswith(prefix))
    family = official_family(sd)
    classifier = is_polapp_classifier(sd)
    converted = convert_official_checkpoint(sd)
    others = ([k for k in converted if not k.startswith('backbone.')]
              if any(k.startswith('backbone.') for k in converted) else [])
    sd = backbone_state_dict(converted)
    if not sd:
        raise ValueError(
            f'{type(module).__name__}: checkpoint {checkpoint!r} holds no '
            f'backbone weights. Expected {expected_checkpoint}.')
    own = module.state_dict()
    resized = adapt_pos_tables(sd, module)
    missing = [k for k in own if k not in sd]
    unexpected = [k for k in sd if k not in own]
    mismatched = [
        f'{k}: checkpoint {tuple(sd[k].shape)} vs model {tuple(own[k].shape)}'
        for k in own if k in sd and tuple(sd[k].shape) != tuple(own[k].shape)
    ]
    bad_missing = [k for k in missing if not expected_missing(k)]
    bad_unexpected = [k for k in unexpected if not expected_unexpected(k)]
    if bad_missing or bad_unexpected or mismatched:
        matched = len(own) - len(missing) - len(mismatched)
        # a few of each kind, interleaved
        kinds = [[f'missing {k}' for k in bad_missing],
                 [f'unexpected {k}' for k in bad_unexpected], mismatched]
        problems = [p for group in zip_longest(*kinds) for p in group
                    if p is not None]
        raise ValueError(
            f'{type(module).__name__}: checkpoint {checkpoint!r} does not fit '
            f'this backbone: {matched} of {len(own)} keys matched; '
            f'{len(bad_missing)} missing, {len(bad_unexpected)} unexpected, '
            f'{len(mismatched)} with another shape, e.g. '
            f'{"; ".join(problems[:5])}. Expected {expected_checkpoint}.')
    module.load_state_dict(
        OrderedDict((k, v) for k, v in sd.items() if k in own), strict=False)
    notes: List[str] = []
    if missing:
        notes.append(f'not in checkpoint (kept initialised): '
                     f'{_summarise(missing)}')
    if unexpected:
        notes.append(f'ignored: {_summarise(unexpected)}')
    if resized:
        notes.append(f'position tables resized: {_summarise(resized)}')
    if others:
        notes.append(f'non-backbone keys ignored: {_summarise(others)}')
    if family == 'pvt':
        notes.append("the authors' final PVT norm is unused by the published "
                     'forward and was dropped')
    if classifier:
        new = [k for k in missing if k.startswith('extra_norms.')]
        notes.append(
            "the authors' PolaPP ImageNet classifier: its classification-only "
            'proj / norm / head were dropped' +
            (' and the output norms extra_norms.* start fresh'
             if new else '') + " (as the authors' downstream code loads it)")
    if isinstance(ckpt, Mapping) and 'state_dict_ema' in ckpt and \
            _weights_key(ckpt) == 'model':
        notes.append("weights from 'model' (the raw weights, as the authors' "
                     "downstream code), not 'state_dict_ema'")
    print_log(
        f'{type(module).__name__}: loaded {len(own) - len(missing)}/{len(own)}'
        f' tensors from {checkpoint}' +
        ('; ' + '; '.join(notes) if notes else ''),
        logger='current')


def adapt_pos_tables(state_dict: Dict[str, Tensor],
                     module: torch.nn.Module) -> List[str]:
    """Resize learned token tables of another pre-training size, in place.

    ``positional_encoding`` (of a :class:`PolarityAttention`, grid
    ``ref_hw``) and PVT's ``pos_embed{i}`` (grid ``module.ref_grids[i-1]``)
    whose checkpoint version has the same channels but another (square) token
    count are resized by bicubic interpolation to the module's grid, e.g. to
    fine-tune a 224 checkpoint at 384; Swin's ``relative_position_bias_table``
    of another window is cropped to the offsets of a smaller window or
    bicubic-resized for a larger one. Anything else is left for the shape
    check.

    Returns:
        The keys that were resized.
    """
    from .layers.polarity_attention import resize_pos_table
    own = module.state_dict()
    done = []
    for key, value in list(state_dict.items()):
        if key not in own or own[key].shape == value.shape:
            continue
        name = key.rsplit('.', 1)[-1]
        if name == 'relative_position_bias_table':
            table = _adapt_bias_table(value, own[key].shape)
            if table is not None:
                state_dict[key] = table
                done.append(key)
            continue
        if value.dim() != 3 or own[key].dim() != 3 or \
                value.shape[-1] != own[key].shape[-1]:
            continue
        grid = None
        if name == 'positional_encoding':
            grid = getattr(module.get_submodule(key.rsplit('.', 1)[0]),
                           'ref_hw', None)
        elif re.fullmatch(r'pos_embed\d+', name) and \
                hasattr(module, 'ref_grids'):
            grid = module.ref_grids[int(name[len('pos_embed'):]) - 1]
        side = int(round(value.shape[1]**0.5))
        if grid is None or side * side != value.shape[1]:
            continue
        state_dict[key] = resize_pos_table(value, (side, side), grid)
        done.append(key)
    return done


def _adapt_bias_table(table: Tensor, shape: torch.Size) -> Optional[Tensor]:
    """``((2w-1)^2, h)`` table -> ``((2w'-1)^2, h)``: the centre (the exact
    offsets of the smaller window) when shrinking, bicubic when growing."""
    if table.dim() != 2 or len(shape) != 2 or table.shape[1] != shape[1]:
        return None
    s1 = int(round(table.shape[0]**0.5))
    s2 = int(round(shape[0]**0.5))
    if s1 * s1 != table.shape[0] or s2 * s2 != shape[0]:
        return None
    grid = table.t().reshape(1, -1, s1, s1)
    if s2 <= s1:
        c = (s1 - s2) // 2
        grid = grid[:, :, c:c + s2, c:c + s2]
    else:
        grid = torch.nn.functional.interpolate(
            grid.float(), size=(s2, s2), mode='bicubic',
            align_corners=False).to(table.dtype)
    return grid.reshape(-1, s2 * s2).t().contiguous()


def _summarise(keys: List[str]) -> str:
    """Group keys by their first component(s) for a compact log line."""
    groups: Dict[str, int] = OrderedDict()
    for k in keys:
        parts = k.split('.')
        head = '.'.join(parts[:2]) if parts[0] == 'layers' else parts[0]
        groups[head] = groups.get(head, 0) + 1
    return ', '.join(f'{g}.* ({n})' if n > 1 else g for g, n in groups.items())
