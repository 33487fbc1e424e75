"""Backbones of pola_mm (registered on import)."""
from .base import RemovedOptionError, check_removed_options
from .pola_pvt import PolaPVT
from .pola_swin import PolaSwinTransformer
from .polapp import PolaPP

__all__ = [
    'PolaSwinTransformer', 'PolaPVT', 'PolaPP', 'RemovedOptionError',
    'check_removed_options'
]
