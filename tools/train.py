#!/usr/bin/env python
"""Train with an mmdet / mmseg / mmpretrain config (scope from the config).

    python tools/train.py CONFIG [--work-dir DIR] [--resume [PATH]] [--amp]
        [--auto-scale-lr] [--cfg-options K=V ...] [--launcher pytorch]

Multi-process: ``torchrun --nproc_per_node N tools/train.py CONFIG
--launcher pytorch`` (works on CPU-only machines too, with gloo).
"""
import pola_mm  # noqa: F401  (registers the models, applies pola_mm.compat)
from pola_mm.cli.distributed import exit_process
from pola_mm.cli.train_test import run_tool, train_main

if __name__ == '__main__':
    exit_process(run_tool(train_main))
