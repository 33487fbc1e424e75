#!/usr/bin/env python
"""The GPU check's whole-model measurement and its closing table
(``make gpu-check``, tools/gpu_check.sh).

    # a whole detector and its softmax counterpart, training steps under AMP
    python tools/analysis/gpu_table.py whole \\
        configs/mask_rcnn_pola_swin_t.py --amp fp16 --json whole.json
    # the table of Pola / softmax ratios from benchmark.py --json files
    python tools/analysis/gpu_table.py table train.json fp16.json \\
        infer.json --whole whole.json
"""
import argparse
import gc
import json
import os.path as osp
import sys

sys.path.insert(0, osp.dirname(osp.dirname(osp.dirname(osp.abspath(
    __file__)))))
from pola_mm.cli import quiet_tool_warnings  # noqa: E402

quiet_tool_warnings()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    sub = parser.add_subparsers(dest='command', required=True)
    whole = sub.add_parser('whole', help='a detector config and its softmax '
                           'counterpart, training steps, side by side')
    whole.add_argument('config')
    whole.add_argument('--amp', choices=['fp16', 'bf16'], default=None)
    whole.add_argument('--size', default='800x1344', help='HxW')
    whole.add_argument('--batch', type=int, default=2)
    whole.add_argument('--steps', type=int, default=5)
    whole.add_argument('--warmup', type=int, default=2)
    whole.add_argument('--device', default='cuda')
    whole.add_argument('--json', help='write both results')
    table = sub.add_parser('table', help='the ratio table')
    table.add_argument('bench', nargs='+', help='benchmark.py --json files')
    table.add_argument('--whole', help='this tool\'s whole --json file')
    args = parser.parse_args()

    from pola_mm.analysis.gpu_check import (kernel_table, measure_whole_train,
                                            ratio_table)
    if args.command == 'table':
        results = []
        for path in args.bench:
            if osp.isfile(path):
                with open(path) as f:
                    results += json.load(f)
        whole_results = None
        if args.whole and osp.isfile(args.whole):
            with open(args.whole) as f:
                whole_results = json.load(f)
        print(ratio_table(results, whole_results))
        print()
        print(kernel_table(results))
        return 0

    import torch

    from pola_mm.analysis.zoo import counterpart
    hw = tuple(int(s) for s in args.size.lower().split('x'))
    out = {}
    for key, spec in (('pola', args.config),
                      ('softmax', counterpart(args.config))):
        r = measure_whole_train(spec, args.batch, hw, args.amp, args.steps,
                                args.warmup, args.device)
        mem = (f', peak {r["peak_mem_mb"]:.0f} MiB'
               if r['peak_mem_mb'] is not None else '')
        print(f'{key}: {r["time_median"]:.3f} s per step{mem}, losses '
              f'{[round(v, 3) for v in r["losses"]]}', flush=True)
        out[key] = r
        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
    ratio = out['pola']['time_median'] / out['softmax']['time_median']
    print(f'ratio: time {ratio:.2f}x')
    if args.json:
        with open(args.json, 'w') as f:
            json.dump(out, f, indent=1)
    return 0


if __name__ == '__main__':
    sys.exit(main())
