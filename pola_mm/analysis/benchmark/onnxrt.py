"""Exported models timed in ONNX Runtime and OpenVINO: the speed of what
is deployed.

``tools/analysis/benchmark.py --runtime onnxruntime [openvino]`` (and
``benchmark_model(..., runtime=...)``) measures the models of a case as
:mod:`pola_mm.deployment.onnx_export` deploys them
(:func:`measure_exported`, each step in worker processes, see
:mod:`pola_mm.analysis.benchmark.worker`):

1. Each model is exported and checked once, in a worker of its own:
   :func:`export_and_check` builds the backbone, exports it with
   :func:`pola_mm.deployment.onnx_export.export_onnx` (the graph is the
   plain reference computation in standard operators) to a file in a
   temporary directory the parent owns and removes, and runs the file in
   ONNX Runtime next to PyTorch on a seeded input
   (:func:`pola_mm.deployment.onnx_verify.verify_onnx`). The largest
   difference over the outputs, relative to each output's scale (its max
   abs value in PyTorch), is reported as ``onnx_rel_diff``; above ``rtol``
   (default 1e-4) the model fails. Whole models are exported by MMDeploy
   instead (:func:`pola_mm.analysis.benchmark.whole.export_whole`).
2. Peak memory: each file in each runtime in a process of its own
   (:func:`exported_memory`): the session loaded, ``warmup`` runs and one
   more; its peak RSS is the session, its weights and activations (plus
   the interpreter and the libraries every worker holds), not the
   export's.
3. Time: every file of the case in every runtime, in ONE process
   (:func:`time_exported`): all sessions loaded and warmed up, then in
   round r each session runs ``repeats`` times, the order alternating
   (AB, BA, ...; :func:`~pola_mm.analysis.benchmark.results.
   measure_in_rounds`), the times of a session pooled over the rounds.
4. With ``profile_runs`` (``--ort-profile``), ONNX Runtime's own profiler
   runs each file in a process of its own
   (:mod:`pola_mm.analysis.benchmark.ortprofile`: time by part and by
   operator).

Sessions run on the CPU: ONNX Runtime's CPU provider with its default graph
optimisations and ``intra_op_num_threads`` = the benchmark's ``threads``;
OpenVINO's CPU plugin with ``INFERENCE_PRECISION_HINT`` f32 and
``INFERENCE_NUM_THREADS`` = ``threads`` (None: each runtime's default).
The input is a seeded standard normal float32 array of the exported shape.
Only inference in float32 is measured this way.
"""
import os
import os.path as osp
import shutil
import tempfile
import time
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

from ..zoo import build
from .results import measure_in_rounds, parse_size, print_line
from .worker import Size, StepMemory, measure_in, timed_steps

__all__ = ['RUNTIMES', 'EXPORTED_RUNTIMES', 'VERSION_KEYS',
           'DEFAULT_EXPORTER', 'opset_of', 'export_and_check',
           'open_session', 'exported_memory', 'time_exported', 'seeded_input',
           'measure_exported']

