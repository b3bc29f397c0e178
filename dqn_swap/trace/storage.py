"""Reading and writing trace files (``.trace``: a NumPy ``.npz`` archive loaded without pickle; the
format is in :mod:`dqn_swap.trace`): :class:`TraceFile`, the part of :class:`~dqn_swap.trace.Trace`
that knows the file."""

from __future__ import annotations

import io
import json
import os
from pathlib import Path
from typing import Any

import numpy as np

from ..files import check_new_file, not_a_regular_file, other_kind, unreadable, write_atomically
from .schema import _ARRAYS, _OPTIONAL, FORMAT, READ_VERSIONS, VERSION, TraceError


class TraceFile:
    """Saving and loading, mixed into :class:`~dqn_swap.trace.Trace` (whose columns it writes)."""

    op_names: list[str]
    module_names: list[str]
    meta: dict[str, Any]

    def save(self, path: str | os.PathLike[str], *, overwrite: bool = False) -> Path:
        """Write the trace; refuses to replace an existing file unless ``overwrite``."""
        path = check_new_file(path, overwrite, hint="pass overwrite=True / --force to replace it")
        meta = {"format": FORMAT, "version": VERSION, "op_names": self.op_names,
                "module_names": self.module_names, **self.meta}
        meta_bytes = np.frombuffer(json.dumps(meta).encode("utf-8"), dtype=np.uint8)
        buf = io.BytesIO()
        np.savez_compressed(buf, meta=meta_bytes, **{n: getattr(self, n) for n in (*_ARRAYS, *_OPTIONAL)})
        return write_atomically(path, buf.getvalue(), overwrite=overwrite)

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> Any:
        """Read a trace file.

        Raises:
            TraceError: the file is missing, not a trace, damaged or of another format version; the
                message is one line.
        """
        from ..checks import expect_path

        path = Path(expect_path(path, "path"))
        special = not_a_regular_file(path)
        if special:
            raise TraceError(special)
        try:
            with open(path, "rb") as f:
                magic = f.read(4)
            if magic != b"PK\x03\x04":  # every .npz is a zip archive
                raise TraceError(other_kind(path, "trace") or f"{path}: not a dqn-swap trace file"
                                 + (" (empty file)" if not magic else ""))
            with np.load(path, allow_pickle=False) as z:
                if "meta" not in z.files:
                    raise TraceError(other_kind(path, "trace") or f"{path}: not a dqn-swap trace (no metadata)")
                meta = json.loads(bytes(z["meta"]).decode("utf-8"))
                if not isinstance(meta, dict) or meta.get("format") != FORMAT:
                    raise TraceError(f"{path}: not a dqn-swap trace")
                if meta.get("version") not in READ_VERSIONS:
                    raise TraceError(f"{path}: trace format version {meta.get('version')} is not supported "
                                     f"(this dqn-swap reads versions {', '.join(map(str, READ_VERSIONS))})")
                missing = [n for n in _ARRAYS if n not in z.files]
                if missing:
                    raise TraceError(f"{path}: corrupt trace, missing arrays {', '.join(missing)}")
                arrays = {n: z[n] for n in _ARRAYS}
                arrays.update({n: z[n] for n in _OPTIONAL if n in z.files})
                for name, array in arrays.items():
                    dtype = _ARRAYS[name] if name in _ARRAYS else _OPTIONAL[name][0]
                    if array.ndim != 1 or array.dtype.kind != dtype.kind:
                        raise TraceError(f"{path}: corrupt trace, column {name} is not a 1-d {dtype} array")
                    if dtype.kind == "i" and array.size and array.dtype.itemsize > dtype.itemsize:
                        info = np.iinfo(dtype)  # check before the cast, which would wrap silently
                        if array.min() < info.min or array.max() > info.max:
                            raise TraceError(f"{path}: corrupt trace, column {name} holds {int(array.max())} "
                                             f"or {int(array.min())}, outside {dtype}")
        except TraceError:
            raise
        except OSError as e:
            line = unreadable(path, e, "trace")
            if line is None:
                first = str(e).strip().splitlines()[0][:160] if str(e).strip() else ""
                line = f"{path}: corrupt or truncated trace file ({type(e).__name__}: {first})"
            raise TraceError(line) from None
        except MemoryError as e:  # an .npy header that claims more rows than the machine can hold
            raise TraceError(f"{path}: corrupt trace file, or one too large for this machine: an array in it "
                             f"needs more memory than there is ({str(e)[:120]})") from None
        except Exception as e:  # noqa: BLE001
            # A damaged archive fails in many ways below zipfile and numpy (BadZipFile, zlib.error,
            # an .npy header numpy cannot parse, a compression method or flag zipfile refuses, ...):
            # any failure to decode the file is the file's, and gets one line.
            first = str(e).strip().splitlines()[0][:160] if str(e).strip() else ""
            raise TraceError(f"{path}: corrupt or truncated trace file ({type(e).__name__}: {first})") from None
        op_names = meta.pop("op_names", [])
        module_names = meta.pop("module_names", [])
        meta.pop("format"), meta.pop("version")
        trace = cls(**arrays, op_names=op_names, module_names=module_names, meta=meta)
        trace.validate(str(path))
        return trace
