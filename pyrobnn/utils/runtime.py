"""Process-level settings: those that make CPU training faster, and the default dtype and device held
for code that makes its tensors on them (Pyro's own samplers)."""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util

__all__ = ["tune_cpu_allocator", "raised_recompile_limits", "compiled", "tensor_defaults"]


@contextlib.contextmanager
def tensor_defaults(dtype, device):
    """Within the block, torch's default dtype and device are ``dtype`` and ``device``; the earlier
    ones are restored on the way out, also after an error. For library code that makes tensors
    without naming either: Pyro's HMC and NUTS draw their momenta and make their mass matrices on
    the defaults, so a float32 model under ``torch.set_default_dtype(torch.float64)`` had float64
    weights pushed into it."""
    import torch

    before = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with torch.device(device):
            yield
    finally:
        torch.set_default_dtype(before)


def raised_recompile_limits(enabled: bool = True):
    """A context lifting Dynamo's per-function recompilation limits (a no-op unless ``enabled``).

    A sampler compiles its step for each potential it is given (Dynamo guards on the potential
    object), so each run compiles anew; past the default limit of 8 recompilations per function
    Dynamo silently runs the step eagerly, several times slower, from the ninth run in a process
    on (the ninth UCI split, or the ninth data set and seed of a benchmark)."""
    if not enabled:
        return contextlib.nullcontext()
    import torch._dynamo

    names = {"recompile_limit": 4096, "cache_size_limit": 4096, "accumulated_recompile_limit": 65536, "accumulated_cache_size_limit": 65536}
    return torch._dynamo.config.patch(**{k: v for k, v in names.items() if hasattr(torch._dynamo.config, k)})

def compiled(fn, **options):
    """``torch.compile(fn, **options)``, with torch's C++ build helpers imported first and quietly.

    Inductor imports ``torch.utils.cpp_extension`` the first time it builds a kernel, and that
    import logs "No CUDA runtime is found, using CUDA_HOME=..." on a machine that has the CUDA
    toolkit but no GPU: true, but nothing for a user compiling CPU code to act on. The message
    is logged once, at import, so importing the module here with its logger raised to ERROR
    silences that message alone."""
    import logging

    import torch

    logger = logging.getLogger("torch.utils.cpp_extension")
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        import torch.utils.cpp_extension  # noqa: F401
    finally:
        logger.setLevel(level)
    return torch.compile(fn, **options)


_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3


def tune_cpu_allocator(threshold: int = 1 << 30) -> bool:
    """Keep freed memory in the process instead of returning it to the OS after each tensor.

    PyTorch's CPU allocator is the C library's ``malloc``. With glibc's defaults every
    temporary tensor above 128 KiB to 32 MiB (a 300 x 784 weight-sized intermediate is 1 MiB)
    may be mapped fresh and page-faulted in, then unmapped; a BNN step makes dozens of them,
    and on the reference machine element-wise operations ran up to 50x slower inside the step
    than in isolation. Raising glibc's mmap and trim thresholds (the same as setting
    ``MALLOC_MMAP_THRESHOLD_`` and ``MALLOC_TRIM_THRESHOLD_``, or preloading jemalloc or
    tcmalloc) keeps that memory mapped: the process's resident memory stays at its high-water
    mark in exchange. It affects the whole process, so it is never done implicitly.

    :returns: whether the setting was applied (``False`` off glibc).
    """
    name = ctypes.util.find_library("c")
    if not name:
        return False
    try:
        libc = ctypes.CDLL(name)
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    return bool(mallopt(_M_MMAP_THRESHOLD, threshold)) and bool(mallopt(_M_TRIM_THRESHOLD, threshold))
