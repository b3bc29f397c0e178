"""Trace file format: round trips and every kind of bad file."""

import io
import json
import zipfile

import numpy as np
import pytest

from dqn_swap.trace import Phase, Role, Trace, TraceBuilder, TraceError
from dqn_swap.units import parse_bytes


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
    with pytest.raises(ValueError, match="below the minimum.*120 bytes") as refused:
        resolve_memory_limit(t, "100B")
    assert t.op_label(t.minimum_memory_op) in str(refused.value)  # names the op that needs it
    assert t.minimum_memory_per_op[t.minimum_memory_op] == t.minimum_memory
    with pytest.raises(ValueError, match="between 0%"):
        resolve_memory_limit(t, "150%")


# --------------------------------------------------------------------------- version 2
def scratch_trace() -> Trace:
    b = TraceBuilder()
    w = b.tensor(64, Role.PARAMETER, preexisting=True)
    x = b.tensor(32, Role.INPUT, preexisting=True)
    y = b.tensor(16, Role.SAVED)
    b.module_call_op.append(0)
    b.op("conv", Phase.FORWARD, reads=[x, w], outputs=[y], duration=1.0, scratch=40)
    b.mark_saved(y)
    z = b.tensor(8)
    b.op("relu", Phase.FORWARD, reads=[y], outputs=[z], duration=1.0)
    b.op("conv_backward", Phase.BACKWARD, reads=[z, y], duration=1.0, frees=[y, z], scratch=100)
    return b.build()


def test_scratch_counts_while_its_op_runs():
    t = scratch_trace()
    # conv: 96 + 16 outputs + 40 scratch; relu: 96 + 24; conv_backward: 96 + 24 + 100
    assert t.op_memory.tolist() == [152, 120, 220]
    assert t.peak_bytes == 220 and t.peak_op == 2
    assert t.minimum_memory == 220  # scratch and working sets cannot move
    assert t.saved_op.tolist() == [1] and t.module_call_op.tolist() == [0]


def test_version_2_round_trip_keeps_scratch_and_anchors(tmp_path):
    t = scratch_trace()
    u = Trace.load(t.save(tmp_path / "a.trace"))
    assert u.fingerprint == t.fingerprint
    assert u.op_scratch.tolist() == [40, 0, 100] and u.saved_op.tolist() == [1] and u.module_call_op.tolist() == [0]
    no_scratch = t.replace(op_scratch=np.zeros(3, dtype=np.int64))
    assert no_scratch.fingerprint != t.fingerprint  # scratch is part of what a plan is made for


def test_a_version_1_file_reads_with_no_scratch_and_its_fingerprint(tmp_path):
    """Files written before version 2 lack the optional columns; they load, plan alike, and keep
    the fingerprint their plans and checkpoints name."""
    t = small_trace().replace(saved_op=np.full(1, -1, dtype=np.int32), module_call_op=np.zeros(0, np.int32))
    path = t.save(tmp_path / "v2.trace")
    with np.load(path, allow_pickle=False) as z:
        arrays = {k: z[k] for k in z.files if k not in ("op_scratch", "saved_op", "module_call_op")}
    meta = json.loads(bytes(arrays["meta"]).decode())
    meta["version"] = 1
    arrays["meta"] = np.frombuffer(json.dumps(meta).encode(), dtype=np.uint8)
    old = tmp_path / "v1.trace"
    with open(old, "wb") as f:
        np.savez_compressed(f, **arrays)
    u = Trace.load(old)
    assert u.op_scratch.tolist() == [0, 0, 0] and u.saved_op.tolist() == [-1] and len(u.module_call_op) == 0
    assert u.fingerprint == t.fingerprint
    assert np.array_equal(u.op_memory, small_trace().op_memory)


