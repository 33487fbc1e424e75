"""What polarity attention does: the attention rows a block implies, their
entropy and rank, and figures of them.

- :mod:`.capture`: images, the attention modules of a backbone and their
  input on a real forward pass (forward hooks);
- :mod:`.maps`: the rows, recomputed from that input and the module's own
  parameters (same-signed, opposite-signed, combined and ReLU rows of a
  polarity block, the depth-wise conv's local matrix, softmax rows of a
  window block);
- :mod:`.stats`: entropy, positive-sequence entropy, rank, summaries;
- :mod:`.plot`: the figures of ``tools/analysis/attention_maps.py`` and
  ``attention_stats.py``.
"""
from .capture import (IMAGENET_MEAN, IMAGENET_STD, SHIPPED_PHOTOS,
                      BlockCapture, attention_blocks, backbone_for_analysis,
                      capture_blocks, image_to_tensor, load_image)
from .maps import (PolarityQK, attention_rows, combined_rows, dwc_rows,
                   normalise_rows, polarity_qk, polarity_scores, query_tokens,
                   softmax_rows)
from .plot import plot_attention_map, plot_statistics, upsample_row
from .stats import (block_statistics, format_statistics, numerical_rank,
                    positive_sequence_entropy, row_entropy, sample_rows,
                    summarise_statistics)

__all__ = [
    'IMAGENET_MEAN', 'IMAGENET_STD', 'SHIPPED_PHOTOS', 'load_image',
    'image_to_tensor', 'attention_blocks', 'BlockCapture', 'capture_blocks',
    'backbone_for_analysis', 'PolarityQK', 'polarity_qk', 'polarity_scores',
    'normalise_rows', 'combined_rows', 'dwc_rows', 'softmax_rows',
    'attention_rows', 'query_tokens', 'row_entropy',
    'positive_sequence_entropy', 'numerical_rank', 'sample_rows',
    'block_statistics', 'summarise_statistics', 'format_statistics',
    'upsample_row', 'plot_attention_map', 'plot_statistics'
]
