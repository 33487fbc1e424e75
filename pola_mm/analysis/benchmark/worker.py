"""What the benchmarks share: one measurement in a fresh process, timed
steps and peak memory.

Each measurement runs in its own Python process, so that the peak memory of
one model is not polluted by another (peak RSS is a high-water mark of the
whole process on CPU). The parent sends a JSON job on the worker's stdin
(:func:`run_in_worker`); the worker (:func:`serve`) calls the benchmark's
measuring function with it and writes the result as one marked JSON line on
stdout (and, when the parent logs, marked log lines that the parent passes
on as they come).

Peak memory is the peak resident set size of the worker process (``VmHWM``
of ``/proc/self/status``; ``resource.getrusage`` where there is none) on
CPU, which includes the interpreter, torch and the weights, and
``torch.cuda.max_memory_allocated`` on CUDA. ``base_mem_mb`` is the memory
in use just before the first step, so ``peak - base`` (``extra_mem_mb``) is
what the steps themselves added.
"""
import importlib
import json
import os
import os.path as osp
import resource
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import asdict, dataclass, field, fields
from typing import Any, Callable, Dict, List, Optional, Tuple

__all__ = [
    'RESULT_MARK', 'LOG_MARK', 'Size', 'StepMemory', 'current_rss_mb',
    'peak_rss_mb', 'timed_steps', 'serve', 'run_in_worker', 'measure_in'
]

#: ``(height, width)`` of an input or a grid.
Size = Tuple[int, int]

#: Marks the result line among whatever else a worker prints.
RESULT_MARK = '@@POLA_BENCHMARK_RESULT@@'
#: Marks a log line of a worker, passed on to the parent's log.
LOG_MARK = '@@POLA_BENCHMARK_LOG@@'


@dataclass
class StepMemory:
    """What every benchmark result holds: the timed steps, their memory and
    the failure, if any.

    Times are seconds per step, memory is MiB (peak and base as in the
    module docstring). ``error`` is set, and the numbers are None, when the
    worker failed (out of memory, a model that cannot run at this size, a
    timeout).

    A result class puts the fields that name what was measured (all
    required) in a dataclass of its own and lists it *after* this one among
    its bases, ``class Result(StepMemory, _Key)``: dataclasses collect the
    fields of the bases from the last to the first, so the required fields
    come first and the result is built as ``Result(key..., times=...)`` on
    every Python the package supports (``kw_only`` needs 3.10).
    """
    times: List[float] = field(default_factory=list)
    time_median: Optional[float] = None
    peak_mem_mb: Optional[float] = None
    base_mem_mb: Optional[float] = None
    threads: Optional[int] = None
    error: Optional[str] = None

    @property
    def extra_mem_mb(self) -> Optional[float]:
        """Memory the steps added on top of the weights and the inputs."""
        if self.peak_mem_mb is None or self.base_mem_mb is None:
            return None
        return self.peak_mem_mb - self.base_mem_mb

    def record(self, out: Dict[str, Any]) -> None:
        """Take the steps of a worker's result dict (``times``,
        ``peak_mem_mb``, ``base_mem_mb``, ``threads``; see
        :func:`timed_steps`) and their median."""
        self.times = list(out['times'])
        self.time_median = statistics.median(self.times)
        self.peak_mem_mb = out.get('peak_mem_mb')
        self.base_mem_mb = out.get('base_mem_mb')
        self.threads = out.get('threads')

    def pool(self, other: 'StepMemory') -> 'StepMemory':
        """This result with another round of the same measurement pooled
        in: all times (their median), the largest peak and base memory; a
        failed round wins. Returns the pooled result."""
        if self.error or other.error:
            return self if self.error else other
        self.record(dict(
            times=self.times + other.times, threads=self.threads,
            **{k: max((v for v in (getattr(self, k), getattr(other, k))
                       if v is not None), default=None)
               for k in ('peak_mem_mb', 'base_mem_mb')}))
        return self

    def summary(self) -> str:
        """The result in a few words, for the log."""
        if self.error:
            return f'error {self.error}'
        if self.time_median is None:
            return 'not measured'
        return f'{self.time_median:.4f} s' + (
            '' if self.peak_mem_mb is None else
            f', peak {self.peak_mem_mb:.0f} MiB')

    def to_dict(self) -> Dict[str, Any]:
        """A JSON-serialisable dict: the fields (tuples as lists) and
        ``extra_mem_mb``."""
        d = {k: list(v) if isinstance(v, tuple) else v
             for k, v in asdict(self).items()}
        d['extra_mem_mb'] = self.extra_mem_mb
        return d

    @classmethod
    def from_dict(cls, d: Dict[str, Any]) -> 'StepMemory':
        """The result of a :meth:`to_dict` dict (read back from JSON):
        lists become tuples where the field is a :data:`Size`, derived keys
        such as ``extra_mem_mb`` are dropped."""
        kw = {}
        for f in fields(cls):
            if f.name in d:
                v = d[f.name]
                kw[f.name] = tuple(v) if f.type == Size and v else v
        return cls(**kw)


