"""pola_mm: PolaFormer (polarity-aware linear attention) for OpenMMLab.

Importing the package registers every model in MMEngine's registries, so
``custom_imports=dict(imports=['pola_mm'])`` is all a config needs.
"""
__version__ = '0.1.0'

from . import compat  # noqa: F401,E402  (narrow fixes for the modern stack)
from . import models  # noqa: F401,E402  (registers the backbones)

__all__ = ['__version__']
