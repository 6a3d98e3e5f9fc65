"""Files that appear whole or not at all: write to a temporary name beside the target, then ``os.replace`` it.

Every writer of a file a user or another process may read while it is being written (checkpoints, option copies,
exported networks, safetensors, frame-index caches, CSVs, reports, the synthetic-video folder) goes through
:func:`atomic_path` or :func:`atomic_open`, so a crash, a full disk or a concurrent reader never sees a truncated
file under its final name, and a failed write leaves the previous file as it was.

The temporary lives in the target's folder (a rename is atomic only within one file system) under a name unique to
the process and the call: ``.<name>.tmp<pid>-<8 hex>`` (hidden: no folder listing, ``glob('*')`` or dataset scan
shows it), or ``<name>.tmp<pid>-<8 hex>`` with ``hidden=False``.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import uuid
from collections.abc import Iterator
from typing import IO, Any

__all__ = ["atomic_open", "atomic_path", "fsync_dir", "temporary_name"]


def temporary_name(path: str | os.PathLike, *, suffix: str = "", hidden: bool = True) -> str:
    """A fresh temporary name beside ``path``: ``.<name>.tmp<pid>-<8 hex><suffix>`` (``hidden``) or
    ``<name>.tmp<pid>-<8 hex><suffix>``.

    Args:
        path: the final path.
        suffix: appended to the name (a writer that picks the format from the extension: ``.onnx``).
        hidden: start the name with a dot.
    """
    folder, name = os.path.split(os.fspath(path))
    return os.path.join(folder, f"{'.' if hidden else ''}{name}.tmp{os.getpid()}-{uuid.uuid4().hex[:8]}{suffix}")


def fsync_dir(folder: str | os.PathLike) -> None:
    """Make a rename in ``folder`` durable (a rename lives in the directory, not in the file)."""
    fd = os.open(folder, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    try:
        os.fsync(fd)
    except OSError:  # some network file systems refuse fsync on a directory; the rename itself is done
        pass
    finally:
        os.close(fd)


def _remove(path: str) -> None:
    if os.path.isdir(path) and not os.path.islink(path):
        shutil.rmtree(path, ignore_errors=True)
    elif os.path.lexists(path):
        os.remove(path)


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike, *, suffix: str = "", durable: bool = False,
                hidden: bool = True) -> Iterator[str]:
    """Yield a temporary path beside ``path`` to write (a file, or a folder); when the block ends without an
    exception the temporary is ``os.replace``d onto ``path``, otherwise it is removed and ``path`` is untouched.

    The parent folder is created. A folder replaces only a missing (or empty) ``path``: over a folder with files
    ``os.replace`` raises ``OSError`` (the caller decides whether the other folder is as good), and the temporary is
    removed. With ``durable``, the file's data is fsynced before the rename and the folder after it, so once the
    block has ended the file survives a crash or a power loss under its final name.

    Args:
        path: the final path.
        suffix: appended to the temporary name (for writers that read the format from the extension).
        durable: fsync the file (not a folder) and the rename.
        hidden: a dot name for the temporary (see :func:`temporary_name`).
    """
    folder = os.path.dirname(os.path.abspath(path))
    os.makedirs(folder, exist_ok=True)
    tmp = temporary_name(path, suffix=suffix, hidden=hidden)
    try:
        yield tmp
        if durable and os.path.isfile(tmp):
            fd = os.open(tmp, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        os.replace(tmp, path)
        if durable:
            fsync_dir(folder)
    finally:
        _remove(tmp)


@contextlib.contextmanager
def atomic_open(path: str | os.PathLike, mode: str = "w", *, durable: bool = False, hidden: bool = True,
                **open_kwargs: Any) -> Iterator[IO[Any]]:
    """``open(path, mode)`` for writing, through :func:`atomic_path`: the file appears under ``path`` complete, when
    the block ends without an exception (``durable``: flushed and fsynced first, the rename fsynced after).

    Args:
        path: the final path.
        mode: a writing mode (``w``, ``wb``, ...).
        durable: see :func:`atomic_path`.
        hidden: see :func:`temporary_name`.
        open_kwargs: passed to ``open`` (``encoding``, ``newline``).
    """
    with atomic_path(path, hidden=hidden) as tmp, open(tmp, mode, **open_kwargs) as f:
        yield f
        if durable:  # through the open handle: the data is on disk before the rename
            f.flush()
            os.fsync(f.fileno())
    if durable:
        fsync_dir(os.path.dirname(os.path.abspath(path)))
