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
``pola_mm`` scope only, answers the package folder (correct for regular,
editable and ``PYTHONPATH`` use alike). It also lets a ``_base_`` list name
any complete config without a folder, which mmengine alone refuses
(``pola_mm::mask_rcnn_pola_swin_t.py``, read as the file itself, in its
codebase's scope: :func:`pola_mm_startup.wrap_get_cfg_path`).

The package ships ``.mim/configs`` as a link to the repository's
``configs/`` and ``.mim/model-index.yml`` as a link to the repository's
``model-index.yml`` (the mim metadata, whose metafiles name configs but no
``_base_`` file), so every ``pola_mm::<path>`` is a plain file under
``configs/``.

Who calls it:

* every installed pola_mm's start-up hook (:mod:`pola_mm_startup`,
  ``pola_mm_startup.pth`` in site-packages), the moment mmengine's config
  reader meets a ``pola_mm::`` entry: the upstream tools (mmdet's, mmseg's
  and mmpretrain's ``tools/train.py``, ``mim train``) read ``pola_mm::``
  bases without importing pola_mm first;
* ``import pola_mm`` (this module), for a checkout used through
  ``PYTHONPATH`` without installing, where no start-up hook exists.

The implementation lives in :mod:`pola_mm_startup`, a standard-library-only
module beside the package that the hook can load without importing pola_mm
(and so torch).
"""
import os.path as osp

from pola_mm_startup import register_config_scope

__all__ = ['PACKAGE_DIR', 'register_config_scope']

#: the folder of the imported pola_mm package (holds ``.mim/configs``)
PACKAGE_DIR = osp.dirname(osp.abspath(__file__))

register_config_scope()
