"""Helpers shared by the Pola backbones: arch resolution, freezing, init."""
from typing import Dict, List, Sequence, Tuple, Union

import torch.nn as nn
from mmengine.model.weight_init import trunc_normal_

from torch import Tensor

from ..layers import PolarityAttention, WindowMSA

Size2 = Tuple[int, int]


def pair(x: Union[int, Sequence[int]]) -> Size2:
    """``int -> (int, int)``; sequences are returned as a pair of ints."""
    if isinstance(x, int):
        return (x, x)
    return (int(x[0]), int(x[1]))


def linspace(end: float, num: int) -> List[float]:
    """``num`` values evenly spaced over ``[0, end]`` (stochastic depth
    rates; plain Python so building works on any default device)."""
    if num == 1:
        return [0.0]
    return [end * i / (num - 1) for i in range(num)]


def resolve_arch(arch: Union[str, dict], zoo: Dict[str, dict],
                 keys: Sequence[str], cls: type) -> dict:
    if isinstance(arch, str):
        name = arch.lower()
        if name not in zoo:
            raise ValueError(f'{cls.__name__}: unknown arch {arch!r}; valid '
                             f'names are {sorted(zoo)} or a dict with keys '
                             f'{list(keys)}')
        return dict(zoo[name])
    if not isinstance(arch, dict):
        raise TypeError(f'{cls.__name__}: arch must be a name '
                        f'{sorted(zoo)} or a dict, got {type(arch).__name__}')
    missing = [k for k in keys if k not in arch]
    if missing:
        raise KeyError(f'{cls.__name__}: arch dict is missing {missing}; '
                       f'required keys are {list(keys)}')
    return dict(arch)


def check_out_indices(out_indices: Union[int, Sequence[int]],
                      num_stages: int) -> Tuple[int, ...]:
    if isinstance(out_indices, int):
        out_indices = (out_indices, )
    out = []
    for i in out_indices:
        j = i + num_stages if i < 0 else i
        if not 0 <= j < num_stages:
            raise ValueError(f'out_indices {tuple(out_indices)} must lie in '
                             f'[0, {num_stages})')
        out.append(j)
    if not out:
        raise ValueError('out_indices must not be empty')
    return tuple(sorted(set(out)))


def freeze(module: nn.Module) -> None:
    module.eval()
    for p in module.parameters():
        p.requires_grad = False


def init_module(m: nn.Module) -> None:
    if isinstance(m, nn.Linear):
        trunc_normal_(m.weight, std=.02)
        if m.bias is not None:
            nn.init.zeros_(m.bias)
    elif isinstance(m, nn.LayerNorm):
        if m.weight is not None:
            nn.init.ones_(m.weight)
        if m.bias is not None:
            nn.init.zeros_(m.bias)
    elif isinstance(m, PolarityAttention):
        nn.init.zeros_(m.power)
        nn.init.zeros_(m.scale)
        nn.init.zeros_(m.positional_encoding)
    elif isinstance(m, WindowMSA):
        trunc_normal_(m.relative_position_bias_table, std=.02)


def check_input(x: Tensor, in_channels: int, name: str) -> None:
    """Raise a clear error unless ``x`` is an image batch ``(B, Cin, H, W)``.

    Args:
        x: the backbone input.
        in_channels: the ``Cin`` the backbone was built with.
        name: the backbone's class name, for the message.
    """
    if x.dim() != 4 or x.shape[1] != in_channels:
        raise ValueError(
            f'{name} expects images of shape (B, {in_channels}, H, W), got '
            f'{tuple(x.shape)}; add a batch dimension, or build the backbone '
            f'with in_channels={x.shape[1] if x.dim() == 4 else "C"}')
