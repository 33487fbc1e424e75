"""Backbones of pola_mm (registered on import)."""
from .pola_pvt import PolaPVT
from .pola_swin import PolaSwinTransformer
from .polapp import PolaPP

__all__ = ['PolaSwinTransformer', 'PolaPVT', 'PolaPP']
