#!/usr/bin/env python
"""Export the backbone (or, with --whole, the whole model) of a pola_mm
config to ONNX and verify it in ONNX Runtime (and OpenVINO, when
installed).

    python tools/deployment/pytorch2onnx.py CONFIG [CKPT] [--shape H W] \\
        [--out FILE] [--whole] [--exporter dynamo|torchscript] [--opset N] \\
        [--dynamic] [--rtol 1e-4] [--seed 0] [--save-weights] \\
        [--cfg-options K=V ...]

The checkout's entry to :mod:`pola_mm.deployment.pytorch2onnx`, which an
installed pola_mm runs as ``python -m pola_mm.deployment.pytorch2onnx``
(same arguments, same exit codes; its docstring says what it does).
``pytorch2onnx.py CONFIG --dynamic`` is a complete command: the config's
test size, a file under ``work_dirs/``, random weights from ``--seed``.

Exit codes: 0 verified (files written); 1 export failed, refused or outputs
differ; 2 bad arguments or inputs (one line naming the problem and the
fix); 130 interrupted.
"""
import os.path as osp
import sys

sys.path.insert(0, osp.dirname(osp.dirname(osp.dirname(osp.abspath(
    __file__)))))

from pola_mm.cli import quiet_tool_warnings  # noqa: E402
from pola_mm.deployment.pytorch2onnx import main, parse_args  # noqa: E402,F401

quiet_tool_warnings()

if __name__ == '__main__':
    sys.exit(main())
