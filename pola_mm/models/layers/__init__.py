"""Building blocks of the Pola backbones (one concept a file)."""
from .conv_embed import ConvDownsample, ConvStem
from .conv_ffn import ConvFFN
from .embed import PatchEmbed, PatchMerging
from .mlp import Mlp
from .pacs_attention import PaCSAttention
from .polapp_block import PolaPPBlock, PolaPPStage, TokenLayerNorm
from .polarity_attention import PolarityAttention
from .rotary import rotary_tables
from .rotary_attention import RotarySelfAttention
from .spatial_reduction_attention import SpatialReductionAttention
from .token_map import to_map, to_tokens
from .window_attention import WindowMSA, relative_position_index

__all__ = [
    'PatchEmbed', 'PatchMerging', 'Mlp', 'PaCSAttention', 'rotary_tables',
    'PolarityAttention', 'SpatialReductionAttention', 'WindowMSA',
    'relative_position_index', 'ConvStem', 'ConvDownsample', 'ConvFFN',
    'PolaPPBlock', 'PolaPPStage', 'TokenLayerNorm', 'RotarySelfAttention',
    'to_map', 'to_tokens'
]
