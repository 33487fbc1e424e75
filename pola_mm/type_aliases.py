"""Type aliases shared across pola_mm."""
from typing import Tuple

#: ``(height, width)`` of a map, a window or a shift.
Size2 = Tuple[int, int]
#: ``(top, bottom, left, right)`` padding of a map.
Pad4 = Tuple[int, int, int, int]
