"""Trace file format: round trips and every kind of bad file."""

import io
import json
import zipfile

import numpy as np
import pytest

from dqn_swap.trace import Phase, Role, Trace, TraceBuilder, TraceError, parse_bytes


def small_trace() -> Trace:
    b = TraceBuilder()
    w = b.tensor(64, Role.PARAMETER, preexisting=True)
    x = b.tensor(32, Role.INPUT, preexisting=True)
    y = b.tensor(16, Role.SAVED)
    b.op("mm", Phase.FORWARD, reads=[x, w], outputs=[y], duration=1.0, module="fc")
    b.mark_saved(y)
    z = b.tensor(8)
    b.op("relu", Phase.FORWARD, reads=[y], outputs=[z], duration=2.0)
    b.op("relu_backward", Phase.BACKWARD, reads=[z, y], duration=0.5, frees=[y, z])
    return b.build({"model": "hand"})


def test_memory_and_times_by_hand():
    t = small_trace()
    assert t.initial_bytes == 96
    assert t.memory_after_event.tolist() == [112, 112, 112, 112, 120, 120, 120, 120, 120, 104, 96]
    assert t.op_memory.tolist() == [112, 120, 120]
    assert t.peak_bytes == 120 and t.peak_op == 1
    assert t.op_start.tolist() == [0.0, 1.0, 3.0]
    assert t.event_time[[0, 3, 4, 6]].tolist() == [0.0, 1.0, 1.0, 3.0]
    assert t.compute_time == 3.5
    assert t.minimum_memory == 96 + 24  # relu: input and output beside the persistent state
    assert t.saved.tolist() == [2] and t.tensor_saved_index.tolist() == [-1, -1, 0, -1]


def test_round_trip(tmp_path):
    t = small_trace()
    path = t.save(tmp_path / "a.trace")
    u = Trace.load(path)
    assert u.fingerprint == t.fingerprint
    assert u.meta == t.meta and u.op_names == t.op_names and u.module_names == t.module_names
    for name in ("event_kind", "event_op", "tensor_nbytes", "op_duration", "saved"):
        assert np.array_equal(getattr(u, name), getattr(t, name))


def test_never_overwrites(tmp_path):
    t = small_trace()
    t.save(tmp_path / "a.trace")
    with pytest.raises(FileExistsError):
        t.save(tmp_path / "a.trace")
    t.save(tmp_path / "a.trace", overwrite=True)


def rewrite(tmp_path, t: Trace, mutate) -> str:
    path = t.save(tmp_path / "src.trace")
    with np.load(path, allow_pickle=False) as z:
        arrays = {k: z[k] for k in z.files}
    mutate(arrays)
    out = tmp_path / "bad.trace"
    with open(out, "wb") as f:
        np.savez(f, **arrays)
    return str(out)


def set_meta(arrays, **changes):
    meta = json.loads(bytes(arrays["meta"]).decode())
    meta.update(changes)
    arrays["meta"] = np.frombuffer(json.dumps(meta).encode(), dtype=np.uint8)


@pytest.mark.parametrize("mutate,message", [
    (lambda a: set_meta(a, version=99), "version 99 is not supported"),
    (lambda a: set_meta(a, format="other"), "not a dqn-swap trace"),
    (lambda a: a.pop("event_op"), "missing arrays event_op"),
    (lambda a: a.update(event_tensor=a["event_tensor"] + 100), "tensor out of range"),
    (lambda a: a.update(op_duration=a["op_duration"][:1]), "op_duration has 1 rows"),
    (lambda a: a.pop("meta"), "no metadata"),
])
def test_bad_files_give_one_line(tmp_path, mutate, message):
    path = rewrite(tmp_path, small_trace(), mutate)
    with pytest.raises(TraceError, match=message) as e:
        Trace.load(path)
    assert "\n" not in str(e.value) and path in str(e.value)


def test_truncated_empty_missing_and_pickled(tmp_path):
    path = small_trace().save(tmp_path / "a.trace")
    data = path.read_bytes()
    (tmp_path / "cut.trace").write_bytes(data[: len(data) // 2])
    (tmp_path / "empty.trace").write_bytes(b"")
    buf = io.BytesIO()
    np.save(buf, np.array([object()], dtype=object), allow_pickle=True)
    with zipfile.ZipFile(tmp_path / "pickle.trace", "w") as z:
        z.writestr("meta.npy", buf.getvalue())
    for name, message in [("cut", "corrupt or truncated"), ("empty", "empty file"),
                          ("missing", "no such file"), ("pickle", "corrupt")]:
        with pytest.raises(TraceError, match=message):
            Trace.load(tmp_path / f"{name}.trace")


def test_parse_bytes():
    assert parse_bytes("8GiB") == 8 * 2**30
    assert parse_bytes("512 MB") == 512_000_000
    assert parse_bytes("1e9") == 10**9
    for bad in ("8 parsecs", "lots", "-1GB"):
        with pytest.raises(ValueError):
            parse_bytes(bad)


def test_memory_limits():
    from dqn_swap.trace import resolve_memory_limit

    t = small_trace()  # minimum 120, peak 120: every limit resolves to 120
    assert resolve_memory_limit(t, "50%") == 120
    assert resolve_memory_limit(t, "1KiB") == 1024
    with pytest.raises(ValueError, match="below the minimum.*120 bytes"):
        resolve_memory_limit(t, "100B")
    with pytest.raises(ValueError, match="between 0%"):
        resolve_memory_limit(t, "150%")
