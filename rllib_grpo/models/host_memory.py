"""Freed host memory kept in the process, for learners that compute on the CPU.

A CPU learner's step allocates the same large tensors every step (logits, activations and
their gradients: gigabytes on SmolLM2-135M).  glibc's malloc serves blocks above its mmap
threshold (at most 32 MiB) with a fresh ``mmap`` and gives them back with ``munmap`` when
they are freed, so every step page-faults its tensors in again, and the kernel zeroes each
page.  In a VM that hands freed memory back to its host (virtio-balloon free page
reporting, as the Firecracker VM this was measured on) a first touch costs ~12 us per 4 KiB page
instead of ~1.7 us.  Measured on SmolLM2 (`benchmarks.trl_side_by_side` workload, vLLM,
1 thread): 1.0-1.8 million page faults and 3-11 s of kernel time per 30-40 s step; with
the memory kept, 28,000 faults and 0.6 s from the third step on.  `make demo-real`: steps
of 7.0 s -> 6.0 s (mean of the last 10), 174-177 s -> 155 s wall.

What it costs: the process's resident memory no longer shrinks after its peak, and the
peak grows, since a block freed inside the heap serves only blocks that fit it: SmolLM2's
side-by-side process tree 7.4 -> 8.8 GB PSS with vLLM, 6.4 -> 7.4 GB with the transformers
sampler (benchmarks/README.md); the 5.7M model's did not move.  (tcmalloc and jemalloc,
which vLLM recommends preloading on CPUs, keep freed memory too.)
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import platform

logger = logging.getLogger(__name__)

# glibc's mallopt parameters (malloc.h).
M_TRIM_THRESHOLD = -1
M_MMAP_MAX = -4
NO_TRIM = -1  # mallopt(M_TRIM_THRESHOLD, -1): never give the heap's top back (man mallopt)

_kept = False


def keep_freed_host_memory() -> bool:
    """Make glibc's malloc serve every block from its heap (``M_MMAP_MAX`` 0) and never
    trim the heap (``M_TRIM_THRESHOLD`` -1): memory a tensor frees is reused by the next
    one instead of returned to the kernel.  Process-wide and not undone; a second call does
    nothing.  Returns True where it took effect (glibc), False elsewhere (macOS, musl)."""
    global _kept
    if _kept:
        return True
    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        return False
    libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
    # mallopt returns 1 on success, 0 on error.
    _kept = bool(libc.mallopt(M_MMAP_MAX, 0)) and bool(libc.mallopt(M_TRIM_THRESHOLD, NO_TRIM))
    if not _kept:
        logger.warning("mallopt refused; freed host memory goes back to the kernel")
    return _kept
