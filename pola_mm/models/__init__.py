"""Models of pola_mm; importing this module registers them."""
from .backbones import PolaPVT, PolaSwinTransformer
from .checkpoint import backbone_state_dict, convert_official_checkpoint

__all__ = [
    'PolaSwinTransformer', 'PolaPVT', 'convert_official_checkpoint',
    'backbone_state_dict'
]
