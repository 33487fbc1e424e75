"""The errors of pola_mm's ONNX export, and how their messages quote an
exception.

:class:`ExportError` is an export that failed or whose file disagrees
with PyTorch; :class:`ExportInputError` (a subclass) is an input the
export cannot use. The third, :class:`~pola_mm.deployment.onnx_refusal.
DynamicExportRefused`, lives with the checks that raise it
(:mod:`pola_mm.deployment.onnx_refusal`). Every module of the export
quotes a caught exception by :func:`first_line`.
"""

__all__ = ['ExportError', 'ExportInputError', 'first_line']


class ExportError(RuntimeError):
    """An export that failed or whose file disagrees with PyTorch; the
    message says what went wrong and what to try."""


class ExportInputError(ExportError):
    """What the export was given cannot be used: a missing, unreadable or
    corrupt config or checkpoint, a config without a pola_mm backbone, a
    checkpoint of another arch, or a destination that cannot be written.
    The message is one line naming the problem and the fix (``python -m
    pola_mm.deployment.pytorch2onnx`` exits with 2 on it, with 1 on other
    :class:`ExportError`)."""


def first_line(err: BaseException) -> str:
    """The first line of an exception's message (its type's name if the
    message is empty), for one-line error messages that quote it.

    A ``KeyError``'s own message is used unquoted (``str()`` of a
    ``KeyError`` puts its message in quotes).
    """
    text = (str(err.args[0]) if isinstance(err, KeyError) and err.args else
            str(err))
    lines = text.strip().splitlines()
    return lines[0] if lines else type(err).__name__
