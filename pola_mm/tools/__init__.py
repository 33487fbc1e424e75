"""The logic behind ``tools/train.py`` and ``tools/test.py``.

- :mod:`.runner`: the command lines, the config prepared for a run
  (work dir, launcher, AMP, reliability hooks, ``--out`` / ``--show-dir``)
  and the Runner built and run, for mmdet, mmseg and mmpretrain configs;
- :mod:`.data_paths`: the dataset and pretrained files a config names,
  checked before a Runner is built (a missing one is one line, exit code 2).

Not imported by ``import pola_mm``.
"""
