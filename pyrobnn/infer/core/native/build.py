"""Building and caching the native kernels: the system's C++ compiler, once per machine.

``<cache>/kernels/`` (``$PYROBNN_CACHE``, default ``~/.cache/pyrobnn``) holds
``mlp-<key>-<sha>.so`` and ``mlp-<key>.json``; the key hashes the source, the header of constants
generated from the Python definitions (:mod:`.constants`), the compiler's version, the flags and
the CPU's instruction sets. Before a library is loaded, its record must name this
key, its SHA-256 must match the record, and the file must belong to this user and not be
writable by others; anything else (a corrupted, truncated or foreign file) is rebuilt, never
loaded. Building writes to a temporary file and renames it into place, under an exclusive lock
on ``<cache>/kernels/.lock``: two processes that find no library at once build it once, the
second waiting for the first and loading its result. A build that fails (no compiler, a full
disk) raises :class:`NativeUnavailable` naming the folder; the samplers' ``backend="auto"`` then
take the torch path and say why.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import hashlib
import json
import os
import platform
import shutil
import stat
import subprocess
import tempfile
import threading
import time

try:
    import fcntl
except ImportError:  # not POSIX: builds are not serialized (each still renames into place)
    fcntl = None

from pyrobnn.infer.core.native import constants

__all__ = [
    "SOURCE", "library", "library_folder", "is_cached", "build_info", "compile_kernels", "load_kernels", "NativeUnavailable",
    "DEFAULT_BUILD_SECONDS",
]

SOURCE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "mlp_kernels.cpp")
ABI = 2
# -fno-trapping-math lets the compiler turn the clamps into vector selects (NaN and inf keep
# their meaning; only floating-point exception flags may differ)
FLAGS = ["-O3", "-fopenmp-simd", "-fno-math-errno", "-fno-trapping-math", "-shared", "-fPIC", "-std=c++17"]
#: glibc's vector math library: the activations' erf, exp, sin, cos and tanh evaluated 4-16 points
#: at a time (the gradient of the surrogates' erf network 1.6-2.0x faster with it than without;
#: docs/logs/benchmarks.md, 2026-12-06). Tried first; a build where it is absent (not glibc on
#: x86-64) goes without it, and the record's ``built_with`` says which. ``--no-undefined``: a
#: libmvec without the variants the compiler called (glibc before 2.35 has no vector erf) fails
#: this build, not the loading of the library it would leave.
VECTOR_MATH = ["-DPYROBNN_VECTOR_MATH", "-lmvec", "-Wl,--no-undefined"]
#: the first build on a machine, in seconds (measured 1.9 s on the reference machine); a guess
#: for the budget rule until this machine has built the library once
DEFAULT_BUILD_SECONDS = 4.0


class NativeUnavailable(RuntimeError):
    """The native library could not be built or loaded (no compiler, a failed build)."""


# ----------------------------------------------------------------------------- the library
def _compiler():
    for name in (os.environ.get("CXX"), "c++", "g++", "clang++"):
        if name and shutil.which(name):
            return shutil.which(name)
    return None


def _compiler_version(cxx) -> str:
    try:
        out = subprocess.run([cxx, "--version"], capture_output=True, text=True, timeout=30)
        return out.stdout.splitlines()[0].strip() if out.stdout else ""
    except (OSError, subprocess.SubprocessError):
        return ""


def _cpu_features() -> str:
    """The instruction sets the build targets with ``-march=native``: the CPU's flags where the
    system lists them, else the processor's name."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    return hashlib.sha256(line.encode()).hexdigest()[:16]
    except OSError:
        pass
    return f"{platform.machine()}-{platform.processor()}"


def library_folder() -> str:
    """The folder that keeps the built library (``<cache>/kernels``, see the module docstring)."""
    from pyrobnn.data import cache_dir

    path = os.path.join(cache_dir(), "kernels")
    os.makedirs(path, mode=0o700, exist_ok=True)
    return path


@functools.lru_cache(maxsize=None)
def _identity(cxx, source=None):
    with open(source or SOURCE, "rb") as f:
        source = f.read()
    ident = {
        "abi": ABI, "source_sha256": hashlib.sha256(source).hexdigest(),
        "header_sha256": hashlib.sha256(constants.header().encode()).hexdigest(), "compiler": _compiler_version(cxx),
        "flags": FLAGS + ["-march=native"] + VECTOR_MATH, "cpu": _cpu_features(), "machine": platform.machine(),
    }
    key = hashlib.sha256(json.dumps(ident, sort_keys=True).encode()).hexdigest()[:20]
    return key, ident


