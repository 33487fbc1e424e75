"""Checkpoint files that a crash cannot corrupt.

mmengine writes a checkpoint straight to its final path (``open(path,
'wb').write(...)``) and then overwrites ``last_checkpoint``; a process
killed in between leaves a truncated ``.pth`` that ``--resume`` picks up.
:func:`atomic_write` writes to a temporary file in the same folder, flushes,
fsyncs, renames it over the final name (atomic on POSIX file systems) and
fsyncs the folder: a reader sees the old file or the complete new one.
:func:`atomic_checkpoint_writes` makes ``Runner.save_checkpoint`` use it
while :class:`pola_mm.engine.ResumableCheckpointHook` saves.

Reading them back (``--resume``) is :mod:`pola_mm.fileio`'s job
(:func:`pola_mm.fileio.install_checked_loader`).
"""
import glob
import os
import os.path as osp
import tempfile
from contextlib import contextmanager
from typing import BinaryIO, Callable, Iterator, List, Optional

import torch

from .signals import signals_held

__all__ = [
    'atomic_write', 'atomic_save_checkpoint', 'atomic_checkpoint_writes',
    'stale_temporary_files', 'TMP_SUFFIX'
]

#: suffix of the temporary files (``.<name>.<random>.tmp``)
TMP_SUFFIX = '.tmp'


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def atomic_write(path: str, write: Callable[[BinaryIO], None]) -> None:
    """Write ``path`` all at once: ``write(f)`` fills a temporary file
    ``.<name>.<random>.tmp`` in the same folder, which is flushed, fsynced
    and renamed to ``path``; the folder is fsynced. On any error (or a
    signal) the temporary file is removed and ``path`` is untouched.

    Args:
        path: final local path (its folder is created).
        write: writes the content to the open binary file it is given.
    """
    folder = osp.dirname(osp.abspath(path))
    os.makedirs(folder, exist_ok=True)
    fd, tmp = tempfile.mkstemp(
        prefix=f'.{osp.basename(path)}.', suffix=TMP_SUFFIX, dir=folder)
    try:
        with os.fdopen(fd, 'wb') as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o666 & ~_umask())  # mkstemp creates 0600
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise
    try:  # make the rename itself durable
        dir_fd = os.open(folder, os.O_RDONLY)
    except OSError:  # e.g. platforms without directory handles
        return
    try:
        os.fsync(dir_fd)
    except OSError:
        pass
    finally:
        os.close(dir_fd)


def atomic_save_checkpoint(checkpoint: dict,
                           filename: str,
                           file_client_args: Optional[dict] = None,
                           backend_args: Optional[dict] = None) -> None:
    """``mmengine.runner.checkpoint.save_checkpoint`` with an atomic write
    for local paths (other back-ends: mmengine's own write)."""
    from mmengine.fileio import get_file_backend
    from mmengine.fileio.backends import LocalBackend
    from mmengine.runner.checkpoint import save_checkpoint
    local = '://' not in str(filename) and file_client_args is None and \
        isinstance(get_file_backend(filename, backend_args=backend_args),
                   LocalBackend)
    if not local:
        save_checkpoint(checkpoint, filename, file_client_args, backend_args)
        return
    atomic_write(str(filename), lambda f: torch.save(checkpoint, f))


@contextmanager
def atomic_checkpoint_writes() -> Iterator[None]:
    """Within the block, ``Runner.save_checkpoint`` writes atomically and a
    SIGTERM is held until the block ends (see :mod:`.signals`).

    ``Runner.save_checkpoint`` calls the ``save_checkpoint`` function of
    ``mmengine.runner.runner``; that one name is replaced by
    :func:`atomic_save_checkpoint` for the duration of the block only.
    """
    import mmengine.runner.runner as runner_module
    original = runner_module.save_checkpoint
    with signals_held():
        runner_module.save_checkpoint = atomic_save_checkpoint
        try:
            yield
        finally:
            runner_module.save_checkpoint = original


def stale_temporary_files(folder: str) -> List[str]:
    """Temporary files of :func:`atomic_write` left in ``folder`` by a
    process killed while writing (safe to delete)."""
    return sorted(glob.glob(osp.join(folder, f'.*.pth.*{TMP_SUFFIX}')) +
                  glob.glob(osp.join(folder,
                                     f'.last_checkpoint.*{TMP_SUFFIX}')))
