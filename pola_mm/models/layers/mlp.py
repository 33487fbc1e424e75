"""Transformer MLP with the authors' parameter names (``fc1``, ``fc2``)."""
from typing import Optional

import torch
import torch.nn as nn
from torch import Tensor

from ...ops.dispatch import Path
from ...ops.gelu_linear import gelu_linear
from ...ops.token_runs import linear_out, mlp_in_runs, runs_pay
from .bricks import build_activation_layer
from .module import PolaModule


class Mlp(PolaModule):
    """``fc2(drop(act(fc1(x))))`` followed by dropout.

    Args:
        in_features: input/output channels ``C``.
        hidden_features: hidden channels.
        act_cfg: activation config (default GELU).
        drop: dropout rate.
    """

    def __init__(self,
                 in_features: int,
                 hidden_features: int,
                 act_cfg: dict = dict(type='GELU'),
                 drop: float = 0.,
                 init_cfg: Optional[dict] = None) -> None:
        super().__init__(init_cfg=init_cfg)
        self.fc1 = nn.Linear(in_features, hidden_features)
        self.act = build_activation_layer(act_cfg)
        self.fc2 = nn.Linear(hidden_features, in_features)
        self.drop = nn.Dropout(drop)

    def forward(self, x: Tensor) -> Tensor:
        """``(..., C)`` -> ``(..., C)``.

        With GELU and no active dropout, where autograd records, the same
        result comes from leaner implementations (the module's
        :func:`~pola_mm.ops.dispatch.select`): CPU training on large token
        maps runs on runs of tokens
        (:func:`~pola_mm.ops.token_runs.mlp_in_runs`: the hidden layer is
        never allocated whole); elsewhere ``fc2(act(h))`` is one function
        that keeps only ``h = fc1(x)`` for backward and recomputes GELU
        there (:func:`~pola_mm.ops.gelu_linear.gelu_linear`).
        """
        path = self.select_path(x)
        if path.autograd and self._lean_applies():
            return self._forward_lean(x, path)
        return self.drop(self.fc2(self.drop(self.act(self.fc1(x)))))

    @torch.jit.unused
    def _lean_applies(self) -> bool:
        """Whether the lean training functions serve :meth:`forward`: GELU
        and no active dropout."""
        return (type(self.act) is nn.GELU
                and (self.drop.p == 0 or not self.training))

    @torch.jit.unused
    def _forward_lean(self, x: Tensor, path: Path) -> Tensor:
        if path.cpu_training and runs_pay(x, self.fc1.out_features):
            return mlp_in_runs(x, self.fc1, self.fc2, self.act.approximate)
        return self.drop(gelu_linear(self.fc1(x), self.fc2.weight,
                                     self.fc2.bias, self.act.approximate))

    def forward_into(self, x: Tensor, out: Tensor, hidden: Tensor) -> None:
        """:meth:`forward` of tokens ``x`` ``(T, C)`` written into ``out``
        ``(T, C)``, the hidden layer into ``hidden`` (at least ``(T,
        hidden_features)``), so that a caller walking runs of tokens reuses
        one buffer. Dropout is skipped (eval mode); no autograd."""
        h = hidden[:x.shape[0]]
        linear_out(x, self.fc1.weight.t(), self.fc1.bias, h)
        if type(self.act) is nn.GELU:
            torch.ops.aten.gelu_(h, approximate=self.act.approximate)
        else:
            h = self.act(h)
        linear_out(h, self.fc2.weight.t(), self.fc2.bias, out)
