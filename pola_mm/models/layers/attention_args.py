"""Argument checks shared by the polarity attentions (PolaFormer's and
PolaFormer++'s)."""


def polarity_head_dims(embed_dims: int, num_heads: int) -> int:
    """The head width of a polarity attention, after checking its arguments.

    Both flows read one half of v per head, so the head width must be even.

    Args:
        embed_dims: channels ``C``.
        num_heads: heads ``h``.

    Returns:
        ``d = C / h``.
    """
    if embed_dims % num_heads:
        raise ValueError(f'embed_dims {embed_dims} is not divisible by '
                         f'num_heads {num_heads}')
    head_dims = embed_dims // num_heads
    if head_dims % 2:
        raise ValueError(f'head width {head_dims} must be even (v is split '
                         'into two halves per head)')
    return head_dims
