"""A tiny model, dataset and metric for real mmengine Runner tests.

Imported by configs through ``custom_imports=dict(imports=['compat_tiny'])``
with ``tests/`` on ``PYTHONPATH`` (see ``tests/test_compat.py``).
Everything registers in MMEngine's root registries, so the configs use
``default_scope='mmengine'`` and need none of mmdet / mmseg / mmpretrain.
"""
from typing import Dict, List, Optional, Sequence, Union

import torch
from mmengine.evaluator import BaseMetric
from mmengine.model import BaseModel
from mmengine.registry import DATASETS, METRICS, MODELS
from torch.utils.data import Dataset

# y = x @ W_TRUE: a linear regression the model can fit
W_TRUE = torch.tensor([[1.0, -2.0], [0.5, 0.25], [-1.0, 3.0], [2.0, 0.0]])


@DATASETS.register_module()
class TinyRegressionDataset(Dataset):
    """``length`` samples ``dict(inputs=x (4,), data_samples=y (2,))``."""

    def __init__(self, length: int = 32, seed: int = 0) -> None:
        gen = torch.Generator().manual_seed(seed)
        self.x = torch.randn(length, 4, generator=gen)
        self.y = self.x @ W_TRUE
        self.metainfo = dict(classes=('a', 'b'))

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, idx: int) -> Dict[str, torch.Tensor]:
        return dict(inputs=self.x[idx], data_samples=self.y[idx])


@MODELS.register_module()
class TinyRegressor(BaseModel):
    """A linear layer trained with MSE; BatchNorm adds running buffers."""

    def __init__(self, data_preprocessor: Optional[dict] = None) -> None:
        super().__init__(data_preprocessor=data_preprocessor)
        self.norm = torch.nn.BatchNorm1d(4, affine=False)
        self.fc = torch.nn.Linear(4, 2)

    def forward(self,
                inputs: Union[torch.Tensor, List[torch.Tensor]],
                data_samples: Optional[Sequence[torch.Tensor]] = None,
                mode: str = 'tensor'):
        """inputs: (B, 4) or B tensors (4,); data_samples: B targets (2,)."""
        x = torch.stack(list(inputs)) if isinstance(inputs,
                                                    (list, tuple)) else inputs
        out = self.fc(x)
        if mode == 'tensor':
            return out
        y = torch.stack(list(data_samples))
        if mode == 'loss':
            return dict(loss=torch.nn.functional.mse_loss(out, y))
        if mode == 'predict':
            return [dict(pred=o, gt=t) for o, t in zip(out, y)]
        raise ValueError(f'unknown mode {mode}')


@METRICS.register_module()
class TinyMSE(BaseMetric):
    """Mean squared error of ``predict`` outputs."""

    def process(self, data_batch, data_samples: Sequence[dict]) -> None:
        for s in data_samples:
            self.results.append(float(((s['pred'] - s['gt'])**2).mean()))

    def compute_metrics(self, results: list) -> Dict[str, float]:
        return dict(mse=sum(results) / max(len(results), 1))
