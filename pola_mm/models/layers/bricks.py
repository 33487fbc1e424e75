"""Norm, activation and stochastic depth built from config dicts, in plain
torch (no mmcv), and a block's attention chosen by its letter.

The backbones take OpenMMLab-style configs (``dict(type='LN', eps=1e-6)``,
``dict(type='GELU')``); these builders accept the same dicts, with the same
signatures as ``mmcv.cnn.build_norm_layer`` / ``build_activation_layer``, and
build the same torch modules, so parameter names (and checkpoints) are
unchanged. A type outside the tables below is looked up in MMEngine's
``MODELS`` registry (where mmcv, once imported, registers its own layers);
a type found nowhere raises a ``ValueError`` listing the supported ones.
"""
from typing import Callable, Dict, Tuple, Type, Union

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch import Tensor

#: ``type`` of a norm config -> torch class (mmcv's names).
NORM_LAYERS: Dict[str, Type[nn.Module]] = {
    'LN': nn.LayerNorm,
    'BN': nn.BatchNorm2d,
    'BN1d': nn.BatchNorm1d,
    'BN2d': nn.BatchNorm2d,
    'BN3d': nn.BatchNorm3d,
    'SyncBN': nn.SyncBatchNorm,
    'GN': nn.GroupNorm,
    'IN': nn.InstanceNorm2d,
    'IN1d': nn.InstanceNorm1d,
    'IN2d': nn.InstanceNorm2d,
    'IN3d': nn.InstanceNorm3d,
}

#: ``type`` of an activation config -> torch class (mmcv's names).
ACTIVATION_LAYERS: Dict[str, Type[nn.Module]] = {
    'GELU': nn.GELU,
    'ReLU': nn.ReLU,
    'ReLU6': nn.ReLU6,
    'LeakyReLU': nn.LeakyReLU,
    'PReLU': nn.PReLU,
    'RReLU': nn.RReLU,
    'ELU': nn.ELU,
    'SiLU': nn.SiLU,
    'Swish': nn.SiLU,
    'Sigmoid': nn.Sigmoid,
    'Tanh': nn.Tanh,
    'HSwish': nn.Hardswish,
    'Hardswish': nn.Hardswish,
    'Mish': nn.Mish,
}


def _layer_class(cfg: dict, table: Dict[str, Type[nn.Module]],
                 what: str) -> Tuple[Type[nn.Module], dict]:
    """The class named by ``cfg['type']`` and the remaining arguments."""
    if not isinstance(cfg, dict) or 'type' not in cfg:
        raise TypeError(f'{what} config must be a dict with a "type" key, '
                        f'e.g. dict(type={next(iter(table))!r}); got {cfg!r}')
    args = dict(cfg)
    layer_type = args.pop('type')
    if isinstance(layer_type, type) and issubclass(layer_type, nn.Module):
        return layer_type, args
    if layer_type in table:
        return table[layer_type], args
    from mmengine.registry import MODELS
    found = MODELS.get(layer_type) if isinstance(layer_type, str) else None
    if isinstance(found, type) and issubclass(found, nn.Module):
        return found, args
    raise ValueError(
        f'unsupported {what} type {layer_type!r}; use one of {sorted(table)}, '
        'an nn.Module class, or a type registered in MMEngine\'s MODELS '
        '(import the package that registers it first)')


def _norm_abbr(cls: Type[nn.Module]) -> str:
    """mmcv's name prefix of a norm layer (``'ln'``, ``'bn'``, ...)."""
    if hasattr(cls, '_abbr_'):
        return cls._abbr_
    for base, abbr in ((nn.modules.instancenorm._InstanceNorm, 'in'),
                       (nn.modules.batchnorm._BatchNorm, 'bn'),
                       (nn.GroupNorm, 'gn'), (nn.LayerNorm, 'ln')):
        if issubclass(cls, base):
            return abbr
    return 'norm_layer'


def build_norm_layer(cfg: dict,
                     num_features: int,
                     postfix: Union[int, str] = '') -> Tuple[str, nn.Module]:
    """Build a norm layer over ``num_features`` channels from a config.

    The same signature and result as ``mmcv.cnn.build_norm_layer``:
    ``dict(type='LN', eps=1e-6)`` gives ``('ln', nn.LayerNorm(C, eps=1e-6))``;
    ``GN`` needs ``num_groups``; ``requires_grad=False`` freezes the layer.

    Args:
        cfg: ``dict(type=..., **kwargs)``; ``type`` is a name of
            :data:`NORM_LAYERS`, an ``nn.Module`` class or a type registered
            in MMEngine's ``MODELS``.
        num_features: channels ``C``.
        postfix: appended to the returned name.

    Returns:
        ``(name, layer)``.
    """
    cls, args = _layer_class(cfg, NORM_LAYERS, 'norm')
    requires_grad = args.pop('requires_grad', True)
    if cls is nn.GroupNorm:
        if 'num_groups' not in args:
            raise KeyError('GN needs num_groups, e.g. '
                           'dict(type="GN", num_groups=32)')
        layer = cls(num_channels=num_features, **args)
    else:
        layer = cls(num_features, **args)
    for p in layer.parameters():
        p.requires_grad = requires_grad
    return f'{_norm_abbr(cls)}{postfix}', layer


