"""Files written atomically: whatever jaxarm saves (arm files, URDF, MJCF, logs, results, figures)
is complete or not there at all; an existing file is never left half-written."""

from __future__ import annotations

import os
import stat
import tempfile
from pathlib import Path


def write_text_atomic(path, text: str) -> Path:
    """Write ``text`` (UTF-8, ``\\n`` line ends) to ``path`` atomically (:func:`write_atomic`)."""
    return write_atomic(path, lambda handle: handle.write(text.encode("utf-8")))


def write_atomic(path, writer) -> Path:
    """Write a file atomically: ``writer(handle)`` fills a binary temporary file in the same
    directory, which is flushed, fsync'ed and then moved over ``path`` with ``os.replace``; on any
    error the temporary file is removed and an existing file at ``path`` is left untouched. The old
    file's permissions (or those the umask gives a new file) are kept. For figures:
    ``write_atomic(path, lambda f: fig.savefig(f, format="png"))``."""
    path = Path(path)
    folder = path.parent if str(path.parent) else Path(".")
    fd, tmp = tempfile.mkstemp(dir=folder, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as handle:
            writer(handle)
            handle.flush()
            os.fsync(handle.fileno())
        os.chmod(tmp, _file_mode(path))  # mkstemp makes 0600; keep the old file's mode or the umask's
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise
    _fsync_dir(folder)
    return path


def _file_mode(path: Path) -> int:
    try:
        return stat.S_IMODE(os.stat(path).st_mode)
    except OSError:
        mask = os.umask(0)
        os.umask(mask)
        return 0o666 & ~mask


def _fsync_dir(folder: Path) -> None:
    """Make the rename durable where the platform allows it (POSIX); best effort."""
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:  # pragma: no cover - e.g. Windows
        return
    try:
        os.fsync(fd)
    except OSError:  # pragma: no cover
        pass
    finally:
        os.close(fd)

