"""Argument checks shared by the polarity attentions (PolaFormer's and
PolaFormer++'s)."""

IMPLS = ('kernel', 'reference')


def polarity_head_dims(embed_dims: int, num_heads: int,
                       impl: str = 'kernel') -> int:
    """The head width of a polarity attention, after checking its arguments.

    Both flows read one half of v per head, so the head width must be even;
    ``impl`` must be one of :data:`IMPLS`.
    """
    if impl not in IMPLS:
        raise ValueError(f"impl must be 'kernel' or 'reference', got {impl!r}")
    if embed_dims % num_heads:
        raise ValueError(f'embed_dims {embed_dims} is not divisible by '
                         f'num_heads {num_heads}')
    head_dims = embed_dims // num_heads
    if head_dims % 2:
        raise ValueError(f'head width {head_dims} must be even (v is split '
                         'into two halves per head)')
    return head_dims
