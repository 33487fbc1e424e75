"""Building blocks of the Pola backbones (one concept a file)."""
from .conv_embed import ConvDownsample, ConvStem
from .conv_ffn import ConvFFN
from .embed import PatchEmbed, PatchMerging
from .mlp import Mlp
from .pacs_attention import (PaCSAttention, pacs_attend, pacs_features,
                             pacs_linear_attention)
from .polapp_block import PolaPPBlock, PolaPPStage, TokenLayerNorm
from .polarity_attention import PolarityAttention, resize_pos_table
from .rotary import rotary_tables, theta_shift
from .rotary_attention import RotarySelfAttention, softmax_attention
from .spatial_reduction_attention import SpatialReductionAttention
from .token_map import to_map, to_tokens
from .window_attention import WindowMSA, relative_position_index

__all__ = [
    'PatchEmbed', 'PatchMerging', 'Mlp', 'PaCSAttention', 'pacs_features',
    'pacs_linear_attention', 'rotary_tables', 'theta_shift',
    'PolarityAttention',
    'resize_pos_table',
    'SpatialReductionAttention', 'WindowMSA', 'relative_position_index',
    'ConvStem', 'ConvDownsample', 'ConvFFN', 'pacs_attend', 'PolaPPBlock',
    'PolaPPStage', 'TokenLayerNorm', 'RotarySelfAttention',
    'softmax_attention', 'to_map', 'to_tokens'
]
