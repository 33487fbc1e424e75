#!/usr/bin/env python
"""Time and peak memory of Pola and softmax backbones, side by side.

Each model runs in its own process (exported models: exported once, then
the files of a case timed alternately in one process). Examples::

    # the performance goals (CPU; the large sizes take minutes and ~10 GB)
    python tools/analysis/benchmark.py --preset goals --rounds 2

    # one comparison
    python tools/analysis/benchmark.py --models pola_swin_t swin_t \\
        --mode train --size 224 --batch 8

    # PolaPP-b2 (PolaFormer++): PaCS kernel vs plain formula vs Pola-Swin-T
    python tools/analysis/benchmark.py --preset polapp

    # what is deployed: each backbone exported once (checked against
    # PyTorch), the files timed alternately in ONNX Runtime on the CPU,
    # with the same ratios
    python tools/analysis/benchmark.py --runtime onnxruntime \\
        --models pola_swin_t swin_t pola_pvt_t pvt_t --size 800x1344 \\
        --threads 2 --rounds 3

    # the same files in ONNX Runtime and OpenVINO (ratios within each)
    python tools/analysis/benchmark.py --runtime onnxruntime openvino \\
        --models pola_swin_t swin_t --size 800x1344 --threads 2 --rounds 3

    # whole detectors exported by MMDeploy (stock static ONNX Runtime
    # deploy configs at --size), checked against PyTorch and timed in ONNX
    # Runtime; ratios against the named baselines (mmdet's configs)
    python tools/analysis/benchmark.py --runtime onnxruntime --size 800x1344 \\
        --threads 2 --whole mask_rcnn_pola_swin_t mask_rcnn_swin_t \\
        retinanet_pola_pvt_t retinanet_pvt_t

    # the same with ONNX Runtime's profile: time by part and by operator,
    # and the lowest ratio any backbone could reach against the baseline
    python tools/analysis/benchmark.py --runtime onnxruntime --size 800x1344 \\
        --threads 2 --whole retinanet_pola_pvt_t retinanet_pvt_t --ort-profile

    # a sweep over resolutions with a plot
    python tools/analysis/benchmark.py --models pola_pvt_t pvt_t \\
        --size 256 512 800x1344 --plot pvt_sweep.png

    # the attention alone against sequence length (log-log plot, slopes)
    python tools/analysis/benchmark.py --seqlen 4096 16384 65536 200704 \\
        --device cuda --heads 1 --head-dims 64 --plot seqlen.png
"""
import argparse
import json
import os
import os.path as osp
import platform
import sys
import time

sys.path.insert(0, osp.dirname(osp.dirname(osp.dirname(osp.abspath(
    __file__)))))
from typing import Callable, List, Optional, Sequence, Tuple  # noqa: E402

from pola_mm.analysis.benchmark import DEFAULT_SEQ_METHODS  # noqa: E402
from pola_mm.analysis.benchmark import (PRESETS, RUNTIMES, SEQ_METHODS,
                                        SEQ_MODES, WHOLE_MODELS, BenchmarkCase,
                                        BenchmarkResult, compute_ratios,
                                        format_ratio, format_seqlen_table,
                                        format_table, parse_size, plot_results,
                                        plot_seqlen, run_benchmarks,
                                        run_seqlen, run_whole_benchmarks,
                                        size_str, whole_spec)
from pola_mm.analysis.zoo import zoo_names  # noqa: E402
from pola_mm.cli import quiet_tool_warnings  # noqa: E402

quiet_tool_warnings()

#: The performance goals ``--preset goals`` is checked against: (title of
#: the case, metric, largest allowed ratio of Pola over softmax).
GOALS: List[Tuple[str, str, float]] = [
    ('Swin-T train 224 b8', 'time', 1.0),
    ('PVT-T train 224 b8', 'time', 1.2),
    ('Swin-T infer 800x1344', 'time', 1.0),
    ('Swin-T infer 800x1344', 'mem', 1.0),
    ('Swin-T infer 1600x2688', 'time', 1.0),
    ('Swin-T infer 1600x2688', 'mem', 1.0),
    ('PVT-T infer 800x1344', 'time', 0.5),
    ('PVT-T infer 1600x2688', 'time', 0.2),
    ('PVT-T infer 1600x2688', 'mem', 0.4),
]


