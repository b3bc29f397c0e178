"""Writing files a user keeps: never half-written under the real name, nothing left behind on failure,
never through a link someone planted.

Every file the project writes (traces, plans, checkpoints, reports, tables, plots, cache indexes)
goes through :func:`write_atomically`:

1. the bytes go to a temporary file created *exclusively* (``O_CREAT | O_EXCL``, through
   :func:`tempfile.mkstemp`) in the target's folder under an unpredictable name, so a symbolic link
   planted at a guessable temporary name is never opened, let alone followed;
2. the temporary file is flushed and given the permissions a plain ``open(path, "w")`` would give;
   (the final name's first 200 bytes in it, so that a legal 255-byte name still gets one, and the
   writer's process id, so that the next write to the name removes what a killed writer left);
3. it then takes the final name in one step: with ``overwrite`` by :func:`os.replace` (which replaces
   a link at the final name by the file, and never writes into the link's target), without it by
   :func:`os.link`, which fails if the name exists, so of two writers racing for one new output
   exactly one wins and the other is told, and nothing the first wrote is lost.

If anything fails (disk full, file-size limit, a signal), the temporary file is removed and the
error raised: the final name holds the old file or nothing, never a partial one.
"""

from __future__ import annotations

import contextlib
import errno
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path

from .stop import check as check_stop



def folder_problem(path: Path) -> OSError | None:
    """Why the folder of ``path`` cannot take a new file: it is missing, or it is a file (``-o
    p.json/x.json``); ``None`` where it is a folder."""
    folder = path.parent
    if folder.is_dir():
        return None
    if folder.exists() or folder.is_symlink():
        return NotADirectoryError(f"{path}: {folder} is a file, not a folder")
    return FileNotFoundError(f"{path}: directory {folder} does not exist")

def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def unreadable(path: str | os.PathLike[str], error: BaseException, what: str, missing: str = "") -> str | None:
    """The one line a loader says where ``path`` could not be opened as a ``what`` file (``"trace"``):
    it is missing (``missing`` follows, a hint where to find one), a folder, or not to be read by
    this user; None for any other error, which is the file's content's to explain."""
    if isinstance(error, FileNotFoundError):
        return f"{path}: no such file{missing}"
    if isinstance(error, IsADirectoryError):
        return f"{path}: is a directory, not {'an' if what[:1] in 'aeiou' else 'a'} {what} file"
    if isinstance(error, PermissionError):
        return f"{path}: permission denied"
    return None


def check_new_file(path: str | os.PathLike[str], overwrite: bool = False,
                   hint: str = "pass --force to replace it") -> Path:
    """``path`` as a :class:`~pathlib.Path` where a file may be written: not a folder, not a device, FIFO
    or socket, not an existing file or link unless ``overwrite``, in a folder that is there.  What
    :func:`write_atomically` checks first; a writer that has work to do before it writes checks it
    before that work.

    Raises:
        IsADirectoryError, FileExistsError, NotADirectoryError, FileNotFoundError: one line naming ``path``
            (``hint`` says how to replace an existing file).
    """
    path = Path(path)
    if path.is_dir() and not path.is_symlink():
        raise IsADirectoryError(f"{path}: is a directory, not a file to write")
    refuse_to_replace_special(path)
    if (path.exists() or path.is_symlink()) and not overwrite:
        raise FileExistsError(f"{path}: already exists ({hint})")
    problem = folder_problem(path)
    if problem is not None:
        raise problem
    return path


def write_atomically(path: str | os.PathLike[str], data: bytes, *, overwrite: bool = False) -> Path:
    """Write ``data`` to ``path`` through an exclusive temporary file beside it, then move it into place.

    A file (or link) already at ``path`` is replaced only with ``overwrite``; without it the write
    fails with :class:`FileExistsError`, also when another writer creates ``path`` meanwhile.  A
    command stopped by a signal whose first exception was lost writes nothing
    (:func:`dqn_swap.stop.check`).
    """
    check_stop()
    path = check_new_file(path, overwrite)
    folder = path.parent
    short = _short(path.name)
    _clean_stale(folder, short)
    try:
        fd, name = tempfile.mkstemp(prefix=f".{short}.{os.getpid()}.", suffix=".tmp", dir=folder)
    except OSError as e:  # the folder refuses new files (/proc, a read-only mount): one line naming ``path``
        error = type(e)(f"{path}: cannot be written ({e.strerror or e})")
        error.errno = e.errno
        raise error from None
    tmp = Path(name)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fchmod(f.fileno(), 0o666 & ~_umask())
        if overwrite:
            os.replace(tmp, path)
        else:
            link_new(tmp, path)
    except OSError as e:
        tmp.unlink(missing_ok=True)
        if e.errno is None or str(path) in str(e):
            raise
        error = type(e)(f"{path}: cannot be written ({e.strerror or e})")  # one line naming the file
        error.errno = e.errno
        raise error from None
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return path


