"""What the repository's command-line scripts (``tools/``) share.

- :mod:`.train_test`: ``tools/train.py`` and ``tools/test.py``: the command
  lines, the config prepared for a run (work dir, launcher, AMP,
  reliability hooks, ``--out`` / ``--show-dir``) and the Runner built and
  run, for mmdet, mmseg and mmpretrain configs, with their exit codes;
- :mod:`.data_paths`: the dataset and pretrained files a config names,
  checked before a Runner is built (a missing one is one line, exit code 2);
- :mod:`.distributed`: the start and end of the tools' processes
  (``--launcher pytorch`` without CUDA on gloo, a clean exit after it).

Importing this package sets the tools' warning filter (below): the scripts
under ``tools/`` that run mmengine or openmim import it before those do.
Not imported by ``import pola_mm``.
What ships here rather than beside the scripts: docs/packaging.md.
"""
import warnings

# The tools' processes only: mmengine 0.10 and openmim import pkg_resources,
# and the setuptools they need (< 81) warns on each import (4-6 lines per
# command, nothing a user can act on). pola_mm itself does not use it.
warnings.filterwarnings('ignore', message='pkg_resources is deprecated',
                        category=UserWarning)
