"""The fused CPU loops of the polarity kernel, built on first use.

``pola_mm/ops/csrc/polarity_cpu.cpp`` holds three loops (the polarity
features, the chain rule through them, which can also rebuild them, and
the gradient of the queries' product) that the pure-torch kernel does in
five to ten elementwise operations each, and the weight gradient of the
depth-wise conv on v. It is compiled once per machine and torch
version with :func:`torch.utils.cpp_extension.load` (a C++20 compiler and
``ninja`` are needed; the result is cached in torch's extension directory,
``$TORCH_EXTENSIONS_DIR`` or ``~/.cache/torch_extensions``). Without them
the kernel keeps its pure-torch path, which computes the same values; a
one-line message says why. ``POLA_MM_CPU_EXT=0`` turns the extension off.

The build is tuned for the CPU it runs on (``-march=native``); its name
carries a hash of that CPU's model and flags, so machines that share a home
directory never load each other's builds.
"""
import hashlib
import logging
import os
import platform
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
    return dispatch._env_enabled(CPU_EXT_ENV)


def _cpu_tag() -> str:
    """A short hash of this CPU's model and flags and of torch's version."""
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
    info += torch.__version__
    return hashlib.sha1(info.encode()).hexdigest()[:10]


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
    return load(name=f'pola_mm_cpu_{_cpu_tag()}', sources=[_SOURCE],
                extra_cflags=flags, extra_ldflags=['-fopenmp'],
                verbose=False)


def used() -> bool:
    """Whether this process has loaded the compiled loops."""
    return _state.get('mod') is not None


def cpu_ext() -> Optional[Any]:
    """The compiled module (``features``, ``power_grads``, ``query_du``,
    ``dwconv_weight_grad``), or None when it is turned off or cannot be
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
                except Exception as e:  # noqa: BLE001 (any build failure)
                    reason = f'{type(e).__name__}: {str(e)[:300]}'
            if mod is None:
                print_log(
                    'pola_mm: the fused CPU polarity loops are unavailable '
                    f'({reason}); using the pure-torch kernel (same results, '
                    'slower on CPU). Install a C++ compiler and `pip install '
                    f'ninja` to enable them, or set {CPU_EXT_ENV}=0 to '
                    'silence this.', logger='current', level=logging.WARNING)
            _state['mod'] = mod
    return _state['mod']
