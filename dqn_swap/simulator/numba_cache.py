"""Where Numba keeps the compiled simulator and environment kernels, on any install.

The kernels are compiled with ``cache=True``: the machine code is saved beside their source (in
``__pycache__``), else in the user's cache folder, and a later process loads it instead of compiling
(seconds).  An install that is read-only with no writable home or cache folder has neither, and
Numba then fails at the first compile with "cannot cache function ... no locator available".
:func:`ensure_cache_dir` runs before Numba is imported: where neither place can be written and
``NUMBA_CACHE_DIR`` is not set, it points Numba at a folder of the user's own under the temporary
directory.
"""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path


def _writable(folder: Path) -> bool:
    """Whether files can be made in ``folder``, or it can be made (its nearest existing parent writable)."""
    for f in (folder, *folder.parents):
        if f.exists():
            return f.is_dir() and os.access(f, os.W_OK | os.X_OK)
    return False


def ensure_cache_dir(source: str) -> str | None:
    """Set ``NUMBA_CACHE_DIR`` where Numba would find no writable cache for the kernels of ``source``
    (a module's ``__file__``); the folder set, or None where nothing needed setting."""
    if os.environ.get("NUMBA_CACHE_DIR"):
        return None
    if _writable(Path(source).resolve().parent / "__pycache__"):
        return None
    home = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    if _writable(Path(home) / "numba"):
        return None
    uid = os.getuid() if hasattr(os, "getuid") else "user"
    folder = os.path.join(tempfile.gettempdir(), f"dqn-swap-numba-{uid}")
    os.environ["NUMBA_CACHE_DIR"] = folder
    config = sys.modules.get("numba.core.config")
    if config is not None:  # Numba already imported (by another package): tell it too
        config.CACHE_DIR = folder
    return folder
