"""The authors' PolaPP ImageNet classifier between backbone and head.

Their ``POLA.forward_features`` ends with ``proj`` (a 1x1 conv from the last
stage's channels to ``projection`` = 2048, 2560 for b5), ``norm``
(BatchNorm2d), Swish and global average pooling; their ``head`` is a 1x1
conv on the pooled ``(B, P, 1, 1)`` map, i.e. a linear layer, which is
mmpretrain's ``LinearClsHead`` (``head.fc``).
"""
from typing import Optional, Sequence, Tuple, Union

import torch.nn as nn
from mmengine.model import BaseModule
from mmengine.model.weight_init import trunc_normal_
from torch import Tensor

from ...registry import register_model


@register_model
class PolaPPClsNeck(BaseModule):
    """``proj`` 1x1 conv, ``norm`` BatchNorm, SiLU (Swish), average pooling:
    the authors' PolaPP classifier (``POLA``) after its last stage.

    Use it with ``PolaPP(out_indices=(3, ), with_extra_norms=False)`` (the
    authors' classifier pools the last stage's raw output, with no norm) and
    ``LinearClsHead(in_channels=out_channels)``. Parameter names are the
    authors' ``proj.*`` / ``norm.*``.

    Args:
        in_channels: channels of the last stage (the arch's
            ``embed_dims[-1]``).
        out_channels: the authors' ``projection``: 2048 (b1-b4), 2560 (b5).
        init_cfg: mmengine init config; by default the authors' init
            (trunc-normal std 0.02 conv weight, zero bias, BatchNorm 1 / 0).

    Input: a tuple of maps whose last is ``(B, in_channels, H, W)`` (or that
    map alone). Output: ``((B, out_channels), )``.
    """

    def __init__(self, in_channels: int, out_channels: int = 2048,
                 init_cfg: Optional[dict] = None) -> None:
        super().__init__(init_cfg=init_cfg)
        self.in_channels = in_channels
        self.out_channels = out_channels
        self.proj = nn.Conv2d(in_channels, out_channels, 1)
        self.norm = nn.BatchNorm2d(out_channels)
        self.act = nn.SiLU()
        self.pool = nn.AdaptiveAvgPool2d(1)

    def init_weights(self) -> None:
        """The authors' init unless ``init_cfg`` says otherwise."""
        if self.init_cfg is not None:
            super().init_weights()
            return
        trunc_normal_(self.proj.weight, std=.02)
        nn.init.zeros_(self.proj.bias)
        self.norm.reset_parameters()
        self._is_init = True

    def forward(self, inputs: Union[Tensor, Sequence[Tensor]]
                ) -> Tuple[Tensor]:
        """``(..., (B, C, H, W))`` -> ``((B, out_channels), )``."""
        x = inputs if isinstance(inputs, Tensor) else inputs[-1]
        if x.dim() != 4 or x.shape[1] != self.in_channels:
            raise ValueError(
                f'PolaPPClsNeck(in_channels={self.in_channels}) expects a '
                f'(B, {self.in_channels}, H, W) map, got {tuple(x.shape)}; '
                "set in_channels to the backbone's last embed_dims")
        x = self.act(self.norm(self.proj(x)))
        return (self.pool(x).flatten(1), )
