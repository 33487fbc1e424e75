#!/usr/bin/env python
"""Compile every Triton kernel launch of the attention ops for real GPU
architectures (no GPU needed) and check each build's resources.

Each build's registers, local memory (spills), shared memory and occupancy
on sm_80 / sm_86 / sm_89 / sm_90; exit status 1 when a build fails to
compile, asks for more shared memory than its target allows, or spills
(pola_mm.analysis.kernel_resources). Examples::

    # everything the dispatch can pick (every head width the kernels take,
    # dtype, flag and target: 1620 builds, about 6 minutes on 2 cores)
    python tools/analysis/kernel_resources.py --json resources.json
    # the shipped models' head widths, as a table for docs/performance.md
    python tools/analysis/kernel_resources.py --d 32 64 \\
        --dtypes float32 float16 --markdown
    # bytes read and written per launch at a shape (arithmetic), no build
    python tools/analysis/kernel_resources.py --traffic --shape 2,3,3136,32

``TRITON_INTERPRET`` is removed from this process's environment: the
kernels must be compiled kernels, not the CPU interpreter's. Triton's
cache is a new temporary folder per run unless ``--cache-dir`` names one.
"""
import argparse
import json
import os
import os.path as osp
import sys
import time

os.environ.pop('TRITON_INTERPRET', None)  # before any kernel is defined
sys.path.insert(0, osp.dirname(osp.dirname(osp.dirname(osp.abspath(
    __file__)))))
from pola_mm.cli import quiet_tool_warnings  # noqa: E402

quiet_tool_warnings()


def _option(text: str) -> tuple:
    key, _, value = text.partition('=')
    if not key.isidentifier() or not value.lstrip('-').isdigit():
        raise argparse.ArgumentTypeError(f'expected NAME=N, got {text!r}')
    return key, int(value)


def _shape(text: str) -> tuple:
    parts = tuple(int(p) for p in text.split(','))
    if len(parts) not in (4, 5):
        raise argparse.ArgumentTypeError(
            f'expected B,h,N,d or B,h,N,d,n, got {text!r}')
    return parts


def parse_args() -> argparse.Namespace:
    from pola_mm.analysis.kernel_resources import (CAPTURE_SHAPE, DTYPES, OPS,
                                                   STAGES)
    from pola_mm.ops.launch import TARGETS
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument('--targets', nargs='+', choices=list(TARGETS),
                        default=list(TARGETS))
    parser.add_argument('--d', nargs='+', type=int,
                        help='head widths (default: every width the ops\' '
                        'fits() accept)')
    parser.add_argument('--dtypes', nargs='+', choices=list(DTYPES),
                        default=list(DTYPES))
    parser.add_argument('--ops', nargs='+', choices=OPS, default=list(OPS))
    parser.add_argument('--kernels', nargs='+', choices=STAGES,
                        help='only these kernels (default: all four)')
    parser.add_argument('--flags', nargs='+', metavar='NAME=0|1',
                        help='only configurations with these flag values '
                        '(bias, rotary, scaled, atomic, need_v), e.g. '
                        'bias=0 need_v=1')
    parser.add_argument('--jobs', type=int, default=2,
                        help='compiling worker processes')
    parser.add_argument('--override', nargs='+', type=_option, default=[],
                        metavar='OPTION=N',
                        help='force a launch option (num_warps, '
                        'num_stages, maxnreg) or a kernel argument (e.g. '
                        'BLOCK) on every launch that has it: what-if '
                        'builds')
    parser.add_argument('--capture', type=int, nargs=3,
                        default=list(CAPTURE_SHAPE), metavar=('B', 'h', 'N'),
                        help='the captured inputs\' shape (integer '
                        'arguments are specialised by value)')
    parser.add_argument('--cache-dir', help='Triton cache of the builds '
                        '(default: a new temporary folder, removed)')
    parser.add_argument('--markdown', action='store_true',
                        help='print a Markdown table (docs/performance.md)')
    parser.add_argument('--failures-only', action='store_true',
                        help='print only the failing builds')
    parser.add_argument('--json', metavar='OUT', help='write every row')
    parser.add_argument('--traffic', action='store_true',
                        help='instead: bytes each kernel reads and writes '
                        'at --shape, against the bound (arithmetic)')
    parser.add_argument('--shape', type=_shape, default=(2, 3, 3136, 32),
                        metavar='B,h,N,d[,n]',
                        help='the shape of --traffic (n keys; default N)')
    parser.add_argument('--sms', type=int, default=132,
                        help='multiprocessors of the GPU for --traffic\'s '
                        'chunk split (132: H100 SXM)')
    return parser.parse_args()


def _flag_filter(texts) -> dict:
    out = {}
    for text in texts or ():
        name, _, value = text.partition('=')
        if value not in ('0', '1'):
            raise SystemExit(f'--flags: expected NAME=0|1, got {text!r}')
        out[name] = value == '1'
    return out


def main() -> int:
    args = parse_args()
    from pola_mm.analysis import kernel_resources as kr
    wanted = _flag_filter(args.flags)
    ds = [args.shape[3]] if args.traffic else args.d
    try:
        configs = [c for c in kr.configurations(args.ops, ds, args.dtypes)
                   if all(dict(c.flags).get(k, v) == v
                          for k, v in wanted.items())]
    except ValueError as exc:
        print(f'kernel_resources: {exc}', file=sys.stderr)
        return 2

    if args.traffic:
        try:
            reports = [kr.estimate_traffic(c, args.shape, sms=args.sms)
                       for c in configs]
        except ValueError as exc:
            print(f'kernel_resources: {exc}', file=sys.stderr)
            return 2
        print(f'bytes per call at B,h,N,d[,n] = {args.shape} (arithmetic '
              'from the launches\' tensor arguments, not a measurement)')
        print(kr.format_traffic(reports, markdown=args.markdown))
        if args.json:
            with open(args.json, 'w') as f:
                json.dump([dict(op=r.config.op, dtype=r.config.dtype,
                                flags=dict(r.config.flags), shape=r.shape,
                                keys=r.keys,
                                launches=r.launches, glue=r.glue,
                                bound=r.bound) for r in reports], f,
                          indent=1)
        return 0

    start = time.perf_counter()
    launches = kr.capture_launches(configs, args.targets,
                                   capture=tuple(args.capture),
                                   override=dict(args.override))
    if args.kernels:
        launches = [x for x in launches if x.stage in args.kernels]
    builds = kr.unique_builds(launches)
    print(f'{len(launches)} launches captured, {len(builds)} distinct '
          f'builds; compiling with {args.jobs} workers', file=sys.stderr,
          flush=True)
    rows = kr.compile_builds(
        builds, jobs=args.jobs, cache_dir=args.cache_dir,
        progress=lambda line: print(line, file=sys.stderr, flush=True))
    wall = time.perf_counter() - start
    bad = kr.failures(rows)
    print(kr.format_table(bad if args.failures_only else rows,
                          markdown=args.markdown))
    seconds = sorted(r['seconds'] for r in rows) or [0.0]
    print(f'\n{len(rows)} builds, {len(bad)} failing; {wall:.0f} s wall, '
          f'build time median {seconds[len(seconds) // 2]:.1f} s, '
          f'max {seconds[-1]:.1f} s')
    if args.json:
        with open(args.json, 'w') as f:
            json.dump(dict(rows=rows, wall_seconds=wall,
                           capture=list(args.capture),
                           override=dict(args.override)), f, indent=1)
    return 1 if bad else 0


if __name__ == '__main__':
    sys.exit(main())
