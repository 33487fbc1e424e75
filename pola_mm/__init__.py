"""pola_mm: PolaFormer (polarity-aware linear attention) for OpenMMLab.

Importing the package registers every model in MMEngine's registries, lets
configs use ``pola_mm::`` bases (:mod:`pola_mm.mim_scope`) and applies the
narrow fixes of :mod:`pola_mm.compat` (and, once MMDeploy is imported,
:mod:`pola_mm.deployment.mmdeploy_fixes`) and registers the training hooks of
:mod:`pola_mm.engine`, so
``custom_imports=dict(imports=['pola_mm'])`` is all a config needs.
"""
__version__ = '0.1.0'

from . import compat  # noqa: F401,E402  (narrow fixes for the modern stack)
from .deployment import mmdeploy_fixes  # noqa: F401,E402  (MMDeploy fixes)
from . import engine  # noqa: F401,E402  (checkpoint / divergence hooks)
from . import mim_scope  # noqa: F401,E402  (pola_mm:: config bases)
from . import models  # noqa: F401,E402  (registers the backbones)

__all__ = ['__version__']
