"""What the repository's command-line scripts (``tools/``) share.

- :mod:`.train_test`: ``tools/train.py`` and ``tools/test.py``: the command
  lines, the config prepared for a run (work dir, launcher, AMP,
  reliability hooks, ``--out`` / ``--show-dir``) and the Runner built and
  run, for mmdet, mmseg and mmpretrain configs, with their exit codes (a
  config mistake that mmengine meets while building, an unknown ``type``
  or a key its class does not take, is one line with the closest names:
  :mod:`pola_mm.config_errors`);
- :mod:`.data_paths`: the dataset and pretrained files a config names,
  checked before a Runner is built (a missing one is one line, exit code 2);
- :mod:`.distributed`: the start and end of the tools' processes
  (``--launcher pytorch`` without CUDA on gloo, a clean exit after it);
- :mod:`.quiet`: :func:`quiet_tool_warnings`.

Every script calls :func:`quiet_tool_warnings` before it runs mmengine or
openmim (``tools/train.py`` and ``tools/test.py`` through
:func:`~.train_test.run_tool`). Not imported by ``import pola_mm``.
What ships here rather than beside the scripts: docs/packaging.md.
"""
from .quiet import quiet_tool_warnings

__all__ = ['quiet_tool_warnings']
