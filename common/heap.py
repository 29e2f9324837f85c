"""The Python heap after start-up, out of the garbage collector's way.

A full collection walks every object the process holds. After start-up that is mostly what loading
left behind (modules, the tokenizer, torch and the model's Python objects), none of which will become
garbage. On an H200 host a full collection took 30-38 ms in a frontend under load and up to 230 ms in a
GPU worker at start-up (bench/gc_pauses.py), landing on whichever request was being served. Frozen,
those objects are never walked again, so a full collection costs what was allocated since.
"""

from __future__ import annotations

import gc


def freeze_startup_heap() -> None:
    """Collect what start-up left as garbage, then move every object still alive into the permanent
    generation (gc.freeze): call once, when the process is about to serve."""
    gc.collect()
    gc.freeze()
