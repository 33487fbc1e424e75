"""Tests of the benchmark function (fields, isolation, tables); no timing."""
import json
import os
import os.path as osp
import re
import subprocess
import sys

import pytest
from helpers import PVT_TINY, REPO, SWIN_TINY_DEPTH1, load_tool

from pola_mm.analysis.benchmark import (BenchmarkCase, BenchmarkResult,
                                        benchmark_model, compute_growth,
                                        compute_ratios, format_table,
                                        parse_size, plot_results,
                                        run_benchmarks)
from pola_mm.analysis.zoo import build, zoo

pytestmark = [pytest.mark.slow, pytest.mark.export]

CONV = dict(type='torch.nn:Conv2d', in_channels=3, out_channels=4,
            kernel_size=3)
SWIN_CFG = dict(type='PolaSwinTransformer', arch=SWIN_TINY_DEPTH1)
PVT_CFG = dict(type='PolaPVT', arch=PVT_TINY)


def _has_backbones() -> bool:
    import pola_mm  # noqa: F401
    from pola_mm.registry import MODELS
    return MODELS.get('PolaSwinTransformer') is not None and MODELS.get(
        'PolaPVT') is not None


def test_parse_size():
    assert parse_size('224') == (224, 224)
    assert parse_size('800x1344') == (800, 1344)
    assert parse_size(32) == (32, 32)
    assert parse_size((3, 5)) == (3, 5)
    with pytest.raises(ValueError):
        parse_size('1x2x3')


@pytest.mark.parametrize('mode', ['infer', 'train'])
def test_isolated_worker_returns_fields(mode):
    r = benchmark_model(CONV, mode=mode, size='16x24', batch=2, warmup=1,
                        repeats=2, threads=1, name='conv', timeout=300)
    assert r.error is None, r.error
    assert (r.name, r.mode, r.size, r.batch) == ('conv', mode, (16, 24), 2)
    assert len(r.times) == 2 and all(t > 0 for t in r.times)
    assert r.time_min <= r.time_median
    assert r.peak_mem_mb >= r.base_mem_mb > 0
    assert r.extra_mem_mb >= 0
    assert r.threads == 1
    assert r.num_params == 4 * 3 * 9 + 4
    json.dumps(r.to_dict())


