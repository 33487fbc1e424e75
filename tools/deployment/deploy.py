#!/usr/bin/env python
"""Deploy a whole pola_mm model with MMDeploy to ONNX Runtime, verified.

    python tools/deployment/deploy.py DEPLOY_CFG MODEL_CFG CKPT IMG \\
        --work-dir DIR [--device cpu] [--show] [--cfg-options K=V ...] \\
        [--score-thr 0.3] [--box-rtol 1e-3] [--score-atol 1e-4] \\
        [--mask-iou 0.99] [--logit-rtol 1e-4]

The checkout's entry to :mod:`pola_mm.deployment.deploy`, which an
installed pola_mm runs as ``python -m pola_mm.deployment.deploy`` (same
arguments, same exit codes). DEPLOY_CFG is a file or
``mmdeploy::<path>``, MMDeploy's stock ``configs/<path>`` from the copy
that ships with pola_mm (e.g.
``mmdeploy::mmdet/detection/detection_onnxruntime_dynamic.py``).

Exit codes: 0 verified, 1 export failed or the models differ, 2 bad
arguments.
"""
import os.path as osp
import sys

sys.path.insert(0, osp.dirname(osp.dirname(osp.dirname(osp.abspath(
    __file__)))))

from pola_mm.cli import quiet_tool_warnings  # noqa: E402
from pola_mm.deployment.deploy import main, parse_args  # noqa: E402,F401

quiet_tool_warnings()

if __name__ == '__main__':
    sys.exit(main())
