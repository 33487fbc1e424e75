"""mmpretrain 1.2.0's multimodal models against transformers 5.

mmpretrain imports its multimodal models (BLIP, BLIP-2, OFA, RAM, ...)
whenever ``transformers >= 4.28`` is installed (``WITH_MULTIMODAL`` in
``mmpretrain.utils.dependency``). transformers 5 removed names they import
(``apply_chunking_to_forward``, ``find_pruneable_heads_and_indices``,
``prune_linear_layer`` from ``transformers.modeling_utils``); BLIP's bare
``except:`` then leaves ``PreTrainedModel = None`` and the class statement
after it raises ``TypeError: NoneType takes no arguments``. Every
``import mmpretrain.models`` fails, and with it ``mmdet.models`` (through
``reid_data_preprocessor``) and ``mmseg.models``: no detector or segmentor
can be built.

The fix (``'mmpretrain_multimodal'`` in :data:`pola_mm.compat.FIXES`) runs
where mmpretrain and transformers >= 5 are installed
(:func:`mmpretrain_would_fail`, from metadata, nothing imported), right
after ``mmpretrain.utils.dependency`` loads. Only where mmpretrain would
import its multimodal models and the installed transformers lacks a name
they import (:func:`missing_names`, checked on the installed package), it
sets ``WITH_MULTIMODAL = False``: mmpretrain then registers the multimodal
models as placeholders, as it does without transformers, and building one
raises an ``ImportError`` that names the missing names and the fix
(``transformers<5``). Nothing else of mmpretrain changes; the fix cannot
help once ``mmpretrain.models`` has been imported.

It needs no import order: the start-up hook of every installed pola_mm
(:mod:`pola_mm_startup`) runs :func:`fix_mmpretrain_multimodal` when
``mmpretrain.utils.dependency`` loads, so ``from mmseg.apis import
MMSegInferencer`` or ``import mmdet.models`` work before (or without)
``import pola_mm``. ``import pola_mm`` registers the same function through
:func:`install` (for a checkout used through ``PYTHONPATH``, or with
``POLA_MM_STARTUP_HOOK=0``). The implementation lives in
:mod:`pola_mm_startup`, a standard-library-only module beside the package
that the hook loads without importing pola_mm (and so torch); this module
names it for pola_mm.
"""
from pola_mm_startup import (MULTIMODAL_IMPORTS, after_import,
                             fix_mmpretrain_multimodal, missing_names,
                             mmpretrain_would_fail, patch_dependency_module,
                             state, transformers_major)

__all__ = ['MULTIMODAL_IMPORTS', 'fix_mmpretrain_multimodal',
           'missing_names', 'mmpretrain_would_fail', 'transformers_major',
           'install', 'patch_dependency_module', 'state']


def install() -> str:
    """Run :func:`fix_mmpretrain_multimodal` when
    ``mmpretrain.utils.dependency`` loads (now, if it has): the start-up
    hook's own entry for that module, so the fix runs once whoever
    registers it. Returns ``'applied'`` or ``'deferred'``."""
    return after_import('mmpretrain.utils.dependency',
                        fix_mmpretrain_multimodal)