def build_activation_layer(cfg: dict) -> nn.Module:
    """Build an activation from a config, like
    ``mmcv.cnn.build_activation_layer``: ``dict(type='GELU')``,
    ``dict(type='ReLU', inplace=True)``, ``dict(type='GELU',
    approximate='tanh')``.

    Args:
        cfg: ``dict(type=..., **kwargs)``; ``type`` is a name of
            :data:`ACTIVATION_LAYERS`, an ``nn.Module`` class or a type
            registered in MMEngine's ``MODELS``.
    """
    cls, args = _layer_class(cfg, ACTIVATION_LAYERS, 'activation')
    return cls(**args)


def drop_path(x: Tensor, drop_prob: float = 0.,
              training: bool = False) -> Tensor:
    """Stochastic depth: zero whole samples with probability ``drop_prob``
    and scale the rest by ``1 / (1 - drop_prob)`` (training only).

    Args:
        x: ``(B, ...)``, one residual branch per sample.
    """
    if drop_prob == 0. or not training:
        return x
    keep_prob = 1 - drop_prob
    shape = [x.shape[0]] + [1] * (x.dim() - 1)
    # keep where u >= drop_prob, u ~ U[0, 1): mmcv's draw, so a seed gives
    # the same samples as mmcv's DropPath
    # (a boolean factor: the product casts it on the fly, no float copy)
    keep = torch.rand(shape, dtype=x.dtype, device=x.device) >= drop_prob
    return x.div(keep_prob) * keep


class DropPath(nn.Module):
    """Stochastic depth of a residual branch (``mmcv.cnn.bricks.DropPath``,
    timm's ``DropPath``): :func:`drop_path` in training, identity in eval.

    Args:
        drop_prob: probability of dropping a sample's branch.
    """

    def __init__(self, drop_prob: float = 0.1) -> None:
        super().__init__()
        if not 0. <= drop_prob < 1.:
            raise ValueError(f'drop_prob must lie in [0, 1), got {drop_prob}')
        self.drop_prob = drop_prob

    def forward(self, x: Tensor) -> Tensor:
        """``(B, ...)`` -> ``(B, ...)``."""
        return drop_path(x, self.drop_prob, self.training)

    def extra_repr(self) -> str:
        return f'drop_prob={self.drop_prob:.3f}'


#: What the letters of an ``attn_layout`` name.
ATTENTION_LETTERS = {'L': 'polarity (linear)', 'S': 'softmax'}


def linear_chunks(linear: nn.Linear, x: Tensor,
                  chunks: int) -> Tuple[Tensor, ...]:
    """``linear(x)`` cut into ``chunks`` equal parts of its output channels
    (``qkvg`` -> q, k, v, g), the same numbers either way.

    On the CPU, and in every graph exported from it, one product per part
    with its rows of the weight: each part comes out contiguous, where views
    of one product are strided and an exported ``Split`` copies them
    (faster in PyTorch, ONNX Runtime and OpenVINO on the CPU:
    docs/performance.md, "Per-part projections").

    On the GPU (and on ``meta``, which stands for it in estimates and
    structure tests), and where the module is observed or replaced (a
    hook, as FLOP counters and feature extractors add; a subclass or
    wrapper of ``nn.Linear``), the module is called once and the parts are
    views of its output.
    """
    if x.device.type in ('cuda', 'meta') or type(linear) is not nn.Linear or \
            linear._forward_hooks or linear._forward_pre_hooks or \
            nn.modules.module._global_forward_hooks or \
            nn.modules.module._global_forward_pre_hooks:
        out = linear(x)
        return out.reshape(*out.shape[:-1], chunks, -1).unbind(-2)
    w = linear.weight.chunk(chunks)
    b = (None, ) * chunks if linear.bias is None else linear.bias.chunk(
        chunks)
    return tuple(F.linear(x, wi, bi) for wi, bi in zip(w, b))


def build_attention(attn_type: str,
                    choices: Dict[str, Callable[[], nn.Module]]
                    ) -> nn.Module:
    """A block's attention by its letter: ``choices[attn_type]()``.

    Every block chooses its attention this way, from a table of the
    family's two constructors (``'L'``: polarity, ``'S'``: softmax).

    Args:
        attn_type: ``'L'`` or ``'S'``.
        choices: letter -> a callable building that attention.

    Raises:
        ValueError: a letter the table does not have.
    """
    if attn_type not in choices:
        names = ', '.join(f'{k!r} ({ATTENTION_LETTERS.get(k, k)})'
                          for k in choices)
        raise ValueError(f'attn_type must be one of {names}, got '
                         f'{attn_type!r}')
    return choices[attn_type]()