def _sha256(path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _trusted_file(path) -> bool:
    """Owned by this user and writable by no one else (POSIX); always true elsewhere."""
    if not hasattr(os, "getuid"):
        return True
    st = os.stat(path)
    return st.st_uid == os.getuid() and not (st.st_mode & (stat.S_IWGRP | stat.S_IWOTH))


_LOCK = threading.Lock()
_LOADED = {}  # key -> (CDLL, info)


def _check_entry(folder, key, ident):
    """The library recorded for ``key``, or ``(None, why not)``."""
    record_path = os.path.join(folder, f"mlp-{key}.json")
    if not os.path.exists(record_path):
        return None, "not built on this machine yet"
    try:
        with open(record_path) as f:
            record = json.load(f)
        library_path = os.path.join(folder, os.path.basename(str(record["file"])))
        if {k: record.get(k) for k in ident} != ident:
            return None, "the cached library was built from other sources, flags or compiler"
        if not os.path.exists(library_path):
            return None, "the cached library is missing"
        if not _trusted_file(library_path) or not _trusted_file(record_path):
            return None, "the cached library is not owned by this user or is writable by others"
        if _sha256(library_path) != record.get("sha256"):
            return None, "the cached library does not match its checksum (corrupted or replaced)"
    except (OSError, ValueError, KeyError, TypeError):
        return None, "the cache record is unreadable"
    return library_path, record


@contextlib.contextmanager
def _folder_lock(folder):
    """An exclusive ``flock`` on ``folder/.lock`` for the block (released by the kernel if the
    process dies, so a killed build never blocks the next)."""
    if fcntl is None:
        yield
        return
    try:
        fd = os.open(os.path.join(folder, ".lock"), os.O_RDWR | os.O_CREAT, 0o600)
    except OSError as e:
        raise NativeUnavailable(f"the native kernels' cache folder {folder} cannot be written: {e.strerror or e}") from e
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def _build(folder, key, ident, cxx):
    try:
        return _compile(folder, key, ident, cxx)
    except OSError as e:
        raise NativeUnavailable(f"building the native kernels in {folder} failed: {e.strerror or e}") from e


def compile_kernels(source: str, out: str, cxx: str, vector_math: bool = True) -> list:
    """Compile the kernels' C++ ``source`` (a file) into the shared library ``out``, the constants
    header written beside it: for this machine's instruction sets and with glibc's vector math
    library (``VECTOR_MATH``) first, then without either (``vector_math=False``: never with
    it). Returns the flags of the build that succeeded beyond ``FLAGS``; raises
    :class:`NativeUnavailable` when none does."""
    folder = os.path.dirname(os.path.abspath(out))
    with open(os.path.join(folder, constants.HEADER_NAME), "w") as f:
        f.write(constants.header())
    vectors = (VECTOR_MATH, []) if vector_math else ([],)
    errors = []
    for arch in (["-march=native"], []):
        for vector in vectors:
            cmd = [cxx, *FLAGS, *arch, f"-I{folder}", source, "-o", out, *vector]  # libraries after the source
            proc = subprocess.run(cmd, capture_output=True, text=True)
            if proc.returncode == 0:
                return arch + vector
            errors.append(proc.stderr.strip().splitlines()[-1:] if proc.stderr else [f"exit {proc.returncode}"])
    raise NativeUnavailable(f"building the native kernels in {folder} failed ({cxx}): {errors}")


def load_kernels(path: str):
    """The library at ``path`` loaded, its functions declared; :class:`NativeUnavailable` where
    the loader refuses it (a symbol this machine's libraries lack) or it reports another ABI."""
    try:
        lib = ctypes.CDLL(path)
    except OSError as e:
        raise NativeUnavailable(f"the native kernels built in {os.path.dirname(path)} could not be loaded: {e}") from e
    if lib.pyrobnn_kernels_abi() != ABI:
        raise NativeUnavailable(f"{path} reports another ABI than {ABI}")
    _declare(lib)
    return lib


def _compile(folder, key, ident, cxx):
    start = time.perf_counter()
    with tempfile.TemporaryDirectory(dir=folder, prefix=".build-") as tmp:
        out = os.path.join(tmp, "lib.so")
        built_with = compile_kernels(SOURCE, out, cxx)
        os.chmod(out, 0o755 & ~_umask() & ~0o022)  # never writable by others: _trusted_file
        digest = _sha256(out)
        name = f"mlp-{key}-{digest[:16]}.so"
        os.replace(out, os.path.join(folder, name))
        seconds = time.perf_counter() - start
        record = dict(ident, file=name, sha256=digest, build_seconds=round(seconds, 3), built_with=built_with)
        record_tmp = os.path.join(tmp, "record.json")
        with open(record_tmp, "w") as f:
            json.dump(record, f, indent=1)
        os.chmod(record_tmp, 0o644 & ~_umask() & ~0o022)
        os.replace(record_tmp, os.path.join(folder, f"mlp-{key}.json"))
    return os.path.join(folder, name), record


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def is_cached() -> bool:
    """Whether this machine's library is built and in the cache (loading it costs nothing)."""
    cxx = _compiler()
    if cxx is None:
        return False
    key, ident = _identity(cxx, SOURCE)
    if key in _LOADED:
        return True
    return _check_entry(library_folder(), key, ident)[0] is not None


def build_info() -> dict:
    """What :func:`library` would do now: ``compiler`` (path or ``None``), ``cached``, and the
    expected ``build_seconds`` (the last build's on this machine, else a default)."""
    cxx = _compiler()
    info = {"compiler": cxx, "cached": False, "build_seconds": DEFAULT_BUILD_SECONDS}
    if cxx is None:
        return info
    info["cached"] = is_cached()
    try:
        for name in os.listdir(library_folder()):
            if name.startswith("mlp-") and name.endswith(".json"):
                with open(os.path.join(library_folder(), name)) as f:
                    info["build_seconds"] = float(json.load(f).get("build_seconds", DEFAULT_BUILD_SECONDS))
    except (OSError, ValueError, TypeError, AttributeError):
        pass
    return info


def library():
    """The loaded library and its record, ``(ctypes.CDLL, dict)``, building it first if the cache
    has no valid entry for this machine; the record's ``"event"`` says which happened
    (``"cached"``, ``"loaded"`` or ``"built"``, with ``"rebuilt_because"`` where an entry was
    refused). Raises :class:`NativeUnavailable` without a compiler, if the build fails or if the
    built library cannot be loaded."""
    cxx = _compiler()
    if cxx is None:
        raise NativeUnavailable("no C++ compiler found (set CXX, or install g++ or clang++)")
    key, ident = _identity(cxx, SOURCE)
    with _LOCK:
        if key in _LOADED:
            lib, record = _LOADED[key]
            return lib, dict(record, event="cached")
        try:
            folder = library_folder()
        except OSError as e:
            raise NativeUnavailable(f"the native kernels' cache folder cannot be made: {e}") from e
        path, record = _check_entry(folder, key, ident)
        event = {"event": "loaded"}
        if path is None:
            with _folder_lock(folder):
                # another process may have built it while this one waited for the lock
                path, record = _check_entry(folder, key, ident)
                if path is None:
                    event = {"event": "built"}
                    if record != "not built on this machine yet":
                        event["rebuilt_because"] = record
                    path, record = _build(folder, key, ident, cxx)
        lib = load_kernels(path)
        _LOADED[key] = (lib, record)
        return lib, dict(record, **event)


def _declare(lib):
    p, i64 = ctypes.c_void_p, ctypes.c_int64
    for suffix in ("f32", "f64"):
        getattr(lib, f"pyrobnn_value_and_grad_{suffix}").argtypes = [p, i64, p, p, p]
        getattr(lib, f"pyrobnn_nuts_{suffix}").argtypes = [p, i64, p, p, p, p, p, p, i64, p, p]
        getattr(lib, f"pyrobnn_mclmc_{suffix}").argtypes = [p, i64, p, p, p, p, p, p, p, p, i64, p, p]
        for name in ("value_and_grad", "nuts", "mclmc"):
            getattr(lib, f"pyrobnn_{name}_{suffix}").restype = None
