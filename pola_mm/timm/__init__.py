"""Pola-Swin, Pola-PVT and PolaPP (PolaFormer++) as timm models.

``import pola_mm.timm`` registers, in timm's model registry (one file a
family, in timm's shape: explicit ``@register_model`` functions, default
configs from ``generate_default_cfgs``):

- :mod:`.pola_swin`: ``pola_swin_tiny``, ``pola_swin_small``,
  ``pola_swin_base`` (224) and ``pola_swin_base_384`` (384, polarity window
  96, the authors' fine-tune setting), short names ``pola_swin_t``,
  ``pola_swin_s``, ``pola_swin_b``;
- :mod:`.pola_pvt`: ``pola_pvt_tiny``, ``pola_pvt_small``,
  ``pola_pvt_medium``, ``pola_pvt_large``, short names ``pola_pvt_t``,
  ``pola_pvt_s``, ``pola_pvt_m``, ``pola_pvt_l``;
- :mod:`.polapp`: ``polapp_b0`` ... ``polapp_b5``, the authors'
  PolaFormer++ ImageNet classifiers.

Each model holds pola_mm's backbone (the same code the OpenMMLab configs
build; its ``arch_zoo`` defines the archs) as ``backbone`` and timm's
``ClassifierHead`` as ``head`` (PolaPP also the authors' ``proj``/``norm``/
Swish as ``neck``). :class:`~.base.PolaClassifier` runs the backbone's
one stage loop (``run_stages``) for every timm entry point. The state
dict is mmpretrain's classifier layout (``backbone.*``, ``neck.*``,
``head.fc.*``), and :func:`checkpoint_filter_fn` converts the authors'
files (recognised by their sentinel key).

torch.fx: the modules whose forward branches on sizes (patch embedding,
patch merging, the blocks) are registered with timm's
``register_notrace_module`` and the position-table resize and the input
check with ``register_notrace_function``.
"""
try:
    import timm  # noqa: F401
except ImportError as err:
    raise ImportError('pola_mm.timm needs timm (1.0 or newer): '
                      'pip install timm') from err

from .base import (AUTHORS_HF_HUB_ID, AUTHORS_WEIGHTS, PolaClassifier,
                   checkpoint_filter_fn, no_weights_message)
from .pola_pvt import PolaPVTClassifier
from .pola_swin import PolaSwin
from .polapp import POLAPP_WEIGHTS, PolaPPClassifier

__all__ = ['PolaClassifier', 'PolaSwin', 'PolaPVTClassifier',
           'PolaPPClassifier', 'checkpoint_filter_fn', 'no_weights_message',
           'AUTHORS_WEIGHTS', 'AUTHORS_HF_HUB_ID', 'POLAPP_WEIGHTS']
