"""Reading checkpoint files without ever running code from them.

:func:`load_checkpoint_file` is the one entry for every file pola_mm reads
for weights (pretrained loading, the converter, the tools' resume and test
paths, where :func:`install_checked_loader` makes it mmengine's loader of
local files):
``torch.load(weights_only=True)`` first (extended for mmengine Runner
checkpoints by :mod:`pola_mm.compat` where torch loads weights-only by
default), and for files torch refuses the restricted unpicklers of
:mod:`pola_mm.fileio.unpickler`. Files that are not
checkpoints, truncated or corrupt raise :class:`CheckpointFileError` with
one line naming the file and what is wrong.
"""
import os
import os.path as osp
import pickle
import re
import tarfile
import zipfile
from collections import OrderedDict
from typing import (Any, BinaryIO, Callable, Dict, List, Mapping, NoReturn,
                    Optional, Tuple)

import torch
from mmengine.logging import print_log
from torch import Tensor

from .unpickler import (InertObject, UnpicklingRefused, inert_names,
                        inert_pickle_module, runner_pickle_module)

__all__ = ['CheckpointFileError', 'load_checkpoint_file',
           'install_checked_loader', 'summarise_keys', 'weights_key']


class CheckpointFileError(ValueError):
    """A checkpoint file that cannot be read; the message names the file and
    what is wrong with it."""


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


def weights_key(checkpoint: Mapping) -> Optional[str]:
    """The entry of a loaded checkpoint that holds the weights:
    ``'state_dict'``, ``'model'`` or ``'module'`` (the first that is a
    mapping), None for weights at the top level (as
    :func:`pola_mm.models.checkpoint.extract_state_dict` takes them)."""
    for name in ('state_dict', 'model', 'module'):
        if name in checkpoint and isinstance(checkpoint[name], Mapping):
            return name
    return None


def load_checkpoint_file(filename: str,
                         map_location: Any = 'cpu',
                         allow_inert: bool = True) -> Dict[str, Any]:
    """Load a checkpoint file without ever running code from it.

    First ``torch.load(weights_only=True)``; a file it refuses is read by
    pola_mm's Runner unpickler instead, which reads exactly what torch >= 2.4
    reads with pola_mm's allow-list (Runner checkpoints) and refuses the
    rest: on a torch whose weights-only loader takes no allow-list (< 2.4),
    or whose allow-list :mod:`pola_mm.compat` left alone (torch does not
    load weights-only by default there). If the file is still refused (e.g.
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
            f.seek(0)
            if isinstance(err, pickle.UnpicklingError):
                # torch's allow-list lacks pola_mm's (torch < 2.4 takes none;
                # pola_mm.compat extends it only where torch loads
                # weights-only by default): what torch would read with it is
                # read by pola_mm's Runner unpickler
                try:
                    return _checked(
                        torch.load(f, map_location=map_location,
                                   weights_only=False,
                                   pickle_module=runner_pickle_module()),
                        filename, None)
                except CheckpointFileError:
                    raise
                except Exception as runner_err:
                    err = runner_err
                    f.seek(0)
            if not allow_inert:
                _refuse_weights_only(filename, err)
        record: Dict[str, int] = {}
        try:
            checkpoint = torch.load(
                f, map_location=map_location, weights_only=False,
                pickle_module=inert_pickle_module(record))
        except UnpicklingRefused as err:
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
    key = weights_key(checkpoint)
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
                f'entries {summarise_keys([str(k) for k in checkpoint])}')
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
        (k, inert_names(v)) for k, v in checkpoint.items() if k != key)
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


def summarise_keys(keys: List[str]) -> str:
    """Group keys by their first component(s) for a compact log line
    (``layers.0.*`` and ``layers.1.*`` apart, other names by their first
    component)."""
    groups: Dict[str, int] = OrderedDict()
    for k in keys:
        parts = k.split('.')
        head = '.'.join(parts[:2]) if parts[0] == 'layers' else parts[0]
        groups[head] = groups.get(head, 0) + 1
    return ', '.join(f'{g}.* ({n})' if n > 1 else g for g, n in groups.items())


def install_checked_loader(allow_inert: bool) -> None:
    """Make mmengine load local checkpoint files with
    :func:`load_checkpoint_file`.

    Replaces the loader of mmengine's ``CheckpointLoader`` for plain paths
    (the prefix ``''``), which ``Runner.resume``, ``Runner.load_checkpoint``
    and ``mmengine.runner.load_checkpoint`` use. Called by the tools only.

    Args:
        allow_inert: what to do with a file that weights-only loading
            refuses: read it with pola_mm's restricted unpickler (entries
            that are not data come back inert) or refuse it. The tools
            refuse: a checkpoint they load is a Runner checkpoint, which
            loads weights-only (the authors' training files go through
            ``tools/model_converters/pola_official_to_mm.py`` or
            ``init_cfg``, which read them inertly).
    """
    from mmengine.runner.checkpoint import CheckpointLoader

    # named as mmengine's loaders: it logs "Loads checkpoint by
    # {name[10:]} backend", i.e. "by local backend"
    def load_from_local(filename: str, map_location: Any) -> dict:
        return load_checkpoint_file(
            osp.expanduser(filename), map_location=map_location,
            allow_inert=allow_inert)

    CheckpointLoader.register_scheme(prefixes='', loader=load_from_local,
                                     force=True)