def test_isolation_runs_in_another_process():
    """The worker's peak memory is its own: a big allocation here does not
    show in it, while an in-process measurement sees it."""
    import resource

    import numpy as np
    ballast = np.ones(300 * 2**20 // 8)  # 300 MiB touched in this process
    mine = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    r = benchmark_model(CONV, size=8, repeats=1, timeout=300)
    local = benchmark_model(CONV, size=8, repeats=1, isolate=False)
    assert r.error is None and local.error is None
    assert local.peak_mem_mb >= mine
    assert r.peak_mem_mb < local.peak_mem_mb - 200
    del ballast


def test_worker_error_is_reported():
    r = benchmark_model(dict(type='torch.nn:Conv2d', in_channels=5,
                             out_channels=4, kernel_size=3), size=8,
                        repeats=1, timeout=300)
    assert r.error is not None and 'RuntimeError' in r.error
    assert r.time_median is None
    r = benchmark_model('no_such_model', size=8, repeats=1, timeout=300)
    assert 'KeyError' in r.error


def test_results_share_the_step_fields_and_round_trip_json():
    """BenchmarkResult and SeqLenResult take the steps, memory and error
    from StepMemory (declared once), keep their own required fields first,
    and read back what they wrote as JSON."""
    from dataclasses import fields

    from pola_mm.analysis.benchmark import SeqLenResult
    from pola_mm.analysis.benchmark.worker import StepMemory
    shared = [f.name for f in fields(StepMemory)]
    assert shared == ['times', 'time_median', 'peak_mem_mb', 'base_mem_mb',
                      'threads', 'error']
    for cls, own in ((BenchmarkResult, 'name'), (SeqLenResult, 'method')):
        names = [f.name for f in fields(cls)]
        assert names[0] == own and names.count('times') == 1
        assert 'times' not in cls.__dict__.get('__annotations__', {})
    r = BenchmarkResult('swin_t', 'infer', (8, 16), 1, 'cpu', 'float32',
                        title='t')
    r.record(dict(times=[0.3, 0.1, 0.2], peak_mem_mb=300.0,
                  base_mem_mb=120.0, threads=2))
    assert r.time_median == 0.2 and r.extra_mem_mb == 180.0
    d = json.loads(json.dumps(r.to_dict()))
    assert d['size'] == [8, 16] and d['extra_mem_mb'] == 180.0
    assert BenchmarkResult.from_dict(d) == r
    s = SeqLenResult('naive', 'fwd', 64, (8, 8), 1, 1, 32, 'cpu',
                     skipped='cap')
    assert SeqLenResult.from_dict(json.loads(json.dumps(s.to_dict()))) == s


def _fake(name, title, size, t, mem, base=100.0, mode='infer'):
    return BenchmarkResult(
        name=name, mode=mode, size=size, batch=1, device='cpu',
        dtype='float32', times=[t], time_median=t, time_min=t,
        peak_mem_mb=mem, base_mem_mb=base, title=title)


def test_ratios_growth_goals_and_table(tmp_path):
    rs = [
        _fake('pola_pvt_t', 'PVT-T infer 800x1344', (800, 1344), 1.0, 1000),
        _fake('pvt_t', 'PVT-T infer 800x1344', (800, 1344), 4.0, 2000),
        _fake('pola_pvt_t', 'PVT-T infer 1600x2688', (1600, 2688), 4.2, 3000),
        _fake('pvt_t', 'PVT-T infer 1600x2688', (1600, 2688), 40.0, 9000),
    ]
    ratios = compute_ratios(rs)
    assert ratios[0] == pytest.approx((0.25, 0.5))
    assert ratios[2] == pytest.approx((4.2 / 40, 3000 / 9000))
    assert 1 not in ratios and 3 not in ratios
    growth = compute_growth(rs)
    assert any('pola_pvt_t' in g and 'time x4.20' in g for g in growth)
    goals = load_tool('analysis', 'benchmark.py').check_goals(rs)
    assert any('PVT-T infer 800x1344 time <= 0.5: 0.25 ok' in g
               for g in goals)
    assert any('growth' in g and 'ok' in g for g in goals)
    assert any('Swin-T train 224 b8' in g and 'not measured' in g
               for g in goals)
    table = format_table(rs + [BenchmarkResult(
        'swin_t', 'infer', (8, 8), 1, 'cpu', 'float32', error='boom')])
    assert '| 0.25 | 0.50 |' in table and 'failed: boom' in table
    pytest.importorskip('matplotlib')
    png = tmp_path / 'p.png'
    plot_results(rs, str(png))
    assert png.stat().st_size > 0


def test_run_benchmarks_rounds_pool_times(monkeypatch):
    monkeypatch.setitem(zoo(), 'conv', CONV)
    case = BenchmarkCase('conv', ('conv', ), 'infer', (8, 8), 1)
    lines = []
    rs = run_benchmarks([case], rounds=2, log=lines.append, repeats=1,
                        timeout=300)
    assert len(rs) == 1 and rs[0].error is None, rs[0].error
    assert len(rs[0].times) == 2 and rs[0].title == 'conv'
    assert len(lines) == 2


@pytest.mark.skipif(not _has_backbones(), reason='backbones not built yet')
@pytest.mark.parametrize('cfg', [SWIN_CFG, PVT_CFG])
@pytest.mark.parametrize('mode', ['infer', 'train'])
def test_tiny_pola_backbones(cfg, mode):
    r = benchmark_model(cfg, mode=mode, size='64x96', batch=1, repeats=1,
                        timeout=300)
    assert r.error is None, r.error
    assert r.num_params > 0 and len(r.times) == 1 and r.times[0] > 0
    assert '| custom |' in format_table([r])


@pytest.mark.skipif(not _has_backbones(), reason='backbones not built yet')
def test_onnxruntime_mode_checks_times_and_pairs(monkeypatch):
    """--runtime onnxruntime: each model exported, checked against PyTorch
    and timed in ONNX Runtime; a tiny Pola-Swin against a stand-in for its
    softmax baseline (in this process, to stay fast; the worker path is
    the next test)."""
    pytest.importorskip('onnxruntime')
    monkeypatch.setitem(zoo(), 'pola_swin_t', SWIN_CFG)
    monkeypatch.setitem(zoo(), 'swin_t', CONV)
    case = BenchmarkCase('ort 64', ('pola_swin_t', 'swin_t'), 'infer',
                         (64, 64), 1)
    lines = []
    rs = run_benchmarks([case], log=lines.append, repeats=2, isolate=False,
                        runtime='onnxruntime', profile_runs=2)
    for r in rs:
        assert r.error is None, r.error
        assert r.runtime == 'onnxruntime' and r.exporter == 'torchscript'
        assert len(r.times) == 2 and all(t > 0 for t in r.times)
        assert 0 < r.time_min <= r.time_median
        assert r.peak_mem_mb >= r.base_mem_mb > 0
        assert 0 <= r.onnx_rel_diff < 1e-4
        assert r.export_s > 0 and r.opset > 0 and r.ort_version
        assert r.num_params > 0
        # ONNX Runtime's profile: every kernel counted once by part and
        # once by operator
        p = r.ort_profile
        assert p['runs'] == 2 and p['kernel_ms'] > 0
        assert sum(p['parts'].values()) == pytest.approx(p['kernel_ms'])
        assert sum(p['ops'].values()) == pytest.approx(p['kernel_ms'])
        assert list(p['parts'].values()) == sorted(p['parts'].values(),
                                                   reverse=True)
    # the Pola-Swin's parts are its top-level modules, read from the
    # exporter's scopes (nodes ONNX Runtime made included), and the patch
    # merging the backbone's downsample step runs between stages (the
    # tracer names it by the module's own name: downsample, downsample_1..)
    net = build(SWIN_CFG).model
    children = {name for name, _ in net.named_children()}
    parts = set(rs[0].ort_profile['parts']) - {'(graph)'}
    assert {'patch_embed', 'layers.0'} <= parts
    assert all(part.split('.')[0] in children
               or re.fullmatch(r'downsample(_\d+)?', part)
               for part in parts), parts
    assert rs[0].ort_profile['parts']['layers.0'] > 0
    assert {'MatMul', 'Gemm'} & set(rs[0].ort_profile['ops'])
    ratios = compute_ratios(rs)
    assert ratios[0][0] == pytest.approx(rs[0].time_median /
                                         rs[1].time_median)
    assert 1 not in ratios
    table = format_table(rs)
    assert '| ORT vs PyTorch |' in table and 'infer onnxruntime' in table
    assert 'export time (s): pola_swin_t' in table
    assert 'Fused CPU loops' not in table
    assert 'ONNX Runtime profile' in table
    assert '- pola_swin_t: ' in table and 'layers.0 ' in table
    # a PyTorch result of the same case is not its ONNX Runtime baseline
    torch_base = BenchmarkResult('swin_t', 'infer', (64, 64), 1, 'cpu',
                                 'float32', times=[1.0], time_median=1.0,
                                 time_min=1.0, peak_mem_mb=1.0,
                                 base_mem_mb=1.0, title='ort 64')
    assert compute_ratios([rs[0], torch_base]) == {}
    # beyond the tolerance the case fails, with the difference reported
    bad = benchmark_model(SWIN_CFG, size=64, repeats=1, isolate=False,
                          runtime='onnxruntime', rtol=1e-12)
    assert 'differs from PyTorch' in bad.error and bad.onnx_rel_diff > 0
    assert bad.time_median is None


def test_onnxruntime_mode_in_workers():
    """The ONNX Runtime mode in its worker processes: threads, memory and
    the check come back as JSON; training and GPUs are refused."""
    pytest.importorskip('onnxruntime')
    r = benchmark_model(CONV, size='16x24', repeats=2, threads=1,
                        name='conv', timeout=300, runtime='onnxruntime',
                        profile_runs=1)
    assert r.error is None, r.error
    # a bare conv has no module scope; the profile came from its worker
    assert set(r.ort_profile['parts']) == {'(graph)'}
    assert 'Conv' in r.ort_profile['ops'] and r.ort_profile['runs'] == 1
    assert r.threads == 1 and len(r.times) == 2 and r.time_median > 0
    assert r.peak_mem_mb >= r.base_mem_mb > 0
    assert 0 <= r.onnx_rel_diff < 1e-4 and r.num_params == 4 * 3 * 9 + 4
    assert BenchmarkResult.from_dict(json.loads(json.dumps(
        r.to_dict()))) == r
    r = benchmark_model(CONV, mode='train', size=8, runtime='onnxruntime')
    assert 'inference on the CPU in float32 only' in r.error
    with pytest.raises(ValueError, match='runtime must be'):
        benchmark_model(CONV, size=8, runtime='tensorrt')


def test_runner_alternates_pools_and_stops():
    """The one runner of every mode: rounds in alternating order, the
    times of a name pooled, a failed name not measured again, a stop rule
    that skips what is left."""
    from pola_mm.analysis.benchmark.results import measure_in_rounds
    from pola_mm.analysis.benchmark.worker import StepMemory
    calls, lines = [], []

    def measure(name):
        calls.append(name)
        if name == 'bad':
            return StepMemory(error='Boom')
        r = StepMemory()
        r.record(dict(times=[len(calls)], peak_mem_mb=float(len(calls))))
        return r

    rs = measure_in_rounds(['a', 'b', 'bad'], measure, 3, lines.append, 't')
    assert calls == ['a', 'b', 'bad', 'b', 'a', 'a', 'b']
    assert rs[0].times == [1, 5, 6] and rs[0].peak_mem_mb == 6.0
    assert rs[1].times == [2, 4, 7] and rs[2].error == 'Boom'
    assert lines[0] == '[t] round 1/3 a: 1.0000 s, peak 1 MiB'
    assert lines[2] == '[t] round 1/3 bad: error Boom' and len(lines) == 7
    calls.clear()
    rs = measure_in_rounds(
        ['a', 'b', 'c'], measure, 2, lines.append, 't',
        stop=lambda r: 'enough' if r.times[0] >= 2 else None,
        skip=lambda name, why: StepMemory(error=f'skipped: {why}'))
    assert calls == ['a', 'b'] and rs[2].error == 'skipped: enough'
    assert rs[0].times == [1] and rs[1].times == [2]


@pytest.mark.skipif(not _has_backbones(), reason='backbones not built yet')
def test_onnxruntime_and_openvino_from_one_export(monkeypatch):
    """--runtime onnxruntime openvino: each model exported and checked
    once, its memory in a process per runtime, and all four sessions timed
    in ONE worker, the order alternating from round to round; the rows
    carry the runtime and the ratios pair models within a runtime."""
    pytest.importorskip('onnxruntime')
    pytest.importorskip('openvino')
    from pola_mm.analysis.benchmark import onnxrt
    monkeypatch.setitem(zoo(), 'pola_swin_t', SWIN_CFG)
    monkeypatch.setitem(zoo(), 'swin_t', CONV)
    workers = []
    measure_in = onnxrt.measure_in

    def spy(measure, *args, **kwargs):
        workers.append(measure.split(':')[1])
        return measure_in(measure, *args, **kwargs)

    monkeypatch.setattr(onnxrt, 'measure_in', spy)
    case = BenchmarkCase('both 64', ('pola_swin_t', 'swin_t'), 'infer',
                         (64, 64), 1)
    lines = []
    rs = run_benchmarks([case], rounds=2, log=lines.append, repeats=2,
                        threads=1, timeout=300,
                        runtime=['onnxruntime', 'openvino'])
    assert workers == ['export_and_check', 'exported_memory',
                       'exported_memory', 'export_and_check',
                       'exported_memory', 'exported_memory',
                       'time_exported']
    order = [ln.split('] ')[1].split(':')[0] for ln in lines]
    first = ['pola_swin_t in onnxruntime', 'pola_swin_t in openvino',
             'swin_t in onnxruntime', 'swin_t in openvino']
    assert order == ['round 1/2 ' + o for o in first] + [
        'round 2/2 ' + o for o in reversed(first)]
    assert [(r.runtime, r.name) for r in rs] == [
        ('onnxruntime', 'pola_swin_t'), ('onnxruntime', 'swin_t'),
        ('openvino', 'pola_swin_t'), ('openvino', 'swin_t')]
    for r in rs:
        assert r.error is None, r.error
        assert len(r.times) == 4 and r.threads == 1 and r.time_median > 0
        assert r.peak_mem_mb >= r.base_mem_mb > 0
        assert 0 <= r.onnx_rel_diff < 1e-4 and r.exporter == 'torchscript'
    assert rs[0].export_s == rs[2].export_s  # one export per model
    assert rs[0].ort_version and rs[2].ov_version and not rs[2].ort_version
    ratios = compute_ratios(rs)
    assert set(ratios) == {0, 2}
    assert ratios[2][0] == pytest.approx(rs[2].time_median /
                                         rs[3].time_median)
    assert ratios[2][1] == pytest.approx(rs[2].peak_mem_mb /
                                         rs[3].peak_mem_mb)
    table = format_table(rs)
    assert 'infer openvino' in table and 'infer onnxruntime' in table
    assert 'ONNX Runtime ' in table and ' and OpenVINO ' in table
    assert 'peak memory of each file in each runtime' in table
    assert table.count('export time (s): pola_swin_t') == 1
    r = benchmark_model(CONV, size=8, repeats=1, isolate=False,
                        runtime='openvino')
    assert r.error is None and r.runtime == 'openvino' and r.ov_version


def test_cli_parses_the_onnxruntime_mode(monkeypatch):
    path = osp.join(REPO, 'tools', 'analysis', 'benchmark.py')
    tool = load_tool('analysis', 'benchmark.py')
    monkeypatch.setattr(sys, 'argv', [path, '--models', 'pola_pvt_t'])
    args = tool.parse_args()
    assert (args.runtime, args.exporter, args.opset) == (
        'pytorch', 'torchscript', None)
    monkeypatch.setattr(sys, 'argv', [
        path, '--runtime', 'onnxruntime', '--models', 'pola_swin_t',
        'swin_t', '--size', '800x1344', '--threads', '2', '--opset', '17'])
    args = tool.parse_args()
    assert (args.runtime, args.opset, args.threads) == ('onnxruntime', 17,
                                                        2)
    assert args.ort_profile is None
    for extra, runs in (['--ort-profile'], 2), (['--ort-profile', '5'], 5):
        monkeypatch.setattr(sys, 'argv', [
            path, '--runtime', 'onnxruntime', '--models', 'pvt_t'] + extra)
        assert tool.parse_args().ort_profile == runs
    monkeypatch.setattr(sys, 'argv', [
        path, '--runtime', 'onnxruntime', 'openvino', '--models', 'pvt_t'])
    args = tool.parse_args()
    assert args.runtimes == args.runtime == ['onnxruntime', 'openvino']
    for bad in ([], ['--runtime', 'openvino'],
                ['--runtime', 'pytorch', 'openvino']):
        monkeypatch.setattr(sys, 'argv', [path, '--ort-profile'] + bad)
        with pytest.raises(SystemExit):  # profiles ONNX Runtime only
            tool.parse_args()
    for bad in (['--mode', 'train'], ['--batch', '2'], ['--dtype', 'bf16'],
                ['--seqlen', '64'], ['--ort-profile', '0']):
        monkeypatch.setattr(sys, 'argv',
                            [path, '--runtime', 'onnxruntime'] + bad)
        with pytest.raises(SystemExit):
            tool.parse_args()


def test_profile_scopes_and_floor():
    """Parts come from the first scoped name; the floor of a whole
    model's ratio counts its parts other than the backbone and the
    unscoped nodes against the baseline's whole kernel time."""
    from pola_mm.analysis.benchmark.ortprofile import (GRAPH_PART,
                                                       profile_lines,
                                                       ratio_floor, scope_of)
    assert scope_of(['reorder_token_3', '/neck/fpn_convs.0/Conv_output_0',
                     '/backbone/x']) == 'neck'
    assert scope_of(['/Conv', 'Gelu_token_1', '']) is None
    prof = dict(runs=1, kernel_ms=100., parts={
        'backbone': 60., 'neck': 15., 'bbox_head': 15., GRAPH_PART: 10.},
        ops={'Gemm': 70., 'Conv': 30.})
    base = dict(runs=1, kernel_ms=120., parts={'backbone': 90., 'neck': 30.},
                ops={'Conv': 120.})
    assert ratio_floor(prof, base) == pytest.approx(30 / 120)
    assert ratio_floor(dict(prof, parts={'layers.0': 1.}), base) is None
    key = ('infer', (8, 8), 1, 'cpu', 'float32')
    a = BenchmarkResult('a', *key, times=[1.], time_median=1.,
                        exporter='mmdeploy', baseline='b', ort_profile=prof)
    b = BenchmarkResult('b', *key, times=[1.], time_median=1.,
                        exporter='mmdeploy', ort_profile=base)
    c = BenchmarkResult('c', *key, ort_profile=dict(error='Boom: no file'))
    lines = profile_lines([c, a, b], top=2)
    assert lines[0] == 'c: no profile: Boom: no file'
    assert lines[1].startswith('a: 100 ms of kernels per run')
    assert 'backbone 60 (60%), neck 15 (15%), 2 more 25 (25%)' in lines[1]
    assert 'operators: Gemm 70 (70%), Conv 30 (30%)' in lines[1]
    assert lines[3].endswith('no backbone can bring the ratio below 0.25')
    assert len(lines) == 4  # b has no baseline: no floor line


def test_cli_help():
    root = REPO
    out = subprocess.run(
        [sys.executable, osp.join(root, 'tools', 'analysis', 'benchmark.py'),
         '--help'], capture_output=True, text=True, env=dict(os.environ))
    assert out.returncode == 0 and '--preset' in out.stdout


def test_benchmark_knows_polapp_b2():
    """The benchmark compares polapp_b2 with its plain formula and with
    Pola-Swin-T; the plain variant is the zoo's model run with the fast
    paths off (and only while it runs)."""
    import torch

    from pola_mm.analysis.benchmark import PRESETS, baseline_of
    from pola_mm.models import PolaPP
    from pola_mm.ops import dispatch
    assert baseline_of('polapp_b2') == 'pola_swin_t'
    assert baseline_of('polapp_b2_plain') == 'polapp_b2'
    models = {m for case in PRESETS['polapp'] for m in case.models}
    assert models == {'polapp_b2', 'polapp_b2_plain', 'pola_swin_t'}
    with torch.device('meta'):
        built = build('polapp_b2_plain')
    assert isinstance(built.model, PolaPP) and not built.fast_paths
    assert dispatch.get_implementation() == 'auto'
    with built.paths():
        assert dispatch.get_implementation() == 'graph'
    assert dispatch.get_implementation() == 'auto'
