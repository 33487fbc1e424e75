"""What the MMDeploy tests share (tests/deployment/test_*.py; the
``photo`` and ``shapes_images`` fixtures are in conftest.py): where the
configs, the trained assets and MMDeploy's stock deploy configs are, and
the tiny UperNet's options."""
import os
import os.path as osp

import pola_mm

HERE = osp.dirname(osp.abspath(__file__))
#: the repository's configs/
CONFIGS = osp.join(osp.dirname(osp.dirname(HERE)), 'configs')
#: trained tiny Pola-PVT detectors for the shapes set (tests/deployment/assets)
DATA = osp.join(HERE, 'assets')
#: MMDeploy's stock deploy configs as pola_mm ships them (the one copy:
#: package data of pola_mm, in the wheel and the sdist), where the imported
#: pola_mm is (the checkout, or an installed wheel in the compat suite)
SHIPPED = osp.join(osp.dirname(pola_mm.__file__), '.mim', 'mmdeploy_configs')
#: the stock configs used: the shipped copy, or a checkout named by
#: $POLA_MM_MMDEPLOY_ROOT
STOCK = osp.join(os.environ.get('POLA_MM_MMDEPLOY_ROOT', SHIPPED), 'configs')


def stock(rel: str) -> str:
    """The stock deploy config ``rel`` (relative to MMDeploy's configs/)."""
    return osp.join(STOCK, rel)


def upernet_options() -> dict:
    """``--cfg-options`` of a tiny UperNet Pola-Swin (16 channels, one
    block a stage, no pretrained weights)."""
    return {
        'model.backbone.init_cfg': None,
        'model.backbone.arch': dict(_delete_=True, embed_dims=16,
                                    depths=[1, 1, 1, 1],
                                    num_heads=[1, 1, 2, 2]),
        'model.decode_head.in_channels': [16, 32, 64, 128],
        'model.decode_head.channels': 32,
        'model.auxiliary_head.in_channels': 64,
        'model.auxiliary_head.channels': 16,
    }
