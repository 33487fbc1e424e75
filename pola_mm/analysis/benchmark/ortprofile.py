"""Where an exported model spends its time in ONNX Runtime.

:func:`profile_onnxruntime` loads the file in a session with ONNX Runtime's
own profiler on (``SessionOptions.enable_profiling``), runs it once to warm
up and then ``runs`` times, and sums the kernel time of every node over the
profiled runs (ms per run):

- **per part**, the top-level module a node belongs to, read from the scope
  the TorchScript exporter writes into node and tensor names
  (``/backbone/...``, ``/neck/...``, ``/roi_head/...`` in a whole model;
  ``/patch_embed/...``, ``/layers.0/...`` in a backbone). Nodes that ONNX
  Runtime creates while optimising the graph (fusions, layout changes)
  have names of their own: they take the scope of their first scoped output,
  else input, in the optimised graph (written next to the profile and read
  back). What has no scope at all (graph-level post-processing such as the
  detectors' ``TopK`` and NMS) is ``'(graph)'``.
- **per operator type** (``Gemm``, ``Transpose``, ...), as executed.

The benchmark's ``--ort-profile`` runs it in a worker process of its own
per file, after the timed runs (profiling slows a run down), and prints the
parts, the largest operators and, for a whole model paired with a baseline, the
**floor** of the time ratio (:func:`ratio_floor`): what the model's neck,
heads and post-processing alone cost against the baseline's whole kernel
time, the lowest ratio any backbone could reach.
"""
import json
import os.path as osp
import re
import shutil
import tempfile
from typing import Any, Dict, Iterable, List, Optional, Sequence

from .onnxrt import seeded_input
from .worker import Size

__all__ = ['GRAPH_PART', 'scope_of', 'profile_onnxruntime', 'ratio_floor',
           'profile_lines']

#: The part of nodes without any module scope.
GRAPH_PART = '(graph)'

_SCOPE = re.compile(r'^/([^/]+)/')


def scope_of(names: Iterable[str]) -> Optional[str]:
    """The top-level module scope of the first scoped name among
    ``names`` (``'/backbone/layers.0/MatMul'`` -> ``'backbone'``), or
    None."""
    for name in names:
        m = _SCOPE.match(name or '')
        if m:
            return m.group(1)
    return None


def _node_parts(optimised: str) -> Dict[str, str]:
    """Node name -> part, for every node of the optimised graph."""
    import onnx
    model = onnx.load(optimised, load_external_data=False)
    parts = {}
    for node in model.graph.node:
        parts[node.name] = (scope_of([node.name]) or scope_of(node.output)
                            or scope_of(node.input) or GRAPH_PART)
    return parts


def profile_onnxruntime(path: str,
                        size: Size = (224, 224),
                        batch: int = 1,
                        threads: Optional[int] = None,
                        runs: int = 2,
                        seed: int = 0) -> Dict[str, Any]:
    """Profile ``runs`` runs of the ONNX file ``path`` on the CPU after one
    warm-up (see the module docstring), on a seeded standard normal input of
    ``(batch, 3, H, W)``, the input the benchmark times
    (:func:`~pola_mm.analysis.benchmark.onnxrt.open_session`).

    Returns:
        ``{'ort_profile': {'runs', 'kernel_ms', 'parts', 'ops'}}``:
        ``kernel_ms`` is the kernel time of one run summed over its nodes,
        ``parts`` and ``ops`` map a part or an operator type to its ms per
        run, largest first. The profile and the optimised graph are
        written to a temporary directory and removed.
    """
    import onnxruntime as ort

    if runs < 1:
        raise ValueError(f'runs must be at least 1, got {runs}')
    tmp = tempfile.mkdtemp(prefix='pola_mm_ort_profile_')
    try:
        opts = ort.SessionOptions()
        if threads:
            opts.intra_op_num_threads = int(threads)
        opts.enable_profiling = True
        opts.profile_file_prefix = osp.join(tmp, 'profile')
        optimised = osp.join(tmp, 'optimised.onnx')
        opts.optimized_model_filepath = optimised
        opts.log_severity_level = 3  # no warning on writing an NCHWc graph
        sess = ort.InferenceSession(path, opts,
                                    providers=['CPUExecutionProvider'])
        feed = {sess.get_inputs()[0].name: seeded_input(
            (batch, 3) + tuple(size), seed)}
        for _ in range(runs + 1):
            sess.run(None, feed)
        with open(sess.end_profiling()) as f:
            events = json.load(f)
        node_parts = _node_parts(optimised)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    starts = sorted(e['ts'] for e in events if e.get('name') == 'model_run')
    if len(starts) < runs + 1:
        raise RuntimeError(f'ONNX Runtime profiled {len(starts)} runs of '
                           f'{path}, expected {runs + 1}')
    first = starts[1]  # the warm-up run is left out
    parts: Dict[str, float] = {}
    ops: Dict[str, float] = {}
    suffix = '_kernel_time'
    for e in events:
        name = e.get('name', '')
        if e.get('cat') != 'Node' or not name.endswith(suffix) or \
                e['ts'] < first:
            continue
        node = name[:-len(suffix)]
        ms = e['dur'] / 1000 / runs
        part = node_parts.get(node) or scope_of([node]) or GRAPH_PART
        parts[part] = parts.get(part, 0.) + ms
        op = e.get('args', {}).get('op_name', '?')
        ops[op] = ops.get(op, 0.) + ms

    def ranked(d: Dict[str, float]) -> Dict[str, float]:
        return dict(sorted(d.items(), key=lambda kv: -kv[1]))

    return dict(ort_profile=dict(runs=runs, kernel_ms=sum(parts.values()),
                                 parts=ranked(parts), ops=ranked(ops)))


