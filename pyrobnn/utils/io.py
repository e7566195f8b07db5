"""Saving and loading trained models and guides, safely.

Files are written atomically (a temporary file in the same folder, flushed to disk, then
renamed over the target), so an interrupted save never leaves a truncated file. A write that
fails (a full disk, a quota, a read-only folder) raises an ``OSError`` that names the file and
says that the earlier file, if any, is unchanged; the temporary file is removed. Loading uses
``torch.load(weights_only=True)``: only tensors and plain containers are unpickled, and a file
that carries any other object (which could execute code when unpickled) is refused.

A file holds state, not code: load it into a model and guide built the same way, as with
``nn.Module.load_state_dict``. The file records the site names and shapes and the classes
involved, and loading checks them, so a mismatch fails with a message instead of loading
weights into the wrong places.
"""

from __future__ import annotations

import errno
import io
import json
import os
import pickle
import tempfile
import time

import torch

__all__ = [
    "save", "load", "atomic_save", "atomic_write_text", "atomic_write_bytes", "record_results", "safe_load", "describe", "WriteError",
    "unwritable_reason",
]

FORMAT = "pyrobnn"
VERSION = 1


#: temporary files of an atomic write: ``.tmp-pyrobnn-<pid>-<random>`` beside the target
TMP_PREFIX = ".tmp-pyrobnn-"
#: a temporary file of a process that no longer runs, older than this, is a leftover of a killed
#: save (on a shared folder the process may run on another host: the age protects its write)
STALE_SECONDS = 600.0


def _remove_stale_temporaries(folder) -> None:
    now = time.time()
    try:
        names = [n for n in os.listdir(folder) if n.startswith(TMP_PREFIX)]
    except OSError:
        return
    for name in names:
        pid = name[len(TMP_PREFIX):].split("-", 1)[0]
        if not pid.isdigit() or int(pid) == os.getpid():
            continue
        path = os.path.join(folder, name)
        try:
            os.kill(int(pid), 0)
            continue  # that process still runs here
        except ProcessLookupError:
            pass
        except (PermissionError, OverflowError):
            continue  # alive (another user's) or not a pid of this host
        try:
            if now - os.path.getmtime(path) > STALE_SECONDS:
                os.unlink(path)
        except OSError:
            pass


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


class WriteError(OSError):
    """Writing a file failed: an ``OSError`` with the same ``errno`` whose message names the file
    and says what became of the earlier one."""

    def __str__(self):
        return self.strerror


def _write_error(e: OSError, path: str, existed: bool) -> WriteError:
    what = {errno.ENOSPC: "no space left on the device", errno.EDQUOT: "the disk quota is exceeded", errno.EFBIG: "the file is too large for the file system or its limit"}
    reason = what.get(e.errno, e.strerror or str(e))
    kept = f"the earlier {path} is unchanged" if existed else "no file was written"
    remedy = f"free space in {os.path.dirname(path) or '.'} or write elsewhere" if e.errno in what else "write elsewhere"
    err = WriteError(e.errno, f"could not write {path}: {reason} ({kept}; {remedy})")
    err.filename = path
    return err


def unwritable_reason(path):
    """Why an atomic write to ``path`` (which creates missing folders) cannot succeed, as far as
    the file system tells without writing anything: ``None`` where it can. A full disk is not
    foreseen here; the write itself names it."""
    path = os.path.abspath(os.fspath(path))
    if os.path.isdir(path):
        return "it is a folder (pass a file path in it)"
    folder = existing = os.path.dirname(path)
    while not os.path.exists(existing) and os.path.dirname(existing) != existing:
        existing = os.path.dirname(existing)
    if not os.path.isdir(existing):
        return f"{existing} is a file, not a folder"
    if not os.access(existing, os.W_OK | os.X_OK):
        return f"the folder {existing} is not writable" + ("" if existing == folder else f" (to create {folder} in)")
    if os.path.exists(path) and not os.access(path, os.R_OK):
        return "it exists and cannot be read"
    return None


def _write_all(fd: int, data) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def _atomic_write(path, data) -> None:
    """Write the bytes ``data`` to a temporary file beside ``path``, flush it to disk and rename
    it over ``path``; on any failure remove the temporary file and keep the earlier ``path``. The
    file gets the permissions a new file gets under the user's umask (``tempfile`` would make it
    private, 0600), and leftovers of killed saves in the folder (see ``STALE_SECONDS``) are
    removed first. An ``OSError`` becomes a :class:`WriteError` naming ``path``."""
    path = os.path.abspath(os.fspath(path))
    folder = os.path.dirname(path)
    existed = os.path.exists(path)
    tmp = None
    try:
        os.makedirs(folder, exist_ok=True)
        _remove_stale_temporaries(folder)
        fd, tmp = tempfile.mkstemp(prefix=f"{TMP_PREFIX}{os.getpid()}-", dir=folder)
        try:
            os.fchmod(fd, 0o666 & ~_umask())
            _write_all(fd, data)
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except BaseException as e:
        if tmp is not None and os.path.exists(tmp):
            os.unlink(tmp)
        if isinstance(e, OSError) and not isinstance(e, WriteError):
            raise _write_error(e, path, existed) from e
        raise