#: Bytes of the final name kept in the temporary name: with the dots, the random part and ``.tmp``, the
#: temporary name stays within the 255 bytes file systems allow a name, whatever the final name's length.
TEMP_NAME_BYTES = 200


def _clean_stale(folder: Path, short: str) -> None:
    """Remove the temporary files an earlier write to this name left when its process was killed
    (``.NAME.PID.XXXXXXXX.tmp`` whose process no longer runs); a running writer's are kept, and
    nothing is followed (a link is removed as a name)."""
    for path in stale_entries(folder, f".{short}.", ".tmp"):
        try:
            os.unlink(path)
        except OSError:
            pass


def stale_entries(folder: Path, head: str, tail: str = "") -> list[Path]:
    """Entries of ``folder`` named ``HEAD PID . ... TAIL`` whose process ``PID`` no longer runs: what a
    killed run left (its temporary files, :func:`write_atomically`; a comparison's staging folder)."""
    try:
        names = [e.name for e in os.scandir(folder) if e.name.startswith(head) and e.name.endswith(tail)]
    except OSError:
        return []
    out = []
    for name in names:
        pid = name[len(head):len(name) - len(tail)].split(".")[0]
        if pid.isdigit() and not _alive(int(pid)):
            out.append(folder / name)
    return out


def _alive(pid: int) -> bool:
    """Whether process ``pid`` runs (on this machine; one of another user counts as running)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OverflowError, ValueError):
        return True
    return True


def _short(name: str) -> str:
    """``name`` cut to at most :data:`TEMP_NAME_BYTES` bytes of UTF-8 (never inside a character)."""
    return name.encode("utf-8", "surrogateescape")[:TEMP_NAME_BYTES].decode("utf-8", "ignore")


def link_new(tmp: Path, path: Path) -> None:
    """Give ``tmp`` the name ``path`` only if no file has it, atomically; then drop ``tmp``
    (``FileExistsError`` if a file or link has it)."""
    try:
        os.link(tmp, path, follow_symlinks=False)
    except FileExistsError:
        raise FileExistsError(f"{path}: already exists (pass --force to replace it)") from None
    except OSError as e:
        if e.errno not in (errno.EPERM, errno.ENOTSUP, errno.EOPNOTSUPP, errno.EXDEV, errno.EMLINK):
            raise
        # A file system without hard links: check, then rename (a narrow race, but no link is followed).
        if path.exists() or path.is_symlink():
            raise FileExistsError(f"{path}: already exists (pass --force to replace it)") from None
        os.replace(tmp, path)
        return
    tmp.unlink()


class OutputBusy(FileExistsError):
    """Another process holds :func:`output_lock` on the same output."""


@contextlib.contextmanager
def output_lock(path: str | os.PathLike[str]) -> Iterator[None]:
    """Hold an exclusive lock on the output ``path`` for a whole run (``.NAME.lock`` beside it, removed
    at the end): a second run writing the same output, a ``--resume`` of a run still going included,
    is refused at once with :class:`OutputBusy` instead of both writing it.

    The lock is :func:`fcntl.flock` on the lock file, released by the kernel when its holder dies
    (kill -9 included), so a lock file a killed run left behind locks nothing and is taken over.
    """
    import fcntl

    path = Path(path)
    lock = path.parent / f".{_short(path.name)}.lock"
    while True:
        fd = os.open(lock, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise OutputBusy(f"{path}: another run is writing it now; wait for it to end, or write "
                             "another file") from None
        try:
            same = os.path.samestat(os.fstat(fd), os.stat(lock, follow_symlinks=False))
        except FileNotFoundError:
            same = False
        if same:
            break
        os.close(fd)  # the lock file was removed by its last holder after we opened it: take the new one
    try:
        yield
    finally:
        try:
            os.unlink(lock)
        except OSError:
            pass
        os.close(fd)


def refuse_to_replace_special(path: Path) -> None:
    """``FileExistsError`` where ``path`` is neither a regular file nor a link (a device, a FIFO, a socket):
    such a thing is never replaced, ``--force`` or not."""
    if path.exists() and not path.is_file() and not path.is_symlink():
        raise FileExistsError(f"{path}: is not a regular file (a device, a FIFO or a socket); it is not replaced")


def write_text(path: str | os.PathLike[str], text: str, *, overwrite: bool = False) -> Path:
    """:func:`write_atomically` for text (UTF-8)."""
    return write_atomically(path, text.encode("utf-8"), overwrite=overwrite)


def save_figure(fig, path: str | os.PathLike[str], *, overwrite: bool = False, **savefig_kwargs) -> Path:
    """Render a Matplotlib figure in memory, then :func:`write_atomically` it (PNG unless the suffix says)."""
    import io

    buf = io.BytesIO()
    fmt = Path(path).suffix.lstrip(".").lower() or "png"
    fig.savefig(buf, format=fmt, **savefig_kwargs)
    return write_atomically(path, buf.getvalue(), overwrite=overwrite)


def not_a_regular_file(path: str | os.PathLike[str]) -> str | None:
    """Why ``path`` cannot be read as a file without blocking or reading forever (a FIFO, a socket,
    a device), or ``None`` for a regular file, a folder or a missing path (their loaders say those)."""
    import stat

    try:
        mode = os.stat(path).st_mode
    except OSError:
        return None
    if stat.S_ISREG(mode) or stat.S_ISDIR(mode):
        return None
    kind = ("a FIFO (named pipe)" if stat.S_ISFIFO(mode) else "a socket" if stat.S_ISSOCK(mode)
            else "a device" if stat.S_ISCHR(mode) or stat.S_ISBLK(mode) else "not a regular file")
    return f"{path}: is {kind}, not a regular file"


def is_plain_name(name: object) -> bool:
    """Whether ``name`` names a file or folder *inside* a folder: a non-empty string with no
    separator, not ``.`` or ``..`` (a name read from a file or an option that is joined to a folder)."""
    return isinstance(name, str) and name not in ("", ".", "..") and Path(name).name == name


def kind_of_file(path: str | os.PathLike[str]) -> str | None:
    """Which of dqn-swap's files ``path`` looks like, read from its first bytes and, for a zip, its
    names: ``"trace"`` (an .npz with ``meta.npy``), ``"agent"`` (torch's zip, ``*/data.pkl``),
    ``"plan"`` (JSON naming the plan format), or ``None``.  A loader that fails names what the file
    is instead (``p.json: a plan file (dqn-swap plan), not a trace file``): the commonest slip is
    one file given where another is meant."""
    import zipfile

    try:
        with open(path, "rb") as f:
            head = f.read(4096)
        if head.startswith(b"PK\x03\x04"):
            with zipfile.ZipFile(path) as z:
                names = z.namelist()
            if "meta.npy" in names:
                return "trace"
            return "agent" if any(n.endswith("/data.pkl") for n in names) else None
        return "plan" if head.lstrip().startswith(b"{") and b'"dqn-swap-plan"' in head else None
    except Exception:  # noqa: BLE001: a guess for an error line; a damaged archive fails in many ways
        return None


#: How the error lines name each kind of file.
FILE_KINDS = {"trace": "a trace file (dqn-swap record)", "agent": "an agent file (dqn-swap train)",
              "plan": "a plan file (dqn-swap plan)"}


def other_kind(path: str | os.PathLike[str], expected: str) -> str | None:
    """``"PATH: a plan file (dqn-swap plan), not a trace file"`` when ``path`` is one of dqn-swap's
    files of another kind than ``expected`` (a key of :data:`FILE_KINDS`); else ``None``."""
    kind = kind_of_file(path)
    if kind is None or kind == expected:
        return None
    return f"{path}: {FILE_KINDS[kind]}, not {FILE_KINDS[expected].split(' (')[0]}"


__all__ = ["FILE_KINDS", "OutputBusy", "check_new_file", "folder_problem", "is_plain_name", "kind_of_file",
           "link_new", "not_a_regular_file", "other_kind", "output_lock", "refuse_to_replace_special", "save_figure",
           "write_atomically", "write_text"]