#: What the benchmark can run a backbone in.
RUNTIMES = ('pytorch', 'onnxruntime', 'openvino')
#: The runtimes that time an exported file.
EXPORTED_RUNTIMES = RUNTIMES[1:]
#: The result field holding each runtime's version.
VERSION_KEYS = {'onnxruntime': 'ort_version', 'openvino': 'ov_version'}

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
        :class:`~pola_mm.deployment.onnx_errors.ExportError`.
    """
    import importlib

    import torch
    for mod in preload:
        importlib.import_module(mod)
    from pola_mm.deployment.onnx_build import example_inputs
    from pola_mm.deployment.onnx_errors import ExportError
    from pola_mm.deployment.onnx_export import export_onnx
    from pola_mm.deployment.onnx_verify import verify_onnx

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


def open_session(runtime: str, path: str, shape: Sequence[int],
                 threads: Optional[int] = None,
                 seed: int = 0) -> Tuple[Callable[[], Any], Dict[str, str]]:
    """Load the ONNX file ``path`` in ``runtime`` on the CPU (see the module
    docstring) with a seeded standard normal float32 input of ``shape``.

    Returns:
        A function running the model once, and ``{version key: the
        runtime's version}`` (:data:`VERSION_KEYS`).
    """
    x = seeded_input(shape, seed)
    if runtime == 'onnxruntime':
        import onnxruntime as ort
        opts = ort.SessionOptions()
        if threads:
            opts.intra_op_num_threads = int(threads)
        sess = ort.InferenceSession(path, opts,
                                    providers=['CPUExecutionProvider'])
        feed = {sess.get_inputs()[0].name: x}
        return (lambda: sess.run(None, feed)), {'ort_version':
                                                ort.__version__}
    if runtime == 'openvino':
        import openvino as ov
        config = {'INFERENCE_PRECISION_HINT': 'f32'}
        if threads:
            config['INFERENCE_NUM_THREADS'] = int(threads)
        request = ov.Core().compile_model(path, 'CPU',
                                          config).create_infer_request()
        return (lambda: request.infer({0: x})), {
            'ov_version': ov.__version__.split('-')[0]}
    raise ValueError(f'runtime must be one of {EXPORTED_RUNTIMES}, got '
                     f'{runtime!r}')


def exported_memory(path: str, runtime: str, shape: Sequence[int],
                    warmup: int = 1, threads: Optional[int] = None,
                    seed: int = 0) -> Dict[str, Any]:
    """Peak memory of one file in one runtime (step 2 of the module
    docstring), in the current process: the session loaded, then
    ``warmup`` runs and one more.

    Returns:
        dict with ``peak_mem_mb``, ``base_mem_mb`` (see :func:`timed_steps`;
        the session is loaded before the base) and the runtime's version.
    """
    step, version = open_session(runtime, path, shape, threads, seed)
    _, base, peak = timed_steps(step, None, warmup, 1)
    return dict(version, peak_mem_mb=peak, base_mem_mb=base)


def time_exported(files: Dict[str, Dict[str, Any]],
                  warmup: int = 1,
                  repeats: int = 3,
                  rounds: int = 1,
                  threads: Optional[int] = None,
                  seed: int = 0,
                  title: str = '',
                  log: Optional[Callable[[str], None]] = None
                  ) -> Dict[str, Any]:
    """Time every file of a case in this process (step 3 of the module
    docstring).

    Args:
        files: label -> ``path``, ``runtime`` and input ``shape``.
        warmup: untimed runs of each session before the first round.
        repeats: timed runs of each session per round.
        rounds: rounds of :func:`~pola_mm.analysis.benchmark.results.
            measure_in_rounds`, the order of the sessions alternating.
        threads, seed: see :func:`open_session`.
        title, log: the log of the rounds.

    Returns:
        label -> ``times`` (all rounds) and ``threads`` (asked for, None
        for the default), or ``error`` (a session that failed to load or
        run).
    """
    out: Dict[str, Any] = {}
    steps = {}
    for label, f in files.items():
        try:
            steps[label], _ = open_session(f['runtime'], f['path'],
                                           f['shape'], threads, seed)
        except Exception as e:  # that session fails, the others are timed
            out[label] = dict(error=f'{type(e).__name__}: {e}')
    for step in steps.values():
        for _ in range(warmup):
            step()

    def measure(label: str) -> StepMemory:
        try:
            times, _, _ = timed_steps(steps[label], None, 0, repeats)
        except Exception as e:
            return StepMemory(error=f'{type(e).__name__}: {e}')
        res = StepMemory()
        res.record(dict(times=times, threads=int(threads) if threads
                        else None))
        return res

    pooled = measure_in_rounds(list(steps), measure, rounds, log, title)
    for label, res in zip(steps, pooled):
        out[label] = (dict(error=res.error) if res.error else
                      dict(times=res.times, threads=res.threads))
    return out


def seeded_input(shape: Sequence[int], seed: int = 0) -> Any:
    """The input every exported runtime gets: a seeded standard normal
    float32 array of ``shape``."""
    import numpy as np
    return np.random.default_rng(seed).standard_normal(shape).astype(
        np.float32)


def measure_exported(export: str,
                     jobs: Dict[str, Dict[str, Any]],
                     runtimes: Sequence[str] = ('onnxruntime', ),
                     warmup: int = 1,
                     repeats: int = 3,
                     rounds: int = 1,
                     threads: Optional[int] = None,
                     isolate: bool = True,
                     timeout: Optional[float] = None,
                     profile_runs: int = 0,
                     log: Optional[Callable[[str], None]] = None,
                     title: str = '') -> Dict[Tuple[str, str], Dict]:
    """The models of a case exported once and timed in ``runtimes`` (the
    steps of the module docstring), each step in worker processes unless
    ``isolate`` is False.

    Args:
        export: ``'module:function'`` that exports and checks one model,
            called with a job of ``jobs`` and ``path``; it returns the
            export's keys (``input_shape`` if the input is not ``(batch, 3,
            *size)`` of the job) or ``error``.
        jobs: model name -> its export job.
        runtimes: some of :data:`EXPORTED_RUNTIMES`.
        warmup, repeats, rounds, threads: see :func:`time_exported`.
        timeout: seconds after which a worker is killed; the timing worker
            gets it once per session and round.
        profile_runs: if positive, ONNX Runtime's profile of that many runs
            of each file (``ort_profile``, ``{'error': ...}`` if it failed).
        log: called with a line per session and round (default
            :func:`~pola_mm.analysis.benchmark.results.print_line`).
        title: the title of the log lines.

    Returns:
        (runtime, name) -> the export's keys, the memory's and the
        timing's together, or ``error``.
    """
    bad = [r for r in runtimes if r not in EXPORTED_RUNTIMES]
    if bad:
        raise ValueError(f'runtimes must be among {EXPORTED_RUNTIMES}, got '
                         f'{bad}')
    outs: Dict[Tuple[str, str], Dict] = {}
    files: Dict[str, Dict[str, Any]] = {}
    labels: List[Tuple[str, str]] = []
    tmp = tempfile.mkdtemp(prefix='pola_mm_bench_')
    try:
        for i, (name, job) in enumerate(jobs.items()):
            path = osp.join(tmp, str(i), 'model.onnx')
            os.makedirs(osp.dirname(path))
            out = measure_in(export, dict(job, path=path), isolate, timeout)
            if 'error' not in out and not osp.exists(path):
                out['error'] = f'no ONNX file at {path}'
            shape = out.get('input_shape') or (
                [job.get('batch', 1), 3] + list(job['size']))
            for rt in runtimes:
                outs[rt, name] = dict(out)
                if 'error' in out:
                    continue
                on = dict(path=path, runtime=rt, shape=shape)
                outs[rt, name].update(measure_in(
                    'pola_mm.analysis.benchmark.onnxrt:exported_memory',
                    dict(on, warmup=warmup, threads=threads), isolate,
                    timeout))
                if 'error' not in outs[rt, name]:
                    files[f'{name} in {rt}'] = on
                    labels.append((rt, name))
        if files:
            timed = measure_in(
                'pola_mm.analysis.benchmark.onnxrt:time_exported',
                dict(files=files, warmup=warmup, repeats=repeats,
                     rounds=rounds, threads=threads, title=title),
                isolate, timeout and timeout * len(files) * rounds,
                log or print_line)
            for key, label in zip(labels, files):
                outs[key].update(timed.get(label) or dict(
                    error=timed.get('error', 'not timed')))
        for (rt, name), f in zip(labels, files.values()):
            if profile_runs and rt == 'onnxruntime' and \
                    'error' not in outs[rt, name]:
                prof = measure_in(
                    'pola_mm.analysis.benchmark.ortprofile:'
                    'profile_onnxruntime',
                    dict(path=f['path'], size=f['shape'][2:],
                         batch=f['shape'][0], threads=threads,
                         runs=profile_runs), isolate, timeout)
                # a failed profile keeps the timing; reported as such
                outs[rt, name]['ort_profile'] = prof.get(
                    'ort_profile') or dict(error=prof.get('error',
                                                          'no profile'))
        return outs
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
