"""Building blocks of the Pola backbones (one concept a file)."""
from .embed import PatchEmbed, PatchMerging
from .mlp import Mlp
from .pacs_attention import (PaCSAttention, pacs_features,
                             pacs_linear_attention)
from .polarity_attention import (PolarityAttention, polarity_linear_attention,
                                 resize_pos_table)
from .rotary import rotary_tables, theta_shift
from .spatial_reduction_attention import SpatialReductionAttention
from .window_attention import WindowMSA, relative_position_index

__all__ = [
    'PatchEmbed', 'PatchMerging', 'Mlp', 'PaCSAttention', 'pacs_features',
    'pacs_linear_attention', 'rotary_tables', 'theta_shift',
    'PolarityAttention',
    'polarity_linear_attention', 'resize_pos_table',
    'SpatialReductionAttention', 'WindowMSA', 'relative_position_index'
]