def check_goals(results: Sequence[BenchmarkResult],
                goals: Sequence[Tuple[str, str, float]] = GOALS,
                growth_limit: Optional[float] = 4.5) -> List[str]:
    """Compare the ratios with the performance goals; one line per goal.

    Args:
        results: results of the ``goals`` preset.
        goals: (case title, 'time' or 'mem', largest allowed ratio).
        growth_limit: largest allowed growth of Pola-PVT-T's inference time
            from 800x1344 to 1600x2688 (None: not checked).

    Returns:
        One line per goal: the measured ratio and ``ok`` or ``MISSED``, or
        ``not measured``.
    """
    ratios = compute_ratios(results)
    lines = []
    for title, metric, limit in goals:
        found = [ratios[i] for i, r in enumerate(results)
                 if r.title == title and i in ratios]
        if not found:
            lines.append(f'{title} {metric} <= {limit}: not measured')
            continue
        val = found[0][0 if metric == 'time' else 1]
        ok = val is not None and val <= limit
        lines.append(f'{title} {metric} <= {limit}: {format_ratio(val)} '
                     f'{"ok" if ok else "MISSED"}')
    if growth_limit is not None:
        pick = {tuple(r.size): r for r in results
                if r.name == 'pola_pvt_t' and r.mode == 'infer'
                and r.batch == 1 and r.error is None}
        a, b = pick.get((800, 1344)), pick.get((1600, 2688))
        if a is None or b is None:
            lines.append(f'pola_pvt_t growth <= {growth_limit}: not measured')
        else:
            g = b.time_median / a.time_median
            lines.append(f'pola_pvt_t growth 800x1344 -> 1600x2688 <= '
                         f'{growth_limit}: time x{g:.2f} '
                         f'{"ok" if g <= growth_limit else "MISSED"} '
                         f'(peak memory x{b.peak_mem_mb / a.peak_mem_mb:.2f})')
    return lines


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument('--preset', choices=sorted(PRESETS),
                        help='a named list of comparisons (overrides '
                        '--models/--size/--mode/--batch)')
    parser.add_argument('--models', nargs='+', default=['pola_swin_t'],
                        choices=zoo_names(), metavar='NAME',
                        help='models to measure (pola_mm.analysis.zoo): '
                        f'{", ".join(zoo_names())}')
    parser.add_argument('--mode', choices=['infer', 'train'], default='infer',
                        help='infer: no_grad forward; train: forward+backward')
    parser.add_argument('--size', nargs='+', default=['224'],
                        help='input sizes, N or HxW (several for a sweep)')
    parser.add_argument('--batch', type=int, default=1)
    parser.add_argument('--device', default='cpu', help='cpu, cuda, cuda:N')
    parser.add_argument('--dtype', default='float32',
                        choices=['float32', 'bf16', 'fp16'],
                        help='bf16/fp16 run under torch.autocast')
    parser.add_argument('--warmup', type=int, default=1)
    parser.add_argument('--repeats', type=int, default=3,
                        help='timed steps per process (median reported)')
    parser.add_argument('--rounds', type=int, default=1,
                        help='measure every comparison this many times, '
                        'alternating the order of the models')
    parser.add_argument('--threads', type=int, default=None,
                        help='torch.set_num_threads in each worker')
    parser.add_argument('--timeout', type=float, default=None,
                        help='seconds after which a worker is killed '
                        '(the one timing exported files: this much per file '
                        'and round)')
    parser.add_argument('--runtime', nargs='+', choices=RUNTIMES,
                        default=['pytorch'],
                        help='onnxruntime and/or openvino: export each '
                        'backbone once (the project\'s export_onnx), check '
                        'ONNX Runtime against PyTorch, then time the files '
                        'of a case (in each runtime) alternately in one '
                        'process (CPU, float32, inference; train cases of a '
                        'preset are left out)')
    parser.add_argument('--exporter', choices=['torchscript', 'dynamo'],
                        default='torchscript',
                        help='exporter of the exported runtimes (dynamo '
                        'for a batch other than 1)')
    parser.add_argument('--opset', type=int, default=None,
                        help='ONNX opset of the exported runtimes (default: '
                        "the exporter's)")
    parser.add_argument('--ort-profile', type=int, nargs='?', const=2,
                        metavar='RUNS',
                        help='--runtime onnxruntime: after the timed runs, '
                        'profile RUNS runs (default 2) with ONNX Runtime\'s '
                        'profiler and print the time by part (top-level '
                        'module: backbone, neck, heads; or stages) and by '
                        'operator, and for paired whole models the lowest '
                        'ratio any backbone could reach')
    whole = parser.add_argument_group(
        'whole models (--runtime onnxruntime [openvino]): exported by '
        'MMDeploy, checked against PyTorch, timed in the runtimes')
    whole.add_argument('--whole', nargs='+', metavar='NAME|CONFIG',
                       help='whole models to measure instead of backbones: '
                       f'{", ".join(WHOLE_MODELS)}, or config files '
                       '(mmdet::PATH for mmdet\'s own)')
    whole.add_argument('--pair', nargs=2, action='append', default=[],
                       metavar=('MODEL', 'BASELINE'),
                       help='compare MODEL with BASELINE (names as in '
                       '--whole, both measured); the zoo names have their '
                       'pairs')
    whole.add_argument('--deploy-cfg', metavar='FILE',
                       help='an MMDeploy static ONNX Runtime deploy config '
                       'for every whole model (default: the stock '
                       'detection or instance-seg config)')
    parser.add_argument('--plot', metavar='PNG',
                        help='write time and memory against resolution')
    parser.add_argument('--json', metavar='FILE', help='write raw results')
    seq = parser.add_argument_group(
        'sequence-length mode (the attention alone: polarity kernel + '
        'depth-wise conv, scaled_dot_product_attention, naive softmax)')
    seq.add_argument('--seqlen', nargs='+', type=int, metavar='N',
                     help='sequence lengths in tokens; selects this mode')
    seq.add_argument('--methods', nargs='+',
                     default=list(DEFAULT_SEQ_METHODS),
                     choices=SEQ_METHODS)
    seq.add_argument('--seq-modes', nargs='+', default=list(SEQ_MODES),
                     choices=SEQ_MODES)
    seq.add_argument('--heads', type=int, default=1)
    seq.add_argument('--head-dims', type=int, default=32)
    seq.add_argument('--mem-cap', type=float, default=8192, metavar='MIB',
                     help='skip naive softmax where its N x N matrices '
                     'need more (default 8192 MiB)')
    seq.add_argument('--time-cap', type=float, default=60, metavar='S',
                     help='stop a method after a step slower than this '
                     '(default 60 s)')
    args = parser.parse_args()
    # args.runtimes: the list; args.runtime: the runtime, or the list
    args.runtimes = list(dict.fromkeys(args.runtime))
    args.runtime = args.runtimes[0] if len(args.runtimes) == 1 else \
        args.runtimes
    exported = args.runtimes != ['pytorch']
    if exported and 'pytorch' in args.runtimes:
        parser.error('--runtime: pytorch, or onnxruntime and/or openvino')
    if args.whole or args.pair:
        if not exported:
            parser.error('--whole measures exported models: add --runtime '
                         'onnxruntime (and/or openvino)')
        if args.preset or args.seqlen or len(args.size) != 1 or \
                args.batch != 1 or args.opset is not None:
            parser.error('--whole takes one --size, batch 1, no --preset, '
                         '--seqlen or --opset (the deploy config sets the '
                         'opset)')
    if args.ort_profile is not None:
        if 'onnxruntime' not in args.runtimes:
            parser.error('--ort-profile profiles ONNX Runtime: add '
                         '--runtime onnxruntime')
        if args.ort_profile < 1:
            parser.error('--ort-profile takes a number of runs >= 1, got '
                         f'{args.ort_profile}')
    if exported:
        if args.seqlen:
            parser.error('--runtime onnxruntime/openvino measures '
                         'backbones, not the --seqlen mode')
        if args.device != 'cpu' or args.dtype != 'float32':
            parser.error('--runtime onnxruntime/openvino runs on the CPU in '
                         'float32')
        if args.mode != 'infer' and not args.preset:
            parser.error('--runtime onnxruntime/openvino measures inference '
                         'only (--mode infer)')
        if args.batch != 1 and args.exporter != 'dynamo':
            parser.error('a batch other than 1 in an exported runtime needs '
                         '--exporter dynamo')
    return args