def current_rss_mb() -> float:
    """Resident set size of this process now, in MiB (Linux)."""
    try:
        with open('/proc/self/statm') as f:
            pages = int(f.read().split()[1])
        return pages * os.sysconf('SC_PAGE_SIZE') / 2**20
    except (OSError, ValueError):  # not Linux: fall back to the peak
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def peak_rss_mb() -> float:
    """Peak resident set size of this process, in MiB.

    Linux's ``VmHWM`` belongs to the process image: unlike ``ru_maxrss``,
    which survives ``execve`` and so starts at the parent's size in a
    forked-then-exec'd worker, it counts this process only.
    """
    try:
        with open('/proc/self/status') as f:
            for line in f:
                if line.startswith('VmHWM:'):
                    return int(line.split()[1]) / 1024
    except (OSError, ValueError):
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def timed_steps(step: Callable[[], None], dev: Any, warmup: int,
                repeats: int) -> Tuple[List[float], float, float]:
    """Run ``step`` ``warmup`` times, then time ``repeats`` runs.

    Args:
        step: one step of the measured computation.
        dev: the ``torch.device`` it runs on (CUDA is synchronised around
            each timed step), or None for the CPU outside torch (an ONNX
            Runtime session).
        warmup: untimed steps first.
        repeats: timed steps.

    Returns:
        The wall times (s), the memory before the first step and the peak
        memory (MiB): allocated CUDA memory on a GPU, the process's RSS on
        the CPU.
    """
    cuda = dev is not None and dev.type == 'cuda'
    if cuda:
        import torch

    def sync() -> None:
        if cuda:
            torch.cuda.synchronize(dev)

    sync()
    if cuda:
        torch.cuda.reset_peak_memory_stats(dev)
        base = torch.cuda.memory_allocated(dev) / 2**20
    else:
        base = current_rss_mb()
    for _ in range(warmup):
        step()
    sync()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        step()
        sync()
        times.append(time.perf_counter() - t0)
    peak = (torch.cuda.max_memory_allocated(dev) / 2**20 if cuda else
            peak_rss_mb())
    return times, base, peak


def _resolve(measure: str) -> Callable[..., Dict[str, Any]]:
    """The function named ``'package.module:function'``."""
    module, name = measure.split(':', 1)
    return getattr(importlib.import_module(module), name)


def measure_in(measure: str, job: Dict[str, Any], isolate: bool = True,
               timeout: Optional[float] = None,
               log: Optional[Callable[[str], None]] = None
               ) -> Dict[str, Any]:
    """``measure(**job)`` in a fresh worker process
    (:func:`run_in_worker`) or, without ``isolate``, in this one (where an
    exception is raised rather than reported); with ``log``, ``measure``
    takes a ``log`` argument too and its lines reach ``log``."""
    if isolate:
        return run_in_worker(measure, job, timeout, log)
    return _resolve(measure)(**job, **({'log': log} if log else {}))


def serve(measure: str) -> None:
    """Entry point of a worker process: a JSON job on stdin, the result on
    stdout.

    Args:
        measure: ``'package.module:function'``, called with the job's items
            as keyword arguments; it returns a JSON-serialisable dict. An
            exception becomes ``{'error': 'Type: message'}``, reported to
            the parent rather than raised there.
    """
    job = json.loads(sys.stdin.read())
    if job.get('log'):  # the parent logs: marked lines on stdout
        job['log'] = lambda msg: print(LOG_MARK + msg, flush=True)
    try:
        out = _resolve(measure)(**job)
    except Exception as e:  # reported to the parent, not raised there
        out = dict(error=f'{type(e).__name__}: {e}')
    sys.stdout.write('\n' + RESULT_MARK + json.dumps(out) + '\n')
    sys.stdout.flush()


def _package_root() -> str:
    """The directory holding the ``pola_mm`` package (for the worker path)."""
    return osp.dirname(
        osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__)))))


def run_in_worker(measure: str, job: Dict[str, Any],
                  timeout: Optional[float] = None,
                  log: Optional[Callable[[str], None]] = None
                  ) -> Dict[str, Any]:
    """Run one measurement in a fresh Python process.

    Args:
        measure: ``'package.module:function'`` the worker calls (see
            :func:`serve`).
        job: its keyword arguments (JSON-serialisable).
        timeout: seconds after which the worker is killed.
        log: if given, ``measure`` is called with a ``log`` argument whose
            lines come here while the worker runs.

    Returns:
        The worker's result dict, or ``{'error': ...}`` for a failure in the
        worker, a worker that died without a result (the last lines of its
        output) or a timeout.
    """
    env = dict(os.environ)
    env['PYTHONPATH'] = os.pathsep.join(
        [_package_root()] +
        ([env['PYTHONPATH']] if env.get('PYTHONPATH') else []))
    cmd = [sys.executable, '-c',
           'from pola_mm.analysis.benchmark.worker import serve; '
           f'serve({measure!r})']
    killed = []

    def kill() -> None:
        killed.append(True)
        proc.kill()

    with tempfile.TemporaryFile('w+') as err:
        proc = subprocess.Popen(cmd, stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, stderr=err,
                                text=True, env=env)
        timer = threading.Timer(timeout, kill) if timeout else None
        if timer:
            timer.start()
        try:
            proc.stdin.write(json.dumps(dict(job, log=True) if log else job))
            proc.stdin.close()
            lines = []
            for line in proc.stdout:
                if line.startswith(LOG_MARK) and log:
                    log(line[len(LOG_MARK):].rstrip('\n'))
                else:
                    lines.append(line.rstrip('\n'))
            proc.wait()
        finally:
            if timer:
                timer.cancel()
        err.seek(0)
        stderr = err.read()
    if killed:
        return dict(error=f'timeout after {timeout:g} s')
    results = [ln for ln in lines if ln.startswith(RESULT_MARK)]
    if not results:
        tail = (stderr.strip() or '\n'.join(lines).strip()).splitlines()[-3:]
        return dict(error=f'worker exited with {proc.returncode}'
                    + (': ' + ' | '.join(tail) if tail else ''))
    return json.loads(results[-1][len(RESULT_MARK):])