@pytest.mark.parametrize("column,value,message", [
    ("op_scratch", np.array([-1, 0, 0], dtype=np.int64), "negative scratch"),
    ("op_scratch", np.array([0, 0], dtype=np.int64), "column op_scratch has 2 rows"),
    ("saved_op", np.array([5], dtype=np.int32), "anchors"),
    ("module_call_op", np.array([2, 1], dtype=np.int32), "anchors"),
    ("saved_unpack_op", np.array([7], dtype=np.int32), "saved_unpack_op refers to an op out of range"),
    ("saved_unpack_op", np.array([1, 2], dtype=np.int32), "column saved_unpack_op has 2 rows"),
    ("saved_in_op", np.array([2], dtype=np.int8), "saved_in_op holds a value"),
])
def test_bad_version_2_columns_give_one_line(tmp_path, column, value, message):
    path = scratch_trace().save(tmp_path / "src.trace")
    with np.load(path, allow_pickle=False) as z:
        arrays = {k: z[k] for k in z.files}
    arrays[column] = value
    bad = tmp_path / "bad.trace"
    with open(bad, "wb") as f:
        np.savez_compressed(f, **arrays)
    with pytest.raises(TraceError, match=message) as info:
        Trace.load(bad)
    assert "\n" not in str(info.value)


def test_action_window_is_last_forward_use_to_next_use():
    b = TraceBuilder()
    x = b.tensor(4, Role.INPUT, preexisting=True)
    a = b.tensor(8, Role.SAVED)
    c = b.tensor(8, Role.SAVED)
    b.op("f0", Phase.FORWARD, reads=[x], outputs=[a])
    b.op("f1", Phase.FORWARD, reads=[a], outputs=[c])
    b.op("f2", Phase.FORWARD, reads=[a, c])  # a's last forward use
    b.op("b3", Phase.BACKWARD, reads=[c])
    b.op("b4", Phase.BACKWARD, reads=[a], frees=[a, c])
    t = b.build()
    action, ret = t.action_window
    assert (action[a], ret[a]) == (2, 4) and (action[c], ret[c]) == (2, 3)
    assert action[x] == ret[x] == -1  # an input: no plan moves it
    # a could leave between f0 and f2 only if forward code let go of it; it cannot: no saving there.
    assert t.minimum_memory == int(t.op_memory[2])


def _input_trace(module_call_before_f1: bool, *, second_use: bool = False):
    """x (input, 40 B) saved by f0 (packed before f0's kernel); f1 is the next op."""
    b = TraceBuilder()
    x = b.tensor(40, Role.INPUT, preexisting=True)
    a = b.tensor(8, Role.SAVED)
    c = b.tensor(8, Role.SAVED)
    b.mark_module_call()
    b.mark_saved(x)  # autograd packs f0's input before f0 runs
    b.op("f0", Phase.FORWARD, reads=[x], outputs=[a])
    if module_call_before_f1:
        b.mark_module_call()
    b.op("f1", Phase.FORWARD, reads=[a, x] if second_use else [a], outputs=[c])
    b.mark_saved(c)  # f1's output, packed after its kernel
    b.op("b2", Phase.BACKWARD, reads=[c, a], frees=[c])
    b.op("b3", Phase.BACKWARD, reads=[x, a], frees=[a])
    return b.build({"inputs_released": True}), x


def test_an_input_autograd_saves_may_be_swapped_when_the_runtime_can_free_it_in_time():
    t, x = _input_trace(module_call_before_f1=True)
    assert t.movable[x]
    held = t.replace(meta={k: v for k, v in t.meta.items() if k != "inputs_released"})
    assert not held.movable[x]  # by default the loop holds its batch: moving it would free nothing
    action, ret = t.action_window
    assert (action[x], ret[x]) == (0, 3)
    # the model call holds its arguments until it returns: the input leaves after the forward pass
    # (f1), so it is away during b2 only, and the minimum no longer counts it there
    assert list(t.leave_op[[x]]) == [1]
    assert t.minimum_memory == int(max(t.op_memory[0], t.op_memory[1], t.op_memory[2] - 40, t.op_memory[3]))
    assert t.persistent_bytes == 0  # nothing else existed before the iteration
    # The runtime learns that f0 is over at the next module call or the next pack: with no module
    # call before f1, the next pack is f1's output, after f1's kernel ran with x resident.
    t, x = _input_trace(module_call_before_f1=False)
    assert not t.movable[x] and t.action_window[0][x] == -1
    # A later forward use: not its last forward use where it was packed.
    t, x = _input_trace(module_call_before_f1=True, second_use=True)
    assert not t.movable[x]
