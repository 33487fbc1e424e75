"""The logic behind ``tools/train.py`` and ``tools/test.py``.

- :mod:`.runner`: the command lines, the config prepared for a run
  (work dir, launcher, AMP, reliability hooks, ``--out`` / ``--show-dir``)
  and the Runner built and run, for mmdet, mmseg and mmpretrain configs;
- :mod:`.data_paths`: the dataset and pretrained files a config names,
  checked before a Runner is built (a missing one is one line, exit code 2).

Not imported by ``import pola_mm``.
"""
import warnings

# The tools' processes only: mmengine 0.10 and openmim import pkg_resources,
# and the setuptools they need (< 81) warns on each import (4-6 lines per
# command, nothing a user can act on). pola_mm itself does not use it.
warnings.filterwarnings('ignore', message='pkg_resources is deprecated',
                        category=UserWarning)
