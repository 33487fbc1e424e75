"""Float32 islands under autocast, on any device.

The attention cores compute in float32 under fp16/bf16 autocast
(``exp`` and powers of fp16 overflow): they run inside :func:`no_autocast`.
``torch.autocast(device_type=..., enabled=False)`` raises for devices that
have no autocast (``meta``, on which timm's tests and the memory estimates
run models); there is nothing to disable there, so :func:`no_autocast` is
then a no-op.
"""
import contextlib
from typing import ContextManager

import torch

__all__ = ['no_autocast', 'autocast_enabled']


def autocast_enabled(device_type: str) -> bool:
    """Whether autocast is on for ``device_type`` (any torch >= 2.0;
    False on ``meta``, which has none)."""
    if device_type == 'meta':
        return False
    try:
        return bool(torch.is_autocast_enabled(device_type))
    except (TypeError, RuntimeError):
        # torch < 2.4 takes no device type; devices without autocast raise
        if device_type == 'cpu':
            return bool(torch.is_autocast_cpu_enabled())
        if device_type == 'cuda':
            return bool(torch.is_autocast_enabled())
        return False


def no_autocast(device_type: str) -> ContextManager[None]:
    """A block computed without autocast on ``device_type`` (a no-op where
    autocast is off or the device has none)."""
    if not autocast_enabled(device_type):
        return contextlib.nullcontext()
    return torch.autocast(device_type=device_type, enabled=False)
