#!/usr/bin/env python
"""Activation memory a training step keeps for backward, without a GPU.

Builds the model with fake CUDA tensors (the GPU code path, nothing
computed) in training mode, runs a forward and adds up the distinct
storages autograd saves for backward; side by side with the softmax
counterpart (mmdet's Swin / PVT / PVTv2). See docs/performance.md.
Examples::

    python tools/analysis/train_memory.py pola_swin_t --batch 2 \\
        --shape 800 1344
    python tools/analysis/train_memory.py pola_pvt_t --batch 2 \\
        --shape 800 1344 --amp fp16 --per-module layers.0 block1
    python tools/analysis/train_memory.py configs/mask_rcnn_pola_swin_t.py \\
        --batch 2 --shape 800 1344
"""
import argparse
import json
import os.path as osp
import sys
import time

sys.path.insert(0, osp.dirname(osp.dirname(osp.dirname(osp.abspath(
    __file__)))))
from pola_mm.analysis.train_memory import (DEVICES, MiB,  # noqa: E402
                                           cuda_memory_check, format_breakdown,
                                           format_comparison, measure)
from pola_mm.analysis.zoo import counterpart, zoo_names  # noqa: E402
from pola_mm.cli import quiet_tool_warnings  # noqa: E402

quiet_tool_warnings()


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument('model', help='an OpenMMLab config file (.py) or a '
                        'backbone name of the zoo (pola_mm.analysis.zoo), '
                        'e.g. pola_swin_t, pola_pvt_t, polapp_b2, swin_t')
    parser.add_argument('--batch', type=int, default=2)
    parser.add_argument('--shape', type=int, nargs=2, default=[224, 224],
                        metavar=('H', 'W'))
    parser.add_argument('--amp', choices=['fp16', 'bf16'],
                        help='mixed precision (CUDA autocast on the fake '
                        'CUDA device; emulated on --device meta)')
    parser.add_argument('--device', choices=DEVICES, default='cuda',
                        help='cuda: fake CUDA tensors, the GPU code path '
                        '(default); meta: plain meta tensors; cpu: a real '
                        'CPU forward (slow at large sizes)')
    parser.add_argument('--per-module', nargs='*', metavar='PREFIX',
                        help='also list MiB per module and the biggest saved '
                        'storages under each PREFIX (default: the whole '
                        'model), e.g. layers.0.blocks.0')
    parser.add_argument('--top', type=int, default=15,
                        help='storages listed by --per-module')
    parser.add_argument('--no-compare', action='store_true',
                        help='skip the softmax counterpart')
    parser.add_argument('--cuda-check', action='store_true',
                        help='on a GPU: the estimate against memory_allocated '
                        'after a real forward and max_memory_allocated over '
                        'the step, for the model and its counterpart')
    parser.add_argument('--json', metavar='FILE',
                        help='write both reports (every saved storage)')
    return parser.parse_args()


def main() -> None:
    args = parse_args()
    if args.batch < 1 or min(args.shape) < 1:
        sys.exit('error: --batch and --shape must be >= 1')
    if args.model.endswith('.py') and not osp.isfile(args.model):
        sys.exit(f'error: config file {args.model!r} not found')
    if not args.model.endswith('.py') and args.model not in zoo_names():
        sys.exit(f'error: unknown model {args.model!r}: a config file (.py) '
                 f'or one of {", ".join(zoo_names())}')
    precision = args.amp or 'fp32'
    hw = tuple(args.shape)
    if args.cuda_check:
        return main_cuda_check(args, precision, hw)
    t0 = time.time()
    pola = measure(args.model, args.batch, hw, precision, args.device)
    soft = None
    if not args.no_compare:
        spec = counterpart(args.model)
        if spec is not None:
            soft = measure(spec, args.batch, hw, precision, args.device,
                           name=(spec['backbone'] if '_config_' in spec
                                 else spec)['type'])
    what = ('backbone + neck (extract_feat)' if pola.scope == 'extract_feat'
            else 'backbone')
    print(f'{pola.name}: {what}, batch {args.batch}, {hw[0]}x{hw[1]}, '
          f'{precision}, device {args.device} (saved for backward, distinct '
          f'storages, parameters and inputs excluded; {time.time() - t0:.1f}'
          ' s)')
    print()
    print(format_comparison(pola, soft))
    print()
    for r in (pola, soft):
        if r is not None:
            print(f'{r.name}: inputs {r.input_bytes / MiB:.1f} MiB, outputs '
                  f'not saved {r.output_bytes / MiB:.1f} MiB, parameters '
                  f'{r.param_bytes / MiB:.1f} MiB')
    if args.per_module is not None:
        for prefix in args.per_module or ['']:
            print()
            print(format_breakdown(pola, prefix, args.top))
    if args.json:
        with open(args.json, 'w') as f:
            json.dump([r.to_dict() for r in (pola, soft) if r is not None],
                      f, indent=1)


def main_cuda_check(args: argparse.Namespace, precision: str,
                    hw: tuple) -> None:
    """--cuda-check: estimate vs CUDA allocator, model and counterpart."""
    import torch
    if not torch.cuda.is_available():
        sys.exit('error: --cuda-check needs a CUDA GPU '
                 '(torch.cuda.is_available() is False)')
    specs = [(args.model, args.model)]
    soft = None if args.no_compare else counterpart(args.model)
    if soft is not None:
        specs.append(((soft['backbone'] if '_config_' in soft
                       else soft)['type'], soft))
    print(f'{torch.cuda.get_device_name()}, batch {args.batch}, '
          f'{hw[0]}x{hw[1]}, {precision}')
    print()
    print('| model | estimate MiB | held after forward MiB | held / '
          'estimate | peak of the step MiB |')
    print('| --- | ---: | ---: | ---: | ---: |')
    for name, spec in specs:
        r = cuda_memory_check(spec, args.batch, hw, precision)
        print(f"| {name} | {r['estimate_outputs']:.1f} | "
              f"{r['held_after_forward']:.1f} | {r['ratio']:.3f} | "
              f"{r['peak_step']:.1f} |")


if __name__ == '__main__':
    main()
