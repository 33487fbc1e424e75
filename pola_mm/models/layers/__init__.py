"""Building blocks of the Pola backbones (one concept a file)."""
from .embed import PatchEmbed, PatchMerging
from .mlp import Mlp
from .polarity_attention import (PolarityAttention, polarity_linear_attention,
                                 resize_pos_table)
from .spatial_reduction_attention import SpatialReductionAttention
from .window_attention import WindowMSA, relative_position_index

__all__ = [
    'PatchEmbed', 'PatchMerging', 'Mlp', 'PolarityAttention',
    'polarity_linear_attention', 'resize_pos_table',
    'SpatialReductionAttention', 'WindowMSA', 'relative_position_index'
]
