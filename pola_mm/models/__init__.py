"""Models of pola_mm; importing this module registers them."""
from .backbones import PolaPP, PolaPVT, PolaSwinTransformer
from .checkpoint import backbone_state_dict, convert_official_checkpoint
from .necks import PolaPPClsNeck

__all__ = [
    'PolaSwinTransformer', 'PolaPVT', 'PolaPP', 'PolaPPClsNeck',
    'convert_official_checkpoint', 'backbone_state_dict'
]
