"""The tools' warning filter (:func:`quiet_tool_warnings`)."""
import warnings

__all__ = ['quiet_tool_warnings']


def quiet_tool_warnings() -> None:
    """The tools' warning filter, for their processes only: mmengine 0.10
    and openmim import ``pkg_resources``, and the setuptools they need
    (< 81) warns on each import (4-6 lines per command, nothing a user can
    act on; pola_mm itself does not use it)."""
    warnings.filterwarnings('ignore', message='pkg_resources is deprecated',
                            category=UserWarning)
