"""The C allocator under the interpreter (glibc's malloc), tuned for one long-lived controller.

Python allocates objects up to 512 bytes from its own arenas; everything larger (LIST response bodies,
big strings, the tables of large dicts and lists) comes from malloc. Two glibc defaults cost a
controller memory it never gets back (docs/operations.md#memory):

* every thread that allocates gets an arena of its own (up to 8 per core), and the planner threads
  each leave theirs holding freed memory;
* free memory in the middle of the heap stays in the process until `malloc_trim` hands its pages back.

Both calls are looked up at run time: on a C library without them (musl) they do nothing.
"""

from __future__ import annotations

import ctypes
import functools
from collections.abc import Callable
from typing import Any

# mallopt(3): M_ARENA_MAX. Two arenas: the event loop's and one shared by the worker threads.
M_ARENA_MAX = -8
ARENAS = 2


@functools.cache
def _libc_function(name: str) -> Callable[..., Any] | None:
    try:
        return getattr(ctypes.CDLL(None), name)  # type: ignore[no-any-return]
    except (OSError, AttributeError):
        return None


def limit_arenas(arenas: int = ARENAS) -> bool:
    """Cap malloc's arenas before any thread starts; True when the C library took the setting."""
    mallopt = _libc_function("mallopt")
    return bool(mallopt is not None and mallopt(ctypes.c_int(M_ARENA_MAX), ctypes.c_int(arenas)) == 1)


def trim() -> bool:
    """Hand malloc's free pages back to the kernel (the whole heap, not only its top); True when some
    memory was released."""
    malloc_trim = _libc_function("malloc_trim")
    return bool(malloc_trim is not None and malloc_trim(ctypes.c_size_t(0)) == 1)
