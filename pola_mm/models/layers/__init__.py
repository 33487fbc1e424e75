"""Building blocks of the Pola backbones (one concept a file); the
arithmetic of the attentions is in :mod:`pola_mm.ops`."""
from .conv_embed import ConvDownsample, ConvStem
from .conv_ffn import ConvFFN
from .embed import PatchEmbed, PatchMerging
from .linear_attention import PaCSAttention, PolarityAttention
from .mlp import Mlp
from .polapp_block import PolaPPBlock, PolaPPStage, TokenLayerNorm
from .rotary_attention import RotarySelfAttention
from .spatial_reduction_attention import SpatialReductionAttention
from .token_map import to_map, to_tokens
from .window_attention import WindowMSA, relative_position_index

__all__ = [
    'PatchEmbed', 'PatchMerging', 'Mlp', 'PaCSAttention',
    'PolarityAttention', 'SpatialReductionAttention', 'WindowMSA',
    'relative_position_index', 'ConvStem', 'ConvDownsample', 'ConvFFN',
    'PolaPPBlock', 'PolaPPStage', 'TokenLayerNorm', 'RotarySelfAttention',
    'to_map', 'to_tokens'
]
