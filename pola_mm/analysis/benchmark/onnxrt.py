"""The backbone benchmark in ONNX Runtime: the speed of what is deployed.

``benchmark_model(..., runtime='onnxruntime')`` (and
``tools/analysis/benchmark.py --runtime onnxruntime``) measures a backbone
as :mod:`pola_mm.deployment.onnx` deploys it, in two worker processes (see
:mod:`pola_mm.analysis.benchmark.worker`):

1. :func:`export_and_check` builds the backbone, exports it with
   :func:`pola_mm.deployment.onnx.export_onnx` (the graph is the plain
   reference computation in standard operators) to a file in a temporary
   directory the parent owns and removes, and runs the file in ONNX Runtime
   next to PyTorch on a seeded input
   (:func:`pola_mm.deployment.onnx.verify_onnx`). The largest difference
   over the outputs, relative to each output's scale (its max abs value in
   PyTorch), is reported as ``onnx_rel_diff``; above ``rtol`` (default
   1e-4) the case fails.
2. :func:`measure_onnxruntime`, in a fresh process, loads the file in an
   ONNX Runtime session on the CPU (``intra_op_num_threads`` = the
   benchmark's ``threads``) and times ``session.run`` with the same warm-up
   and repeats as the PyTorch mode (:func:`timed_steps`). Its peak memory
   is that process's peak RSS: the session, its weights and activations
   (plus the interpreter and the libraries every worker holds), not the
   export's, which happened in the other process.
3. With ``profile_runs`` (``--ort-profile``), a third process profiles the
   file with ONNX Runtime's own profiler
   (:mod:`pola_mm.analysis.benchmark.ortprofile`: time by part and by
   operator).

Only inference on the CPU in float32 is measured this way.
"""
import os.path as osp
import shutil
import tempfile
import time
from typing import Any, Dict, Optional, Sequence

from ..zoo import build
from .results import parse_size
from .worker import Size, measure_in, timed_steps

__all__ = ['RUNTIMES', 'DEFAULT_EXPORTER', 'opset_of', 'export_and_check',
           'measure_onnxruntime', 'seeded_feed', 'export_then_time',
           'run_onnxruntime']

#: What the benchmark can run a backbone in.
RUNTIMES = ('pytorch', 'onnxruntime')

#: The exporter of the ONNX Runtime mode: the TorchScript tracer exports the
#: full-size backbones in seconds (the ``dynamo`` exporter also gives
#: verified files, more slowly; it is needed for a batch other than 1).
DEFAULT_EXPORTER = 'torchscript'


def opset_of(path: str) -> Optional[int]:
    """The default-domain opset of an ONNX file (None if unreadable)."""
    try:
        import onnx
        m = onnx.load(path, load_external_data=False)
    except Exception:  # onnx missing or the file unreadable: not fatal
        return None
    for imp in m.opset_import:
        if imp.domain in ('', 'ai.onnx'):
            return int(imp.version)
    return None


def export_and_check(model: Any,
                     path: str,
                     size: Size = (224, 224),
                     batch: int = 1,
                     exporter: str = DEFAULT_EXPORTER,
                     opset: Optional[int] = None,
                     threads: Optional[int] = None,
                     seed: int = 0,
                     rtol: float = 1e-4,
                     preload: Sequence[str] = ()) -> Dict[str, Any]:
    """Export one backbone to ``path`` and compare ONNX Runtime with PyTorch
    (step 1 of the module docstring), in the current process.

    Args:
        model: a name of :func:`~pola_mm.analysis.zoo.zoo` or a config
            dict (see :func:`~pola_mm.analysis.zoo.build`).
        path: the ``.onnx`` file to write.
        size: input (H, W), fixed in the graph.
        batch: batch size; other than 1 needs the ``dynamo`` exporter (the
            file then has a free batch dimension).
        exporter: ``'torchscript'`` or ``'dynamo'``.
        opset: ONNX opset (default: the exporter's).
        threads: ``torch.set_num_threads`` for the export and the PyTorch
            reference.
        seed: seeds the weights' initialisation and the input.
        rtol: largest allowed max abs difference over an output's scale.
        preload: modules imported first.

    Returns:
        dict with ``onnx_rel_diff`` (largest max abs difference relative to
        the output scale), ``export_s`` (seconds of the export), ``opset``
        (of the file), ``torch_version``, ``num_params``; with ``error`` too
        when the difference exceeds ``rtol``. A failed export raises
        :class:`~pola_mm.deployment.onnx.ExportError`.
    """
    import importlib

    import torch
    for mod in preload:
        importlib.import_module(mod)
    from pola_mm.deployment.onnx import (ExportError, example_inputs,
                                         export_onnx, verify_onnx)

    if batch != 1 and exporter != 'dynamo':
        raise ExportError(f'batch {batch} needs the dynamo exporter (the '
                          f'{exporter} export fixes the batch at 1)')
    if threads:
        torch.set_num_threads(int(threads))
    torch.manual_seed(seed)
    hw = parse_size(size)
    net = build(model).model
    net.eval()  # not chained: mmdet's Swin.train returns None
    t0 = time.perf_counter()
    export_onnx(net, hw, path, exporter=exporter, opset=opset,
                dynamic_batch=batch != 1)
    export_s = time.perf_counter() - t0
    x = example_inputs(net, hw, batch=batch, seed=seed + 1)
    checks = verify_onnx(net, path, [x], rtol=rtol)
    rel = max((c.max_abs_diff / c.scale if c.scale > 0 else c.max_abs_diff)
              for c in checks)
    out = dict(onnx_rel_diff=rel, export_s=export_s, opset=opset_of(path),
               torch_version=torch.__version__,
               num_params=sum(p.numel() for p in net.parameters()))
    if not all(c.ok for c in checks):
        out['error'] = (f'ONNX Runtime differs from PyTorch by {rel:.3g} of '
                        f'the output scale (> {rtol:g}): ' + '; '.join(
                            str(c) for c in checks if not c.ok))
    return out


