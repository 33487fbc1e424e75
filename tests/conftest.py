"""Shared pytest set-up: headless plotting, the Triton interpreter without a
GPU, tests/ importable, the tiers' rule, mmengine's checkpoint loaders
restored after each test, the ``reference_dir`` fixture."""
import os
import sys

import pytest

os.environ.setdefault('MPLBACKEND', 'Agg')


def _interpret_triton_without_gpu() -> None:
    """Without a GPU, Triton's interpreter runs the kernels on CPU tensors
    (the kernel tests, tests/ops/test_*_triton.py). Triton reads the switch
    when a kernel is decorated, so it is set here, before any test module
    imports pola_mm."""
    import torch
    if not torch.cuda.is_available():
        os.environ.setdefault('TRITON_INTERPRET', '1')


_interpret_triton_without_gpu()

TESTS_DIR = os.path.dirname(os.path.abspath(__file__))
if TESTS_DIR not in sys.path:  # helper modules such as compat_tiny
    sys.path.insert(0, TESTS_DIR)

from helpers import reference_root  # noqa: E402

#: markers whose tests are outside the quick tier, hence also ``slow``
SLOW_KINDS = ('e2e', 'export', 'gpu')


def pytest_collection_modifyitems(config, items):
    """The tiers' one rule (setup.cfg, docs/testing.md): a test marked
    e2e, export or gpu is marked slow too, so ``-m "not slow"`` leaves it
    out."""
    wrong = [item.nodeid for item in items
             if not item.get_closest_marker('slow') and any(
                 item.get_closest_marker(kind) for kind in SLOW_KINDS)]
    if wrong:
        raise pytest.UsageError(
            f'marked {" / ".join(SLOW_KINDS)} but not slow '
            '(docs/testing.md, "Tiers"):\n' + '\n'.join(wrong[:20]))


@pytest.fixture(autouse=True)
def _restore_checkpoint_loaders():
    """mmengine's checkpoint loaders as they were before each test.

    The tools (``pola_mm.cli.train_test``: ``train_main``, ``test_main``)
    install pola_mm's checked loader into mmengine's ``CheckpointLoader``
    for the whole process, by design; a test that runs a tool in this
    process must not change how later tests load files (e.g. which error
    ``mmengine.runner.load_checkpoint`` raises)."""
    module = sys.modules.get('mmengine.runner.checkpoint')
    before = None if module is None else dict(
        module.CheckpointLoader._schemes)
    yield
    if before is not None:
        schemes = module.CheckpointLoader._schemes
        if schemes != before:
            schemes.clear()
            schemes.update(before)


@pytest.fixture(scope='session')
def reference_dir() -> str:
    """The authors' reference folder (see :func:`reference_root`)."""
    return reference_root('official_pola_swin_mini_io.pth')
