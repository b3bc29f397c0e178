"""Every file the project writes goes through ``dqn_swap.files.write_atomically``: these tests plant
links, fill the disk and race two writers, and check that nothing is followed, lost or left behind."""

from __future__ import annotations

import os
import resource
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from dqn_swap.files import save_figure, write_atomically, write_text


def test_a_link_at_the_old_predictable_temporary_name_is_never_opened(tmp_path: Path) -> None:
    victim = tmp_path / "victim.txt"
    victim.write_text("someone else's file")
    (tmp_path / f".p.json.{os.getpid()}.tmp").symlink_to(victim)
    write_atomically(tmp_path / "p.json", b"plan")
    assert victim.read_text() == "someone else's file"
    assert (tmp_path / "p.json").read_bytes() == b"plan"


def test_a_link_at_the_final_name_is_refused_or_replaced_never_followed(tmp_path: Path) -> None:
    victim = tmp_path / "victim.txt"
    victim.write_text("someone else's file")
    link = tmp_path / "out.json"
    link.symlink_to(victim)
    with pytest.raises(FileExistsError, match="out.json: already exists"):
        write_atomically(link, b"new")
    write_atomically(link, b"new", overwrite=True)
    assert victim.read_text() == "someone else's file"
    assert not link.is_symlink() and link.read_bytes() == b"new"
    dangling = tmp_path / "dangling.json"
    dangling.symlink_to(tmp_path / "nowhere" / "x")
    with pytest.raises(FileExistsError):
        write_atomically(dangling, b"new")
    assert not (tmp_path / "nowhere").exists()


def test_temporary_names_are_unpredictable_and_created_exclusively(tmp_path: Path, monkeypatch) -> None:
    import tempfile

    seen: list[str] = []
    real = tempfile.mkstemp

    def spy(*args, **kwargs):
        fd, name = real(*args, **kwargs)
        seen.append(name)
        return fd, name

    monkeypatch.setattr(tempfile, "mkstemp", spy)
    write_atomically(tmp_path / "a", b"1")
    write_atomically(tmp_path / "a", b"2", overwrite=True)
    assert len(seen) == 2 and seen[0] != seen[1]
    # the writer's pid (for the next write to clean what a killed writer left), then a random part
    import re

    assert all(re.fullmatch(rf"\.a\.{os.getpid()}\.[A-Za-z0-9_]{{8}}\.tmp", Path(n).name) for n in seen), seen
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a"]


def test_permissions_are_those_of_a_plain_write(tmp_path: Path) -> None:
    plain = tmp_path / "plain"
    plain.write_bytes(b"x")
    ours = write_atomically(tmp_path / "ours", b"x")
    assert (ours.stat().st_mode & 0o777) == (plain.stat().st_mode & 0o777)


