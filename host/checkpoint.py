"""Training checkpoints: arrays + JSON metadata in one ``.npz``, written atomically.

The file is written to a temporary name in the same folder, flushed to disk and then
moved over the target with :func:`os.replace`, so a crash or Ctrl-C while saving leaves
either the old checkpoint or the new one, never a torn file.
"""
from __future__ import annotations

import json
import os
import tempfile
import zipfile
from pathlib import Path

import numpy as np

from gnnweave.errors import InputError

FORMAT_VERSION = 1
_META_KEY = "__meta__"


class CheckpointError(InputError):
    """A checkpoint that cannot be used; the message names the file and the field."""


def _umask() -> int:
    """The process umask. Linux reports it in /proc/self/status; elsewhere it can only be
    read by setting it, which changes it for an instant for every thread of the process
    (so the /proc route first, and the restrictive value for that instant)."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except OSError:
        pass
    umask = os.umask(0o077)   # the restrictive side for that instant
    os.umask(umask)
    return umask


def save_checkpoint(path, arrays: dict[str, np.ndarray], meta: dict) -> Path:
    """Write ``arrays`` and JSON-serialisable ``meta`` to ``path`` atomically."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    for name in arrays:
        if name == _META_KEY or "/" in name:
            raise CheckpointError(f"{path}: array name {name!r} is reserved or has a '/'")
    meta = dict(meta, format_version=FORMAT_VERSION)
    blob = np.frombuffer(json.dumps(meta, sort_keys=True).encode(), dtype=np.uint8)
    return write_npz_atomic(path, {_META_KEY: blob, **arrays})


def write_npz_atomic(path, arrays: dict) -> Path:
    """``np.savez`` of ``arrays`` to ``path`` through a temporary file in the same folder,
    synced and renamed, so a reader sees the old file or the whole new one."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=path.name + ".", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            np.savez(f, **{k: np.asarray(v) for k, v in arrays.items()})
            f.flush()
            os.fsync(f.fileno())
        # mkstemp makes the file 0600: give it the mode a plain open() would have
        os.chmod(tmp, 0o666 & ~_umask())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    return path


def load_checkpoint(path) -> tuple[dict[str, np.ndarray], dict]:
    """(arrays, meta) from a file written by :func:`save_checkpoint`."""
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"{path}: no such checkpoint")
    try:
        with np.load(path, allow_pickle=False) as z:
            if _META_KEY not in z.files:
                raise CheckpointError(f"{path}: not a gnnweave checkpoint (no {_META_KEY} field)")
            meta = json.loads(bytes(z[_META_KEY]).decode())
            arrays = {k: z[k] for k in z.files if k != _META_KEY}
    except json.JSONDecodeError as exc:
        raise CheckpointError(f"{path}: field {_META_KEY} is not valid JSON ({exc})") from None
    except CheckpointError:
        raise
    except (zipfile.BadZipFile, OSError, EOFError, ValueError) as exc:
        reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise CheckpointError(f"{path}: unreadable checkpoint ({reason[:120]})") from None
    version = meta.get("format_version")
    if version != FORMAT_VERSION:
        raise CheckpointError(f"{path}: field format_version is {version!r}, "
                              f"this build reads {FORMAT_VERSION}")
    return arrays, meta


def check_compatible(path, saved: dict, current: dict):
    """Raise when a resumed run's settings differ from the checkpoint's (first field named)."""
    for key in sorted(set(saved) | set(current)):
        if saved.get(key) != current.get(key):
            raise CheckpointError(
                f"{path}: field config.{key} is {saved.get(key)!r} in the checkpoint but "
                f"{current.get(key)!r} now; resume with the same settings or a new checkpoint dir")