def runtime_versions(args: argparse.Namespace, export: str) -> str:
    """``'onnxruntime 1.x, openvino 2025.x (EXPORT export), '`` for the
    exported runtimes of ``args`` ('' for PyTorch)."""
    import importlib
    words = [f'{rt} {importlib.import_module(rt).__version__.split("-")[0]}'
             for rt in args.runtimes if rt != 'pytorch']
    return f'{", ".join(words)} ({export} export), ' if words else ''


def run_watched(run: Callable[[], list]) -> Tuple[list, str]:
    """``run()``'s results and the conditions it ran under: ``'load
    average A at start, B at end; N s in all'``."""
    load0 = os.getloadavg()
    t0 = time.time()
    results = run()
    return results, (f'load average {load0[0]:.2f} at start, '
                     f'{os.getloadavg()[0]:.2f} at end; '
                     f'{time.time() - t0:.0f} s in all')


def write_json(results: Sequence, path: Optional[str]) -> None:
    """Write the raw results to ``path`` (``--json``), if given."""
    if path:
        with open(path, 'w') as f:
            json.dump([r.to_dict() for r in results], f, indent=1)


def main_seqlen(args: argparse.Namespace) -> None:
    """The sequence-length mode: run, print the table, write JSON/plot."""
    import torch
    results, watched = run_watched(lambda: run_seqlen(
        args.seqlen, args.methods, args.seq_modes, batch=args.batch,
        heads=args.heads, head_dims=args.head_dims, device=args.device,
        warmup=args.warmup, repeats=args.repeats, threads=args.threads,
        mem_cap_mb=args.mem_cap, time_cap_s=args.time_cap,
        log=lambda m: print(m, flush=True)))
    threads = sorted({r.threads for r in results if r.threads})
    print()
    print(f'torch {torch.__version__}, {os.cpu_count()} CPUs, threads '
          f'{threads}, device {args.device}, float32, batch {args.batch}, '
          f'{args.heads} head(s) of {args.head_dims}, median of '
          f'{args.repeats}; {watched}')
    print()
    print(format_seqlen_table(results))
    write_json(results, args.json)
    if args.plot:
        plot_seqlen(results, args.plot)
        print(f'plot written to {args.plot}')


