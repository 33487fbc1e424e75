#!/usr/bin/env python
"""Test a checkpoint with an mmdet / mmseg / mmpretrain config.

    python tools/test.py CONFIG CHECKPOINT [--work-dir DIR] [--out RESULT.pkl]
        [--show-dir DIR] [--cfg-options K=V ...] [--launcher pytorch]
"""
import pola_mm  # noqa: F401  (registers the models, applies pola_mm.compat)
from pola_mm.cli.distributed import exit_process
from pola_mm.cli.train_test import run_tool, test_main

if __name__ == '__main__':
    exit_process(run_tool(test_main))
