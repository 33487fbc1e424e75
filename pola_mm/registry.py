"""Registries of pola_mm.

``MODELS`` is a child of MMEngine's root ``MODELS`` registry with scope
``'pola_mm'``, so ``type='pola_mm.PolaSwinTransformer'`` always resolves.
Backbones are additionally registered in MMEngine's root registry so that the
plain name (``type='PolaSwinTransformer'``) resolves from the mmdet, mmseg and
mmpretrain default scopes: those registries search their parents, and the
root is the common parent of all of them. This keeps pola_mm free of imports
of the downstream codebases.
"""
from typing import TypeVar

from mmengine.registry import MODELS as MMENGINE_MODELS
from mmengine.registry import Registry

MODELS = Registry(
    'model', parent=MMENGINE_MODELS, scope='pola_mm',
    locations=['pola_mm.models'])

T = TypeVar('T', bound=type)


def register_model(cls: T) -> T:
    """Register ``cls`` in pola_mm's ``MODELS`` and in MMEngine's root.

    Used as a class decorator by every public model of pola_mm.
    """
    MODELS.register_module(module=cls)
    if MMENGINE_MODELS.get(cls.__name__) is None:
        MMENGINE_MODELS.register_module(module=cls)
    return cls
