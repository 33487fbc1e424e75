"""Make ``pola_mm::`` config bases resolve, like ``mmdet::`` / ``mmseg::``.

A config may name a base inside an installed package, e.g.
``_base_ = ['mmdet::mask_rcnn/mask-rcnn_r50_fpn_1x_coco.py',
'pola_mm::_base_/models/pola_swin_t_fpn.py']``. mmengine 0.10.7 resolves
``<scope>::<path>`` to ``<package dir>/.mim/configs/<path>``, but

1. it only accepts scopes listed in ``mmengine.config.utils.MODULE2PACKAGE``
   (the OpenMMLab packages), and
2. it finds ``<package dir>`` with ``get_installed_path``, which for an
   editable install (PEP 660, ``pip install -e .``) guesses
   ``<site-packages>/pola_mm``, a folder that does not exist.

:func:`register_config_scope` adds ``pola_mm`` to the table and, for the
``pola_mm`` scope only, answers the package folder from the imported module
itself (correct for regular, editable and ``PYTHONPATH`` use alike). The
package ships ``.mim/configs`` as a link to the repository's ``configs/``
and a ``.mim/model-index.yml`` without metafiles, so every ``pola_mm::``
path is a plain file under ``configs/``.

It runs when :mod:`pola_mm` is imported, so it works for every tool that
imports pola_mm before reading a config (``tools/train.py``,
``tools/test.py``); elsewhere, ``import pola_mm`` first.
"""
import os.path as osp
from typing import Callable

__all__ = ['PACKAGE_DIR', 'register_config_scope']

#: the folder of the imported pola_mm package (holds ``.mim/configs``)
PACKAGE_DIR = osp.dirname(osp.abspath(__file__))

_SCOPE = 'pola_mm'


def _wrap(get_installed_path: Callable[[str], str]) -> Callable[[str], str]:
    if getattr(get_installed_path, '_pola_mm_scope', False):
        return get_installed_path

    def installed_path(package: str) -> str:
        if package == _SCOPE:
            return PACKAGE_DIR
        return get_installed_path(package)

    installed_path._pola_mm_scope = True  # type: ignore[attr-defined]
    installed_path.__doc__ = get_installed_path.__doc__
    return installed_path


def register_config_scope() -> None:
    """Let mmengine configs use ``pola_mm::`` bases. Idempotent.

    Touches only mmengine's config loader: the scope table gains
    ``'pola_mm'`` and the config module's ``get_installed_path`` answers
    :data:`PACKAGE_DIR` for ``'pola_mm'`` (every other package is looked up
    as before).
    """
    from mmengine.config import config as config_module
    from mmengine.config import utils as config_utils
    config_utils.MODULE2PACKAGE.setdefault(_SCOPE, _SCOPE)
    config_module.get_installed_path = _wrap(config_module.get_installed_path)


register_config_scope()
