"""Backbones of pola_mm (registered on import)."""
from .pola_pvt import PolaPVT
from .pola_swin import PolaSwinTransformer

__all__ = ['PolaSwinTransformer', 'PolaPVT']
