"""The files of an ONNX export: ``FILE.onnx`` and its external weights.

An export writes the verified ``FILE.onnx`` and, when the weights are
stored outside the graph (the dynamo exporter does this; the TorchScript
one above 2 GB), one ``FILE.onnx.data`` next to it
(:func:`data_file_name`), to which the ``.onnx`` refers by that relative
name (:func:`external_data_files` lists what a file refers to;
:func:`gather_external_data` puts what an exporter wrote elsewhere into
that one file). Both are written under their final names in a private
folder next to the destination (:func:`staging_folder`), verified there
and then moved into place, data first and ``.onnx`` last
(:func:`move_into_place`); any failure or interruption removes the folder
and leaves nothing behind (:func:`remove_export` removes a pair that must
not stay).
"""
import contextlib
import os
import os.path as osp
import shutil
import tempfile
from typing import Any, Iterator, List, Sequence

from mmengine.logging import print_log

from .onnx_errors import ExportInputError, first_line

__all__ = [
    'data_file_name', 'external_data_files', 'gather_external_data',
    'remove_export', 'staging_folder', 'move_into_place'
]


def data_file_name(out: str) -> str:
    """The name of the external weights of the ONNX file ``out``:
    ``<basename of out>.data``, next to it (``swin_t.onnx`` ->
    ``swin_t.onnx.data``)."""
    return osp.basename(out) + '.data'


def _graph_tensors(graph: Any) -> Iterator[Any]:
    """Every ``TensorProto`` of an ONNX graph: initialisers and tensor
    attributes of its nodes (``Constant`` values), subgraphs included."""
    import onnx
    yield from graph.initializer
    for node in graph.node:
        for attr in node.attribute:
            if attr.type == onnx.AttributeProto.TENSOR:
                yield attr.t
            elif attr.type == onnx.AttributeProto.TENSORS:
                yield from attr.tensors
            elif attr.type == onnx.AttributeProto.GRAPH:
                yield from _graph_tensors(attr.g)
            elif attr.type == onnx.AttributeProto.GRAPHS:
                for g in attr.graphs:
                    yield from _graph_tensors(g)


def external_data_files(path: str) -> List[str]:
    """The external-data locations that the ONNX file ``path`` refers to,
    as written in the file (paths relative to its folder), in order of first
    use; empty when every weight is inside the file."""
    import onnx
    from onnx.external_data_helper import uses_external_data
    model = onnx.load(path, load_external_data=False)
    locations: List[str] = []
    for tensor in _graph_tensors(model.graph):
        if uses_external_data(tensor):
            for entry in tensor.external_data:
                if entry.key == 'location' and \
                        entry.value not in locations:
                    locations.append(entry.value)
    return locations


def gather_external_data(path: str) -> List[str]:
    """Make the ONNX file ``path`` keep its external weights (if any) in
    the one file :func:`data_file_name` next to it, referred to by that
    relative name; returns the data files it refers to afterwards (none or
    that one).

    The exporters name the data file after the file they write (the dynamo
    exporter: ``<file>.data``; the TorchScript one, above 2 GB: one file
    per tensor); anything else is rewritten here and the old data files are
    removed.
    """
    locations = external_data_files(path)
    wanted = data_file_name(path)
    if not locations or locations == [wanted]:
        return locations
    import onnx
    folder = osp.dirname(osp.abspath(path))
    model = onnx.load(path, load_external_data=True)
    for loc in locations:  # the exporter's files, in the folder of path
        old = osp.abspath(osp.join(folder, loc))
        if osp.dirname(old) == folder and osp.isfile(old):
            os.remove(old)
    onnx.save_model(model, path, save_as_external_data=True,
                    all_tensors_to_one_file=True, location=wanted,
                    size_threshold=1024)
    return external_data_files(path)


def remove_export(out: str) -> None:
    """Remove the ONNX file ``out`` and its external weights
    (:func:`data_file_name`), where written."""
    for path in (out, osp.join(osp.dirname(out), data_file_name(out))):
        if osp.isfile(path):
            os.remove(path)


def _remove_stale_data_file(out: str) -> None:
    """Remove ``<out>.data`` left by an earlier export to ``out`` once the
    new ``out`` (which has no external weights) has replaced that file."""
    stale = osp.join(osp.dirname(osp.abspath(out)), data_file_name(out))
    if osp.isfile(stale):
        os.remove(stale)
        print_log(f'removed {stale}, the weights of the earlier {out}: the '
                  'new file holds its weights itself', logger='current')


@contextlib.contextmanager
def staging_folder(out: str) -> Iterator[str]:
    """A new private folder next to ``out`` (same file system, so files
    move into place atomically), removed with whatever is left in it when
    the block ends, by an error or an interruption too; the destination
    folder is created.

    Raises:
        ExportInputError: ``out`` is a folder, or its folder cannot be
            created or written.
    """
    dest = osp.abspath(out)
    if osp.isdir(dest):
        raise ExportInputError(f'--out {out} is a folder; pass the path of '
                               'the .onnx file to write')
    try:
        os.makedirs(osp.dirname(dest), exist_ok=True)
        folder = tempfile.mkdtemp(prefix=f'.{osp.basename(dest)}.',
                                  suffix='.tmp', dir=osp.dirname(dest))
    except OSError as err:
        raise ExportInputError(
            f'cannot write next to {out} ({type(err).__name__}: '
            f'{err.strerror or first_line(err)}); choose a writable '
            'folder for --out') from err
    try:
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def move_into_place(staged: str, out: str, data_files: Sequence[str]) -> None:
    """Move the ONNX file ``staged`` to ``out`` and its ``data_files``
    (names in its folder, :func:`gather_external_data`) next to ``out``:
    the weights first, the graph last, so that ``out`` never refers to
    weights that are not there. When a move fails, the weights already
    moved are removed again. A ``<out>.data`` of an earlier export is
    removed when the new file has no external weights."""
    staged_folder = osp.dirname(osp.abspath(staged))
    folder = osp.dirname(osp.abspath(out))
    moved: List[str] = []
    try:
        for name in data_files:
            os.replace(osp.join(staged_folder, name), osp.join(folder, name))
            moved.append(osp.join(folder, name))
        os.replace(staged, osp.abspath(out))
    except BaseException:
        for path in moved:  # no weights without their graph
            os.remove(path)
        raise
    if not data_files:
        _remove_stale_data_file(out)
