"""pola_mm: PolaFormer (polarity-aware linear attention) for OpenMMLab.

Importing the package registers every model in MMEngine's registries, lets
configs use ``pola_mm::`` bases (:mod:`pola_mm.mim_scope`), registers the
training hooks of :mod:`pola_mm.engine`, makes an uncaught config mistake
of mmengine's build one line (:mod:`pola_mm.config_errors`), and applies
the fixes of :mod:`pola_mm.compat` that the running stack needs (and, where
MMDeploy is installed, those of :mod:`pola_mm.deployment.mmdeploy_fixes`
once it is imported), so ``custom_imports=dict(imports=['pola_mm'])`` is
all a config needs. :func:`applied_fixes` names what was applied;
docs/compat.md lists every fix with its gate.
"""
from typing import List

__version__ = '0.1.0'

import sys  # noqa: E402

from . import compat  # noqa: E402  (narrow fixes for the modern stack)
from . import config_errors  # noqa: E402  (config mistakes in one line)
from . import engine  # noqa: F401,E402  (checkpoint / divergence hooks)
from . import mim_scope  # noqa: F401,E402  (pola_mm:: config bases)
from . import models  # noqa: F401,E402  (registers the backbones)

compat.apply_needed_fixes()
config_errors.install_excepthook()
if compat.mmdeploy_installed():  # the MMDeploy fixes wait for its import
    from .deployment import mmdeploy_fixes  # noqa: E402
    mmdeploy_fixes.install_mmdeploy_fixes()


def applied_fixes() -> List[str]:
    """The fixes ``import pola_mm`` applied on this stack: the names of
    :data:`pola_mm.compat.applied`, and ``'mmdeploy'`` where the MMDeploy
    fixes wait for (or ran on) ``mmdeploy.core``."""
    names = list(compat.applied)
    fixes = sys.modules.get('pola_mm.deployment.mmdeploy_fixes')
    if fixes is not None and fixes.applied['hook']:
        names.append('mmdeploy')
    return names


__all__ = ['__version__', 'applied_fixes']