def whole_models(args: argparse.Namespace) -> List[dict]:
    """The whole models of ``--whole`` and ``--pair``, each once, with
    their baselines (``--pair`` over the zoo's)."""
    names = list(args.whole or [])
    for model, base in args.pair:
        names += [n for n in (model, base) if n not in names]
    specs = [whole_spec(n) for n in names]
    by_arg = dict(zip(names, specs))
    for model, base in args.pair:
        by_arg[model]['baseline'] = by_arg[base]['name']
    if args.deploy_cfg:
        for spec in specs:
            spec['deploy_cfg'] = args.deploy_cfg
    return specs


def main_whole(args: argparse.Namespace) -> None:
    """The whole-model mode: run, print the table, write JSON."""
    import torch
    results, watched = run_watched(lambda: run_whole_benchmarks(
        whole_models(args), size=parse_size(args.size[0]),
        rounds=args.rounds, runtimes=args.runtimes, warmup=args.warmup,
        repeats=args.repeats, threads=args.threads, timeout=args.timeout,
        profile_runs=args.ort_profile or 0,
        log=lambda m: print(m, flush=True)))
    cpu = platform.processor() or platform.machine()
    print()
    print(f'torch {torch.__version__}, {runtime_versions(args, "MMDeploy")}'
          f'{cpu}, {os.cpu_count()} CPUs, threads '
          f'{args.threads or "default"}, batch 1, float32, warm-up '
          f'{args.warmup}, median of {args.repeats} x {args.rounds} '
          f'round(s); {watched}')
    print()
    print(format_table(results))
    write_json(results, args.json)


def main() -> None:
    args = parse_args()
    if args.seqlen:
        return main_seqlen(args)
    if args.whole or args.pair:
        return main_whole(args)
    if args.preset:
        cases = PRESETS[args.preset]
    else:
        cases = []
        for s in args.size:
            hw = parse_size(s)
            cases.append(
                BenchmarkCase(f'{args.mode} {size_str(hw)} b{args.batch}',
                              tuple(args.models), args.mode, hw, args.batch))
    if args.runtimes != ['pytorch']:
        left = [c.title for c in cases if c.mode != 'infer']
        cases = [c for c in cases if c.mode == 'infer']
        if left:
            print('exported models are measured in inference only; left '
                  'out: ' + ', '.join(left))
        if any(c.batch != 1 for c in cases) and args.exporter != 'dynamo':
            sys.exit('a batch other than 1 in an exported runtime needs '
                     '--exporter dynamo')
    import torch
    results, watched = run_watched(lambda: run_benchmarks(
        cases, rounds=args.rounds, log=lambda m: print(m, flush=True),
        device=args.device, dtype=args.dtype, warmup=args.warmup,
        repeats=args.repeats, threads=args.threads, timeout=args.timeout,
        runtime=args.runtimes, exporter=args.exporter, opset=args.opset,
        profile_runs=args.ort_profile or 0))
    threads = sorted({r.threads for r in results if r.threads})
    print()
    cpu = platform.processor() or platform.machine()
    runtime = runtime_versions(args, args.exporter)
    print(f'torch {torch.__version__}, {runtime}{cpu}, {os.cpu_count()} '
          f'CPUs, threads {threads}, device {args.device}, '
          f'dtype {args.dtype}, warm-up {args.warmup}, median of '
          f'{args.repeats} x {args.rounds} round(s); {watched}')
    print()
    print(format_table(results))
    if args.preset == 'goals':
        print()
        print('Performance goals:')
        for line in check_goals(results):
            print('- ' + line)
    write_json(results, args.json)
    if args.plot:
        plot_results(results, args.plot)
        print(f'plot written to {args.plot}')


if __name__ == '__main__':
    main()
