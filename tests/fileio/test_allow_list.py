"""pola_mm's one allow-list (pola_mm/fileio/allow_list.py): torch's
weights-only loader (extended by pola_mm.compat) and pola_mm's restricted
unpickler take their numpy names from the same table, and both read numpy
values back as numpy values."""
import numpy as np
import pytest
import torch

import pola_mm  # noqa: F401  (pola_mm.compat extends torch's allow-list)
from pola_mm.fileio import (CheckpointFileError, InertObject,
                            load_checkpoint_file, numpy_globals,
                            runner_checkpoint_safe_globals)
from pola_mm.fileio.unpickler import allowed_globals


class _Foreign:
    """A global on no allow-list: torch's weights-only loader refuses a file
    that pickles it, so the restricted unpickler reads the file."""


def _numpy_names(names):
    return {n for n in names if n.split('.')[0] == 'numpy'}


def test_both_loaders_take_numpy_from_one_table():
    table = {f'{module}.{name}' for module, name in numpy_globals()}
    assert 'numpy.ndarray' in table and 'numpy.dtype' in table
    for_torch = {entry[1] if isinstance(entry, tuple) else
                 f'{entry.__module__}.{entry.__qualname__}'
                 for entry in runner_checkpoint_safe_globals()}
    assert _numpy_names(for_torch) == table
    unpickler = {f'{module}.{name}' for module, name in allowed_globals()}
    assert _numpy_names(unpickler) == table


@pytest.mark.parametrize('inert', [False, True],
                         ids=['weights-only', 'restricted'])
def test_numpy_values_load_as_numpy(tmp_path, inert):
    meta = dict(loss=np.float64(0.25), count=np.int64(3),
                history=np.arange(4, dtype=np.float32))
    ckpt = dict(state_dict=dict(w=torch.ones(2)), meta=meta)
    if inert:
        ckpt['config'] = _Foreign()
    path = tmp_path / 'ckpt.pth'
    torch.save(ckpt, path)
    out = load_checkpoint_file(str(path), allow_inert=inert)
    assert isinstance(out.get('config'), InertObject) is inert
    assert type(out['meta']['loss']) is np.float64
    assert out['meta']['loss'] == 0.25 and out['meta']['count'] == 3
    assert type(out['meta']['history']) is np.ndarray
    np.testing.assert_array_equal(out['meta']['history'],
                                  np.arange(4, dtype=np.float32))
    assert torch.equal(out['state_dict']['w'], torch.ones(2))


def test_numpy_array_subclass_is_refused(tmp_path):
    """``_reconstruct`` is on the list, but only for plain arrays: a
    pickled ndarray subclass is refused, not built."""
    path = tmp_path / 'ckpt.pth'
    torch.save(dict(state_dict=dict(w=torch.ones(1)),
                    extra=np.arange(3).view(np.recarray)), path)
    with pytest.raises(CheckpointFileError, match='numpy array of type'):
        load_checkpoint_file(str(path))