def atomic_save(obj, path) -> None:
    """``torch.save(obj, path)`` through a temporary file and an atomic rename. The object is
    serialized in memory first, so that a failing disk is met by ``os.write`` (which says why)
    and not inside torch's zip writer (which does not)."""
    buffer = io.BytesIO()
    torch.save(obj, buffer)
    _atomic_write(path, buffer.getbuffer())


def atomic_write_text(text: str, path) -> None:
    """Write ``text`` (UTF-8) to ``path`` through a temporary file and an atomic rename."""
    _atomic_write(path, text.encode("utf-8"))


def atomic_write_bytes(data: bytes, path) -> None:
    """Write ``data`` to ``path`` through a temporary file and an atomic rename."""
    _atomic_write(path, data)


def record_results(path, entries) -> list:
    """Merge ``entries`` (dicts with at least ``name`` and ``metric``) into the JSON list at
    ``path``: an entry replaces the one with the same ``(name, metric)``; the file is
    rewritten atomically. Returns the merged list."""
    path = os.fspath(path)
    records = []
    if os.path.exists(path):
        with open(path) as f:
            records = json.load(f)
        if not isinstance(records, list):
            raise ValueError(f"{path} does not hold a JSON list of results")
    for entry in entries:
        if "name" not in entry or "metric" not in entry:
            raise ValueError(f"a result needs 'name' and 'metric': {entry}")
        records = [r for r in records if (r.get("name"), r.get("metric")) != (entry["name"], entry["metric"])]
        records.append(dict(entry))
    atomic_write_text(json.dumps(records, indent=1) + "\n", path)
    return records


def _unpickler_reason(message: str) -> str:
    """The line of torch's weights-only error that says what was found (after its
    "WeightsUnpickler error:"), else its first line."""
    lines = [line.strip() for line in message.splitlines()]
    for i, line in enumerate(lines):
        if line.startswith("WeightsUnpickler error"):
            rest = [r for r in lines[i + 1 :] if r]
            if rest:
                return rest[0]
    return lines[0] if lines else message


def safe_load(path, map_location=None):
    """``torch.load(path, weights_only=True)``, with a clear error for refused files: one that
    carries objects other than tensors and plain containers, and one that is empty, truncated or
    not a PyTorch file at all."""
    path = os.fspath(path)
    if not os.path.isfile(path):
        raise FileNotFoundError(f"no file at {path}")
    try:
        return torch.load(path, map_location=map_location, weights_only=True)
    except (pickle.UnpicklingError, AttributeError) as e:
        # torch words every failure of its restricted unpickler as a weights-only failure; only
        # an object it does not allow ("Unsupported global") is one, the rest is a broken stream
        reason = _unpickler_reason(str(e))
        if "unsupported global" not in str(e).lower():
            raise ValueError(f"{path} is corrupted or not a pyrobnn file ({type(e).__name__}: {reason[:200]})") from e
        raise ValueError(
            f"refusing to load {path}: it is not a file of tensors and plain containers "
            f"(torch.load with weights_only=True rejected it: {reason})"
        ) from e
    except (RuntimeError, EOFError, IndexError, OSError, ValueError, KeyError) as e:
        first = str(e).splitlines()[0][:200] if str(e) else "the file ended early" if isinstance(e, EOFError) else ""
        raise ValueError(f"{path} is corrupted or not a pyrobnn file ({type(e).__name__}{': ' + first if first else ''})") from e


def describe(model, guide) -> dict:
    """What a saved file must match: classes and site shapes."""
    return {
        "net": type(model.net).__name__,
        "likelihood": type(model.likelihood).__name__,
        "guide": type(guide).__name__,
        "sites": [[s.name, list(s.shape)] for s in model.sites],
    }


def save(path, model, guide, metadata: dict | None = None) -> None:
    """Write a trained model and guide to one file (atomically).

    :param metadata: plain data (numbers, strings, lists, dicts, tensors) to store beside.
    """
    atomic_save(
        {
            "format": FORMAT,
            "version": VERSION,
            "config": describe(model, guide),
            "model": model.state_dict(),
            "guide": guide.state_dict(),
            "metadata": metadata or {},
        },
        path,
    )


def _check_format(obj, path):
    if not isinstance(obj, dict) or obj.get("format") != FORMAT:
        raise ValueError(f"{path} is not a pyrobnn file")
    if obj.get("version") != VERSION:
        raise ValueError(f"{path} has format version {obj.get('version')}; this pyrobnn reads {VERSION}")


def check_config(saved: dict, model, guide, path) -> None:
    current = describe(model, guide)
    for key in ("net", "likelihood", "guide"):
        if saved.get(key) != current[key]:
            raise ValueError(f"{path} holds a {key} of type {saved.get(key)}, not {current[key]}")
    if saved.get("sites") != current["sites"]:
        raise ValueError(
            f"{path} holds weight sites {saved.get('sites')}, but the model has {current['sites']}"
        )


def load(path, model, guide, map_location=None) -> dict:
    """Load a file written by :func:`save` into ``model`` and ``guide``; returns its metadata."""
    obj = safe_load(path, map_location)
    _check_format(obj, path)
    check_config(obj["config"], model, guide, path)
    model.load_state_dict(obj["model"])
    guide.load_state_dict(obj["guide"])
    return obj["metadata"]
