#!/usr/bin/env python
"""Deploy a whole pola_mm model with MMDeploy to ONNX Runtime, verified.

    python tools/deployment/deploy.py DEPLOY_CFG MODEL_CFG CKPT IMG \\
        [IMG ...] --work-dir DIR [--device cpu] [--show] \\
        [--cfg-options K=V ...] [--score-thr 0.3] [--top-k 20] \\
        [--box-rtol 1e-3] [--score-atol 1e-4] [--mask-iou 0.99] \\
        [--logit-rtol 1e-4] [--seed 0] [--save-weights]

The checkout's entry to :mod:`pola_mm.deployment.deploy`, which an
installed pola_mm runs as ``python -m pola_mm.deployment.deploy`` (same
arguments, same exit codes). DEPLOY_CFG is a file,
``mmdeploy::<path>``, MMDeploy's stock ``configs/<path>`` from the copy
that ships with pola_mm (e.g.
``mmdeploy::mmdet/detection/detection_onnxruntime_dynamic.py``), or
``pola_mm_deploy::<path>``, pola_mm's own: the stock detection and
instance-segmentation configs at opset 16, for two-stage detectors (e.g.
``pola_mm_deploy::mmdet/instance-seg/instance-seg_onnxruntime_dynamic-opset16.py``).
Detections are compared on every one with score >= ``--score-thr`` and at
least the ``--top-k`` best; without CKPT (``none``) the weights are random,
seeded by ``--seed``.

Exit codes: 0 verified, 1 export failed, the models differ or nothing was
compared, 2 bad arguments.
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
