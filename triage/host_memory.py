"""This process's memory as float32 and float64 values, to read one value of a CPU tensor by its address.

The wrapper's per-step gradient peek and the training-health checks read a value with a subscript,
where ctypes' from_address builds an object per read (microseconds with the caches cold right after
backward()). Only ever indexed at the address torch gives for a live CPU tensor of that dtype.
"""

from __future__ import annotations

import ctypes
import sys

HOST_MEMORY = memoryview((ctypes.c_char * ((sys.maxsize + 1) // 2)).from_address(0)).cast("B")
# dtype name -> (the view of memory as that type, the shift from a byte address to an index)
READERS = {"torch.float32": (HOST_MEMORY.cast("f"), 2), "torch.float64": (HOST_MEMORY.cast("d"), 3)}