def measure_onnxruntime(path: str,
                        size: Size = (224, 224),
                        batch: int = 1,
                        warmup: int = 1,
                        repeats: int = 3,
                        threads: Optional[int] = None,
                        seed: int = 0) -> Dict[str, Any]:
    """Time ``session.run`` of an exported backbone in the current process
    (step 2 of the module docstring).

    The session runs on ONNX Runtime's CPU provider with its default graph
    optimisations and ``intra_op_num_threads = threads`` (None: ONNX
    Runtime's default, one thread per physical core). The input is a seeded
    standard normal float32 array of shape (batch, 3, H, W).

    Returns:
        dict with ``times``, ``peak_mem_mb``, ``base_mem_mb`` (see
        :func:`timed_steps`; the session is loaded before the base),
        ``threads`` (the intra-op threads asked for, None for the default)
        and ``ort_version``.
    """
    import onnxruntime as ort

    h, w = parse_size(size)
    opts = ort.SessionOptions()
    if threads:
        opts.intra_op_num_threads = int(threads)
    sess = ort.InferenceSession(path, opts,
                                providers=['CPUExecutionProvider'])
    feed = seeded_feed(sess, (h, w), batch, seed)

    def step() -> None:
        sess.run(None, feed)

    times, base, peak = timed_steps(step, None, warmup, repeats)
    return dict(times=times, peak_mem_mb=peak, base_mem_mb=base,
                threads=int(threads) if threads else None,
                ort_version=ort.__version__)


def seeded_feed(sess: Any, size: Size, batch: int,
                seed: int) -> Dict[str, Any]:
    """The input of a session's first input: a seeded standard normal
    float32 array ``(batch, C, H, W)`` (``C`` from the file, else 3)."""
    import numpy as np
    inp = sess.get_inputs()[0]
    c = inp.shape[1] if isinstance(inp.shape[1], int) else 3
    return {inp.name: np.random.default_rng(seed).standard_normal(
        (batch, c, size[0], size[1])).astype(np.float32)}


def run_onnxruntime(model: Any,
                    size: Size = (224, 224),
                    batch: int = 1,
                    warmup: int = 1,
                    repeats: int = 3,
                    threads: Optional[int] = None,
                    exporter: str = DEFAULT_EXPORTER,
                    opset: Optional[int] = None,
                    rtol: float = 1e-4,
                    isolate: bool = True,
                    timeout: Optional[float] = None,
                    preload: Sequence[str] = (),
                    profile_runs: int = 0) -> Dict[str, Any]:
    """Export and check, then time (and profile, with ``profile_runs``),
    one backbone in ONNX Runtime (each in its own worker process unless
    ``isolate`` is False).

    ``timeout`` applies to each of the two workers. The file lives in a
    temporary directory removed afterwards.

    Returns:
        The keys of :func:`export_and_check` and
        :func:`measure_onnxruntime` together, or ``error`` (with
        ``onnx_rel_diff`` when the check failed on a large difference).
    """
    job = dict(model=model, size=list(size), batch=batch, exporter=exporter,
               opset=opset, threads=threads, rtol=rtol, preload=list(preload))
    return export_then_time(
        'pola_mm.analysis.benchmark.onnxrt:export_and_check', job,
        'backbone.onnx', warmup, repeats, threads, isolate, timeout,
        profile_runs)


def export_then_time(export: str, job: Dict[str, Any], filename: str,
                     warmup: int, repeats: int, threads: Optional[int],
                     isolate: bool, timeout: Optional[float],
                     profile_runs: int = 0) -> Dict[str, Any]:
    """The two steps of the ONNX Runtime modes, each in its own worker
    process unless ``isolate`` is False (``timeout`` applies to each):
    ``export`` (``'module:function'``, called with ``job`` and ``path``)
    writes and checks the file ``filename`` in a temporary directory
    removed afterwards, then :func:`measure_onnxruntime` times it, on the
    input shape the export reports (``input_shape``) or ``(job['batch'],
    3, *job['size'])``; with ``profile_runs`` a third worker profiles that
    many runs (:func:`~pola_mm.analysis.benchmark.ortprofile.
    profile_onnxruntime`, after the timing: the profiler slows runs down).

    Returns:
        The export's keys and :func:`measure_onnxruntime`'s together (and
        ``ort_profile``, ``{'error': ...}`` if the profile failed), or
        ``error``.
    """
    tmp = tempfile.mkdtemp(prefix='pola_mm_bench_')
    try:
        path = osp.join(tmp, filename)
        out = measure_in(export, dict(job, path=path), isolate, timeout)
        if 'error' in out:
            return out
        if not osp.exists(path):
            return dict(out, error=f'no ONNX file at {path}')
        shape = out.get('input_shape') or (
            [job.get('batch', 1), 3] + list(job['size']))
        on = dict(path=path, size=list(shape[2:]), batch=shape[0],
                  threads=threads)
        timed = measure_in(
            'pola_mm.analysis.benchmark.onnxrt:measure_onnxruntime',
            dict(on, warmup=warmup, repeats=repeats), isolate, timeout)
        if profile_runs and 'error' not in timed:
            prof = measure_in(
                'pola_mm.analysis.benchmark.ortprofile:profile_onnxruntime',
                dict(on, runs=profile_runs), isolate, timeout)
            # a failed profile keeps the timing; it is reported as such
            timed['ort_profile'] = prof.get('ort_profile') or dict(
                error=prof.get('error', 'no profile'))
        return dict(out, **timed)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
