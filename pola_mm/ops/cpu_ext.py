"""The fused CPU loop of the polarity kernel's inference, built on first use.

``pola_mm/ops/csrc/polarity_cpu.cpp`` holds one loop, the polarity
features (with their sums over tokens), that the pure-torch kernel does in
six elementwise operations; the kernel uses it in CPU inference (float32,
no autograd). It is compiled once per machine and torch
version with :func:`torch.utils.cpp_extension.load` (a C++20 compiler and
``ninja`` are needed; the result is cached in torch's extension directory,
``$TORCH_EXTENSIONS_DIR`` or ``~/.cache/torch_extensions``). Without them
the kernel keeps its pure-torch path, which computes the same values; a
one-line message says why. ``POLA_MM_CPU_EXT=0`` turns the extension off.

The build is tuned for the CPU it runs on (``-march=native``); its name
carries a hash of that CPU's model and flags, of torch's version and of the
source (its path and content), so machines that share a home directory never
load each other's builds, and two checkouts or versions of pola_mm sharing one
cache each keep their own build instead of rebuilding in turn.

Many processes starting together (the ranks of a distributed job) build it
once: :func:`torch.utils.cpp_extension.load` holds a lock file in the build
folder while one of them compiles, and the others wait and load the result
(tested with four processes and an empty cache). A cache folder that cannot
be written (read-only file system, no permission) cannot hold that lock or a
build: the loops are then skipped with one warning that names the folder, and
the pure-torch kernel runs.
"""
import hashlib
import logging
import os
import platform
import tempfile
import threading
import time
from typing import Any, Optional

import torch
from mmengine.logging import print_log

from . import dispatch

__all__ = ['cpu_ext', 'cpu_ext_enabled', 'used', 'CPU_EXT_ENV']

#: Environment variable: ``0`` turns the fused CPU loops off.
CPU_EXT_ENV = 'POLA_MM_CPU_EXT'

_SOURCE = os.path.join(os.path.dirname(__file__), 'csrc',
                       'polarity_cpu.cpp')
_lock = threading.Lock()
_state: dict = {}


def cpu_ext_enabled() -> bool:
    """False when ``POLA_MM_CPU_EXT`` is ``0``/``false``/``off``."""
    return dispatch.env_enabled(CPU_EXT_ENV)


class CacheNotWritable(OSError):
    """The extension cache folder cannot be written (:func:`_build_dir`)."""


def _cpu_tag() -> str:
    """A short hash of this CPU's model and flags, of torch's version and of
    the source file (path and content)."""
    info = platform.machine()
    try:
        with open('/proc/cpuinfo') as f:
            for line in f:
                if line.startswith(('model name', 'flags', 'Features')):
                    info += line
                if line.strip() == '':  # first processor only
                    break
    except OSError:
        info += platform.processor()
    info += torch.__version__ + os.path.abspath(_SOURCE)
    digest = hashlib.sha1(info.encode())
    try:
        with open(_SOURCE, 'rb') as f:
            digest.update(f.read())
    except OSError:
        pass  # a missing source is reported by cpu_ext()
    return digest.hexdigest()[:10]


def _build_dir(name: str) -> str:
    """The folder torch builds the extension ``name`` in, created if
    needed and checked to be writable (the build and its lock file go
    there): ``$TORCH_EXTENSIONS_DIR/name``, else under torch's default root
    (``~/.cache/torch_extensions/<python>_<accelerator>/name``).

    Raises:
        CacheNotWritable: naming the folder, when it cannot be created or
            written.
    """
    from torch.utils import cpp_extension
    find = getattr(cpp_extension, '_get_build_directory', None)
    root = (os.environ.get('TORCH_EXTENSIONS_DIR')
            or cpp_extension.get_default_build_root())
    path = os.path.join(root, name)
    try:
        if find is not None:  # torch's own choice (it also makes the folder)
            path = find(name, False)
        else:
            os.makedirs(path, exist_ok=True)
        fd, probe = tempfile.mkstemp(prefix='.pola_mm_probe_', dir=path)
        os.close(fd)
        os.remove(probe)
    except OSError as e:
        raise CacheNotWritable(
            f'the extension cache folder {path} cannot be written '
            f'({type(e).__name__}: {e.strerror or e})') from e
    return path


def _build() -> Any:
    # torch warns at this import on machines without CUDA ("No CUDA runtime
    # is found"), which says nothing about a CPU build
    cpp_log = logging.getLogger('torch.utils.cpp_extension')
    level = cpp_log.level
    cpp_log.setLevel(logging.ERROR)
    try:
        from torch.utils.cpp_extension import load
    finally:
        cpp_log.setLevel(level)
    flags = ['-O3', '-std=c++20']
    if platform.machine() in ('x86_64', 'AMD64', 'aarch64', 'arm64'):
        flags.append('-march=native' if platform.machine() in (
            'x86_64', 'AMD64') else '-mcpu=native')
    # OpenMP so that at::parallel_for uses torch's thread pool (the same
    # libgomp.so.1 torch has loaded)
    flags.append('-fopenmp')
    name = f'pola_mm_cpu_{_cpu_tag()}'
    return load(name=name, sources=[_SOURCE], extra_cflags=flags,
                extra_ldflags=['-fopenmp'], build_directory=_build_dir(name),
                verbose=False)


def used() -> bool:
    """Whether this process has loaded the compiled loops."""
    return _state.get('mod') is not None


def cpu_ext() -> Optional[Any]:
    """The compiled module (``features``), or None when it is turned off or cannot be
    built (then the reason is logged once)."""
    if not (cpu_ext_enabled() and dispatch.fast_paths_enabled()):
        return None
    if 'mod' in _state:
        return _state['mod']
    with _lock:
        if 'mod' not in _state:
            mod = None
            if not os.path.isfile(_SOURCE):
                reason = f'{_SOURCE} is missing'
            else:
                print_log(
                    'pola_mm: loading the fused CPU polarity loops (built '
                    'once per machine and torch version, about 25 s)',
                    logger='current', level=logging.DEBUG)
                start = time.perf_counter()
                try:
                    mod = _build()
                    reason = ''
                    took = time.perf_counter() - start
                    if took > 5:  # a build, not a load from the cache
                        print_log(
                            'pola_mm: built the fused CPU polarity loops in '
                            f'{took:.0f} s (once per machine and torch '
                            'version; cached by torch.utils.cpp_extension)',
                            logger='current', level=logging.INFO)
                except CacheNotWritable as e:
                    reason = ''
                    print_log(
                        f'pola_mm: {e}, so the fused CPU polarity loops '
                        'cannot be built or loaded there; using the '
                        'pure-torch kernel (same results, slower on CPU). '
                        'Set TORCH_EXTENSIONS_DIR to a writable folder to '
                        f'enable them, or {CPU_EXT_ENV}=0 to silence this.',
                        logger='current', level=logging.WARNING)
                except Exception as e:  # noqa: BLE001 (any build failure)
                    reason = f'{type(e).__name__}: {str(e)[:300]}'
            if mod is None and reason:
                print_log(
                    'pola_mm: the fused CPU polarity loops are unavailable '
                    f'({reason}); using the pure-torch kernel (same results, '
                    'slower on CPU). Install a C++ compiler and `pip install '
                    f'ninja` to enable them, or set {CPU_EXT_ENV}=0 to '
                    'silence this.', logger='current', level=logging.WARNING)
            _state['mod'] = mod
    return _state['mod']
