"""Necks of pola_mm (registered in ``MODELS`` and MMEngine's root)."""
from .polapp_cls_neck import PolaPPClsNeck

__all__ = ['PolaPPClsNeck']