def ratio_floor(profile: Dict[str, Any], base_profile: Dict[str, Any],
                backbone: str = 'backbone') -> Optional[float]:
    """The lowest time ratio a whole model could reach against its
    baseline with a backbone that cost nothing: the kernel time of its
    parts other than ``backbone`` and :data:`GRAPH_PART` (which may hold
    nodes of any part) over the baseline's whole kernel time. None without
    a ``backbone`` part or a baseline time."""
    parts = profile.get('parts', {})
    if backbone not in parts or not base_profile.get('kernel_ms'):
        return None
    rest = sum(ms for part, ms in parts.items()
               if part not in (backbone, GRAPH_PART))
    return rest / base_profile['kernel_ms']


def profile_lines(results: Sequence[Any], top: int = 6) -> List[str]:
    """Lines for results that carry an ``ort_profile``: each model's
    ``top`` parts and operator types (ms per run and share of its kernel
    time; the rest summed), then the floor of each whole model's ratio
    against its baseline (:func:`ratio_floor`)."""
    lines = [f'{r.name}: no profile: {r.ort_profile["error"]}'
             for r in results if (getattr(r, 'ort_profile', None) or {}).get(
                 'error')]
    with_profile = [r for r in results if getattr(r, 'ort_profile', None)
                    and 'error' not in r.ort_profile]
    for r in with_profile:
        p = r.ort_profile
        total = p['kernel_ms'] or 1.

        def share(d: Dict[str, float], total: float = total) -> str:
            items = list(d.items())
            words = [f'{k} {ms:.0f} ({ms / total:.0%})'
                     for k, ms in items[:top]]
            if len(items) > top:
                rest = sum(ms for _, ms in items[top:])
                words.append(f'{len(items) - top} more {rest:.0f} '
                             f'({rest / total:.0%})')
            return ', '.join(words)

        timed = ('' if r.time_median is None else
                 f' (median of the timed runs {r.time_median:.3f} s)')
        lines.append(f'{r.name}: {p["kernel_ms"]:.0f} ms of kernels per '
                     f'run{timed}; parts: {share(p["parts"])}; operators: '
                     f'{share(p["ops"])}')
    by_name = {r.name: r for r in with_profile}
    for r in with_profile:
        base = by_name.get(r.baseline) if r.baseline else None
        if base is None or r.exporter != 'mmdeploy':
            continue
        floor = ratio_floor(r.ort_profile, base.ort_profile)
        if floor is not None:
            lines.append(
                f'{r.name} against {base.name}: its parts other than the '
                f'backbone alone take {floor:.2f}x of {base.name}\'s kernel '
                f'time, so no backbone can bring the ratio below {floor:.2f}')
    return lines