def test_two_writers_of_one_new_output_one_wins_nothing_is_lost(tmp_path: Path) -> None:
    target = tmp_path / "plan.json"
    barrier = threading.Barrier(8)
    outcomes: list[str] = []

    def writer(i: int) -> None:
        barrier.wait()
        try:
            write_atomically(target, f"writer {i}".encode())
            outcomes.append(f"won {i}")
        except FileExistsError:
            outcomes.append("refused")

    threads = [threading.Thread(target=writer, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    winners = [o for o in outcomes if o.startswith("won")]
    assert len(winners) == 1 and outcomes.count("refused") == 7
    assert target.read_text() == f"writer {winners[0].split()[1]}"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["plan.json"]


_FSIZE_CHILD = """
import resource, sys
from pathlib import Path
from dqn_swap.files import write_atomically
resource.setrlimit(resource.RLIMIT_FSIZE, (4096, 4096))
folder = Path(sys.argv[1])
for name, overwrite in (("keep.trace", True), ("new.json", False)):
    try:
        write_atomically(folder / name, b"x" * 100_000, overwrite=overwrite)
    except OSError as e:
        print(name, e.errno)
"""


@pytest.mark.subprocess
@pytest.mark.skipif(not hasattr(resource, "RLIMIT_FSIZE"), reason="no file-size limit here")
def test_a_full_disk_leaves_the_old_file_and_nothing_else(tmp_path: Path) -> None:
    """A file-size limit (what a full disk looks like to a writer) stops the write midway: the
    error comes through, the real name keeps the user's file, and no temporary file is left."""
    (tmp_path / "keep.trace").write_bytes(b"the user's file")
    env = dict(os.environ)
    out = subprocess.run([sys.executable, "-c", _FSIZE_CHILD, str(tmp_path)], capture_output=True, text=True,
                         env=env, timeout=120, preexec_fn=lambda: __import__("signal").signal(
                             __import__("signal").SIGXFSZ, __import__("signal").SIG_IGN))
    assert out.stdout.split() == ["keep.trace", "27", "new.json", "27"], out.stdout + out.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["keep.trace"]
    assert (tmp_path / "keep.trace").read_bytes() == b"the user's file"


def test_text_and_figures_go_through_the_same_door(tmp_path: Path) -> None:
    victim = tmp_path / "victim.png"
    victim.write_bytes(b"keep")
    (tmp_path / "plot.png").symlink_to(victim)
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots()
    ax.plot([0, 1], [1, 0])
    save_figure(fig, tmp_path / "plot.png", overwrite=True)
    plt.close(fig)
    assert victim.read_bytes() == b"keep"
    assert (tmp_path / "plot.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    write_text(tmp_path / "t.md", "é\n")
    assert (tmp_path / "t.md").read_bytes() == "é\n".encode()


def test_the_command_line_never_writes_through_a_planted_link(tmp_path: Path, capsys, monkeypatch) -> None:
    """``plan -o`` and ``record -o`` with a link planted at the output: refused without --force; with
    --force the link itself is replaced and the file it pointed to is untouched."""
    from dqn_swap.cli import main

    monkeypatch.chdir(tmp_path)
    victim = tmp_path / "victim"
    victim.write_text("someone else's file")
    Path("t.trace").symlink_to(victim)
    assert main(["record", "--model", "mlp_tiny", "--batch-size", "2", "--device", "meta", "-o", "t.trace"]) != 0
    assert "t.trace: already exists" in capsys.readouterr().err
    assert main(["record", "--model", "mlp_tiny", "--batch-size", "2", "--device", "meta", "-o", "t.trace",
                 "--force"]) == 0
    assert victim.read_text() == "someone else's file" and not Path("t.trace").is_symlink()
    Path("p.json").symlink_to(victim)
    assert main(["plan", "t.trace", "-m", "60%", "--planner", "lru", "-o", "p.json"]) != 0
    assert main(["plan", "t.trace", "-m", "60%", "--planner", "lru", "-o", "p.json", "--force"]) == 0
    assert victim.read_text() == "someone else's file" and not Path("p.json").is_symlink()
    capsys.readouterr()
    # a plot at a link pointing nowhere (it would be created through a followed link): refused too
    Path("m.png").symlink_to(tmp_path / "elsewhere.png")
    assert main(["inspect", "t.trace", "--plot", "m.png"]) == 2
    assert "m.png: is a link" in capsys.readouterr().err and not (tmp_path / "elsewhere.png").exists()
    assert main(["inspect", "t.trace", "--plot", "m.png", "--force"]) == 0
    assert Path("m.png").read_bytes()[:4] == b"\x89PNG" and not (tmp_path / "elsewhere.png").exists()
    assert main(["inspect", "t.trace", "--plot", "m.jpg"]) == 2
    assert "m.jpg: plots are written as PNG" in capsys.readouterr().err


@pytest.mark.skipif(not Path("/proc/self").exists(), reason="needs Linux's /proc")
def test_a_folder_that_refuses_new_files_gives_one_line_naming_the_output() -> None:
    """The temporary file beside the output cannot be made (/proc takes no new files): the error names
    the output, not the temporary file's name."""
    with pytest.raises(OSError, match=r"^/proc/x\.png: cannot be written") as info:
        write_text(Path("/proc/x.png"), "x")
    assert ".tmp" not in str(info.value)


def test_a_legal_long_name_gets_a_temporary_name_within_the_limit(tmp_path: Path) -> None:
    name = "p" * 250 + ".json"  # 255 bytes: legal, while ".NAME.XXXXXXXX.tmp" beside it would not be
    write_text(tmp_path / name, "x")
    assert (tmp_path / name).read_text() == "x" and [p.name for p in tmp_path.iterdir()] == [name]
    wide = "é" * 127  # 254 bytes of two-byte characters: the temporary name is never cut inside one
    write_text(tmp_path / wide, "y", overwrite=True)
    assert (tmp_path / wide).read_text() == "y"


@pytest.mark.skipif(not Path("/dev/null").exists(), reason="needs a device node")
def test_what_is_not_a_regular_file_is_never_replaced(tmp_path: Path, capsys, monkeypatch) -> None:
    """--force replaces a file or a link, never a device, a FIFO or a socket."""
    from dqn_swap.cli import main

    fifo = tmp_path / "f.json"
    os.mkfifo(fifo)
    with pytest.raises(FileExistsError, match="is not a regular file"):
        write_text(fifo, "x", overwrite=True)
    assert fifo.is_fifo()
    monkeypatch.chdir(tmp_path)
    assert main(["record", "--model", "mlp_tiny", "--batch-size", "2", "-o", "t.trace"]) == 0
    capsys.readouterr()
    for target in ("/dev/null", str(fifo)):
        assert main(["plan", "t.trace", "-m", "60%", "--planner", "lru", "-o", target, "--force"]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "is not a regular file" in err, err
    assert Path("/dev/null").is_char_device() and fifo.is_fifo()


def test_an_output_ending_in_a_separator_is_a_folder_and_refused(tmp_path: Path, capsys, monkeypatch) -> None:
    from dqn_swap.cli import main

    monkeypatch.chdir(tmp_path)
    assert main(["record", "--model", "mlp_tiny", "--batch-size", "2", "-o", "t.trace"]) == 0
    capsys.readouterr()
    for args in (["plan", "t.trace", "-m", "60%", "--planner", "lru", "-o", "newdir/"],
                 ["record", "--model", "mlp_tiny", "--batch-size", "2", "-o", "newdir/"],
                 ["train", "t.trace", "-m", "60%", "--steps", "10", "-o", "newdir/"]):
        assert main(args) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "newdir/: ends with a separator, so it names a folder" in err, err
        assert not Path("newdir").exists()


def test_a_name_with_a_line_break_stays_on_the_one_error_line(tmp_path: Path, capsys, monkeypatch) -> None:
    from dqn_swap.cli import main

    monkeypatch.chdir(tmp_path)
    assert main(["inspect", "no\nsuch.trace"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "no\\nsuch.trace" in err, err


@pytest.mark.subprocess
def test_a_closed_standard_output_is_one_line_and_a_failure(tmp_path: Path) -> None:
    """Started with standard output closed (`>&-`), a command says so instead of a traceback."""
    from tests.conftest import record_mlp

    record_mlp().save(tmp_path / "m.trace")
    for args in (["simulate", "m.trace", "-m", "60%", "--planner", "lru", "--json"], ["inspect", "m.trace", "--json"],
                 ["inspect", "m.trace", "--no-plot"]):
        p = subprocess.run(["sh", "-c", f'exec "$0" -m dqn_swap {" ".join(args)} >&-', sys.executable],
                           cwd=tmp_path, capture_output=True, text=True, timeout=120)
        assert p.returncode == 2 and p.stderr.count("\n") == 1, (args, p.stderr)
        assert "standard output is closed" in p.stderr


def test_of_two_compare_runs_into_one_folder_the_second_to_finish_is_refused(tmp_path: Path, capsys,
                                                                              monkeypatch) -> None:
    """Another run writes the comparison while this one plans: this one refuses, and what the other
    wrote is kept whole (its table, its CSV and its plots)."""
    from dqn_swap.cli import compare_cmd, main

    monkeypatch.chdir(tmp_path)
    assert main(["record", "--model", "mlp_tiny", "--batch-size", "2", "-o", "t.trace"]) == 0
    args = ["compare", "t.trace", "--memory-limits", "60%", "--planners", "lru,greedy", "-o", "cmp"]
    real = compare_cmd.plot_comparison

    def meanwhile(*a, **k):  # the other run finishes while this one draws its plots, after every check
        plots = real(*a, **k)
        monkeypatch.setattr(compare_cmd, "plot_comparison", real)
        assert main(args) == 0
        return plots

    monkeypatch.setattr(compare_cmd, "plot_comparison", meanwhile)
    capsys.readouterr()
    code = main(args)
    err = capsys.readouterr().err
    assert code == 2 and "compare.md: already exists (another run wrote it meanwhile" in err, err
    theirs = {p.name: p.read_bytes() for p in (tmp_path / "cmp").iterdir()}
    assert {"compare.md", "compare.csv", "overhead.png"} <= set(theirs) and not any(
        n.startswith(".compare.") for n in theirs)


@pytest.mark.subprocess
def test_temporary_files_a_killed_writer_left_are_removed_at_the_next_write(tmp_path: Path) -> None:
    """A writer killed between creating its temporary file and renaming it leaves ``.NAME.PID.*.tmp``;
    the next write to that name removes it, but never a running writer's."""
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True,
                          text=True, check=True)
    dead = int(gone.stdout)  # a process that has ended
    stale = tmp_path / f".plan.json.{dead}.abcd1234.tmp"
    running = tmp_path / f".plan.json.{os.getpid()}.efgh5678.tmp"
    other = tmp_path / f".other.json.{dead}.abcd1234.tmp"
    for p in (stale, running, other):
        p.write_text("half")
    write_text(tmp_path / "plan.json", "{}")
    assert not stale.exists() and running.exists() and other.exists()
    assert (tmp_path / "plan.json").read_text() == "{}"


KILL_AT = {  # where the writer dies: (what is patched, whether the real call runs before the kill)
    "before writing the temporary file": ("os.fdopen", False),
    "before moving it into place": ("move", False),
    "right after moving it into place": ("move", True),
}
KILLED_WRITER = r"""
import os, signal, sys
import dqn_swap.files as files
where, after, overwrite = sys.argv[1], sys.argv[2] == "1", sys.argv[3] == "1"
def killing(real):
    def call(*a, **k):
        if after:
            real(*a, **k)
        os.kill(os.getpid(), signal.SIGKILL)
    return call
if where == "os.fdopen":
    files.os.fdopen = killing(os.fdopen)
elif overwrite:
    files.os.replace = killing(os.replace)
else:
    files.link_new = killing(files.link_new)
files.write_atomically("out.json", b"new contents", overwrite=overwrite)
"""


@pytest.mark.subprocess
@pytest.mark.parametrize("overwrite", [False, True], ids=["new file", "replacing one"])
@pytest.mark.parametrize("point", list(KILL_AT))
def test_kill_9_at_every_point_of_a_write_leaves_the_old_file_or_the_new_one_whole(tmp_path: Path, point: str,
                                                                                  overwrite: bool) -> None:
    """SIGKILL at each point of ``write_atomically``: the name holds the old contents (or nothing)
    or the new ones whole, never a part; the next write to the name works and leaves no temporary
    file behind."""
    if overwrite:
        (tmp_path / "out.json").write_bytes(b"old contents")
    patched, after = KILL_AT[point]
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    p = subprocess.run([sys.executable, "-c", KILLED_WRITER, patched, "1" if after else "0", "1" if overwrite else "0"],
                       cwd=tmp_path, env=env, capture_output=True, timeout=60)
    assert p.returncode == -9, p.stderr
    target = tmp_path / "out.json"
    now = target.read_bytes() if target.exists() else None
    allowed = {b"new contents"} if after else ({b"old contents"} if overwrite else {None})
    assert now in allowed, (point, now)
    from dqn_swap.files import write_atomically

    write_atomically(target, b"next", overwrite=True)
    assert target.read_bytes() == b"next"
    assert sorted(x.name for x in tmp_path.iterdir()) == ["out.json"]  # the killed writer's temporary file is gone


def test_a_killed_comparison_leaves_its_staging_folder_to_the_next_run(tmp_path: Path) -> None:
    """kill -9 while ``compare`` puts its outputs in place: what it had linked stays, its staging
    folder is removed by the next run into the folder, and that run writes its outputs whole."""
    from dqn_swap.cli import compare_cmd

    stale = tmp_path / f".compare.{2**22 + 12345}.abcdefgh"  # a pid no process has
    stale.mkdir()
    (stale / "compare.md").write_text("half")
    mine = tmp_path / f".compare.{os.getpid()}.running"  # a running writer's: kept
    mine.mkdir()
    compare_cmd._clean_stale_stages(tmp_path)
    assert not stale.exists() and mine.exists()
