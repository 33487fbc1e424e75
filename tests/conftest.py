"""Shared pytest set-up: headless plotting, quiet thread pools, tests/
importable."""
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

REPO_ROOT = os.path.dirname(TESTS_DIR)


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


def reference_root(required_file: str) -> str:
    """The authors' reference folder (``../shared/reference`` or
    ``$POLA_MM_REFERENCE``) if it holds ``required_file``.

    Outside CI a missing folder skips the test with the reason; under CI
    (``CI`` set, where the folder is always laid beside the clone) it fails,
    so the equivalence tests can never be silently skipped there.
    """
    import pytest
    root = os.environ.get('POLA_MM_REFERENCE') or os.path.join(
        REPO_ROOT, '..', 'shared', 'reference')
    path = os.path.join(root, required_file)
    if not os.path.isfile(path):
        msg = (f'reference file {path} not found (set POLA_MM_REFERENCE to '
               'the folder holding the authors\' reference files)')
        if os.environ.get('CI'):
            pytest.fail(msg)
        pytest.skip(msg)
    return root
