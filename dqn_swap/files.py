"""Writing files a user keeps: never half-written under the real name, nothing left behind on failure."""

from __future__ import annotations

import os
from pathlib import Path


def write_atomically(path: str | os.PathLike[str], data: bytes, *, overwrite: bool = False) -> Path:
    """Write ``data`` to ``path`` through a temporary file beside it, then rename it into place.

    A file already at ``path`` is replaced only with ``overwrite``; if writing fails (disk full,
    permission), the temporary file is removed and the error raised.
    """
    path = Path(path)
    if path.exists() and not overwrite:
        raise FileExistsError(f"{path}: already exists (pass --force to replace it)")
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        tmp.write_bytes(data)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return path


__all__ = ["write_atomically"]
