"""losslab: trustworthy post-training RL loss experiments.

One plan file answers four questions before GPU hours are spent: is my loss the paper's loss
(correctness preflight), are the arms comparable (restoration preflight), does the loss act in my
regime (activation gate), and which arm wins (paired evaluation and a pre-registered decision rule).
"""

import os as _os
import sys as _sys

__version__ = "0.1.0"

THP_ENV = "THP_MEM_ALLOC_ENABLE"
TORCH_IMPORTED_FIRST = "torch" in _sys.modules
THP_SET_BY_LOSSLAB = THP_ENV not in _os.environ and not TORCH_IMPORTED_FIRST
"""True when importing losslab turned on torch's huge-page CPU allocations (see
`losslab.backends.local.memory.cpu_allocator`). torch reads `THP_MEM_ALLOC_ENABLE` once, at its
first allocation, so only an import before torch's can set it; a value already in the
environment (`0` to opt out) is left alone."""
if THP_SET_BY_LOSSLAB:
    _os.environ[THP_ENV] = "1"
