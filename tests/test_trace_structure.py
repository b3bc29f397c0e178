"""Impossible traces are refused on load, before any planning, with one line naming the file and
what is wrong: each case below changes one fact of a real recorded trace (its events, its tensor
table, its saved table, its phases, its totals or its metadata) into one no iteration can have."""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from dqn_swap.cli import main
from dqn_swap.trace import EventKind, Phase, Trace, TraceError

Arrays = dict[str, Any]


@pytest.fixture(scope="module")
def good(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from dqn_swap.models import build_workload
    from dqn_swap.recorder import record_trace

    d = tmp_path_factory.mktemp("structure")
    w = build_workload("resnet_tiny", 2, "meta")
    trace = record_trace(w.model, w.example_inputs, w.loss_fn, w.make_optimizer, device="meta",
                         meta={"model": "resnet_tiny", "batch_size": 2})
    return trace.save(d / "good.trace")


def _load(path: Path) -> Arrays:
    with np.load(path, allow_pickle=False) as z:
        arrays = {k: z[k].copy() for k in z.files}
    arrays["meta"] = json.loads(bytes(arrays["meta"]).decode())
    return arrays


def _save(arrays: Arrays, path: Path) -> Path:
    out = dict(arrays)
    out["meta"] = np.frombuffer(json.dumps(arrays["meta"]).encode(), dtype=np.uint8)
    with open(path, "wb") as f:
        np.savez_compressed(f, **out)
    return path


def _allocated(a: Arrays) -> np.ndarray:
    """Tensors allocated and freed inside the iteration, with at least one op between."""
    alloc, free = a["tensor_alloc_op"], a["tensor_free_op"]
    return np.flatnonzero((alloc > 0) & (free > alloc + 1) & (free < len(a["op_name"]) - 1))


def read_before_malloc(a: Arrays) -> None:
    t = _allocated(a)[0]
    e = np.flatnonzero((a["event_kind"] == EventKind.READ) & (a["event_op"] < a["tensor_alloc_op"][t]))[0]
    a["event_tensor"][e] = t


def read_after_free(a: Arrays) -> None:
    t = _allocated(a)[0]
    e = np.flatnonzero((a["event_kind"] == EventKind.READ) & (a["event_op"] > a["tensor_free_op"][t]))[0]
    a["event_tensor"][e] = t


def allocated_after_freed(a: Arrays) -> None:
    t = _allocated(a)[0]
    a["tensor_alloc_op"][t] = a["tensor_free_op"][t] + 1


def producer_cycle(a: Arrays) -> None:
    """Two tensors, each read by the op that makes the other."""
    candidates = _allocated(a)
    t = candidates[0]
    u = next(x for x in candidates if a["tensor_alloc_op"][x] != a["tensor_alloc_op"][t])
    for x, y in ((t, u), (u, t)):
        e = np.flatnonzero((a["event_op"] == a["tensor_alloc_op"][x]) & (a["event_kind"] == EventKind.READ))[0]
        a["event_tensor"][e] = y


def _saved_tensors(a: Arrays) -> np.ndarray:
    return np.flatnonzero(a["tensor_saved_index"] >= 0)


def duplicate_saved_index(a: Arrays) -> None:
    s = _saved_tensors(a)
    a["tensor_saved_index"][s[1]] = a["tensor_saved_index"][s[0]]


def saved_index_huge(a: Arrays) -> None:
    a["tensor_saved_index"][_saved_tensors(a)[0]] = 10**6


def saved_index_all_unset(a: Arrays) -> None:
    a["tensor_saved_index"][:] = -1


def saved_table_out_of_order(a: Arrays) -> None:
    a["saved"] = a["saved"][::-1].copy()


def every_malloc_a_free(a: Arrays) -> None:
    a["event_kind"][a["event_kind"] == EventKind.MALLOC] = EventKind.FREE


def allocating_op_disagrees(a: Arrays) -> None:
    a["tensor_alloc_op"][_allocated(a)[0]] += 1


def freeing_op_disagrees(a: Arrays) -> None:
    a["tensor_free_op"][_allocated(a)[0]] -= 1


def two_mallocs(a: Arrays) -> None:
    t = _allocated(a)[0]
    e = np.flatnonzero((a["event_tensor"] == t) & (a["event_kind"] != EventKind.MALLOC))[0]
    a["event_kind"][e] = EventKind.MALLOC


def every_op_backward(a: Arrays) -> None:
    a["op_phase"][:] = Phase.BACKWARD


def backward_inside_forward(a: Arrays) -> None:
    a["op_phase"][3] = Phase.BACKWARD


def optimizer_first(a: Arrays) -> None:
    a["op_phase"][0] = Phase.OPTIMIZER


def never_freed_table(a: Arrays) -> None:
    a["tensor_free_op"][:] = -1


def never_freed_at_all(a: Arrays) -> None:
    keep = a["event_kind"] != EventKind.FREE
    for k in ("event_kind", "event_op", "event_tensor"):
        a[k] = a[k][keep]
    a["tensor_free_op"][:] = -1


def every_tensor_huge(a: Arrays) -> None:
    a["tensor_nbytes"][:] = 2**50


def durations_overflow(a: Arrays) -> None:
    a["op_duration"][:] = 1e308


def durations_a_century(a: Arrays) -> None:
    a["op_duration"][:] = 100 * 365 * 24 * 3600.0 / len(a["op_duration"])


def event_tensor_wide(a: Arrays) -> None:
    col = a["event_tensor"].astype(np.int64)
    col[0] = 2**40
    a["event_tensor"] = col


def event_op_wide_negative(a: Arrays) -> None:
    col = a["event_op"].astype(np.int64)
    col[-1] = -(2**33)
    a["event_op"] = col


def op_names_dict(a: Arrays) -> None:
    a["meta"]["op_names"] = {str(i): n for i, n in enumerate(a["meta"]["op_names"])}


def op_names_int(a: Arrays) -> None:
    a["meta"]["op_names"] = 5


def module_names_int(a: Arrays) -> None:
    a["meta"]["module_names"] = 5


def op_names_numbers(a: Arrays) -> None:
    a["meta"]["op_names"] = list(range(len(a["meta"]["op_names"])))


def profile_unknown(a: Arrays) -> None:
    a["meta"]["profile"] = "nosuch"


def profile_unknown_alone(a: Arrays) -> None:
    a["meta"]["profile"] = "nosuch"
    a["meta"].pop("profile_params", None)


def profile_number(a: Arrays) -> None:
    a["meta"]["profile"] = 7


def profile_params_wrong(a: Arrays) -> None:
    a["meta"]["profile"] = "measured"
    a["meta"]["profile_params"] = {"name": "measured", "flops": "fast"}


def inputs_released_text(a: Arrays) -> None:
    a["meta"]["inputs_released"] = "yes"


def batch_size_text(a: Arrays) -> None:
    a["meta"]["batch_size"] = "two"


def meta_a_list(a: Arrays) -> None:
    a["meta"] = {"format": a["meta"]["format"], "version": a["meta"]["version"], "op_names": a["meta"]["op_names"],
                 "module_names": a["meta"]["module_names"], "model": ["resnet"]}


CASES: dict[str, tuple[Callable[[Arrays], None], str]] = {
    "read_before_malloc": (read_before_malloc, "used before its malloc"),
    "read_after_free": (read_after_free, "used after its free"),
    "allocated_after_freed": (allocated_after_freed, "malloc event is at op"),
    "producer_cycle": (producer_cycle, "used before its malloc"),
    "duplicate_saved_index": (duplicate_saved_index, "saved index"),
    "saved_index_huge": (saved_index_huge, "saved index is 1000000"),
    "saved_index_all_unset": (saved_index_all_unset, "saved index is -1"),
    "saved_table_out_of_order": (saved_table_out_of_order, "saved index"),
    "every_malloc_a_free": (every_malloc_a_free, "malloc events"),
    "allocating_op_disagrees": (allocating_op_disagrees, "malloc event is at op"),
    "freeing_op_disagrees": (freeing_op_disagrees, "free event is at op"),
    "two_mallocs": (two_mallocs, "2 malloc events"),
    "every_op_backward": (every_op_backward, "no op runs forward"),
    "backward_inside_forward": (backward_inside_forward, "after a backward op"),
    "optimizer_first": (optimizer_first, "after a optimizer op"),
    "never_freed_table": (never_freed_table, "free events but its freeing op is -1"),
    "never_freed_at_all": (never_freed_at_all, "never freed"),
    "every_tensor_huge": (every_tensor_huge, "beyond any device"),
    "durations_overflow": (durations_overflow, "op_duration sums to inf"),
    "durations_a_century": (durations_a_century, "for one iteration"),
    "event_tensor_wide": (event_tensor_wide, "column event_tensor holds 1099511627776"),
    "event_op_wide_negative": (event_op_wide_negative, "column event_op holds"),
    "op_names_dict": (op_names_dict, "op_names is not a list of strings"),
    "op_names_int": (op_names_int, "op_names is not a list of strings"),
    "module_names_int": (module_names_int, "module_names is not a list of strings"),
    "op_names_numbers": (op_names_numbers, "op_names is not a list of strings"),
    "profile_unknown": (profile_unknown, "metadata profile 'nosuch' disagrees with its profile_params"),
    "profile_unknown_alone": (profile_unknown_alone, "metadata profile"),
    "profile_number": (profile_number, "metadata profile is 7"),
    "profile_params_wrong": (profile_params_wrong, "metadata profile"),
    "inputs_released_text": (inputs_released_text, "metadata inputs_released is 'yes'"),
    "batch_size_text": (batch_size_text, "metadata batch_size is 'two'"),
    "meta_model_list": (meta_a_list, "metadata model is ['resnet']"),
}


@pytest.mark.parametrize("name", list(CASES))
def test_an_impossible_trace_is_refused_on_load(good: Path, name: str) -> None:
    change, words = CASES[name]
    arrays = _load(good)
    change(arrays)
    path = _save(arrays, good.parent / f"{name}.trace")
    with pytest.raises(TraceError) as info:
        Trace.load(path)
    message = str(info.value)
    assert message.startswith(f"{path}: "), message
    assert words in message and "\n" not in message, message


_COMMANDS = {"inspect": ["inspect"], "plan": ["plan", "-m", "60%", "--planner", "lru", "-o", "new.json"],
             "search": ["simulate", "-m", "60%", "--planner", "dqn-search"]}


@pytest.mark.parametrize("name,command", [(n, _COMMANDS[c]) for n in CASES for c in ("inspect", "plan")]
                         + [(n, _COMMANDS["search"]) for n in ("producer_cycle", "every_tensor_huge",
                                                                "profile_unknown", "saved_index_all_unset")])
def test_the_command_line_refuses_it_before_planning(good: Path, name: str, command: list[str],
                                                     capsys: pytest.CaptureFixture[str],
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    change, words = CASES[name]
    arrays = _load(good)
    change(arrays)
    monkeypatch.chdir(good.parent)
    _save(arrays, good.parent / f"{name}.trace")
    before = sorted(p.name for p in good.parent.iterdir())
    try:
        code = main([command[0], f"{name}.trace", *command[1:]])
    except SystemExit as e:
        code = int(e.code or 0)
    err = capsys.readouterr().err.strip()
    assert code != 0 and "Traceback" not in err and "\n" not in err, err
    assert f"{name}.trace: corrupt trace" in err and words in err, err
    assert sorted(p.name for p in good.parent.iterdir()) == before


def test_every_recorded_fact_of_a_good_trace_passes(good: Path) -> None:
    """The checks refuse what is impossible, not what is unusual: the untouched trace loads, and so
    does one saved with the widest integer columns whose values all fit."""
    arrays = _load(good)
    for k in ("event_tensor", "event_op", "tensor_alloc_op", "saved"):
        arrays[k] = arrays[k].astype(np.int64)
    Trace.load(_save(arrays, good.parent / "wide.trace"))
    assert Trace.load(good).n_ops > 0


@pytest.mark.parametrize("what", ["trace", "plan", "agent"])
def test_a_fifo_is_refused_not_waited_on(tmp_path: Path, what: str, capsys: pytest.CaptureFixture[str],
                                         monkeypatch: pytest.MonkeyPatch, good: Path) -> None:
    """A named pipe given as a file would block the reader forever: refused at once, by name."""
    monkeypatch.chdir(tmp_path)
    os.mkfifo("pipe")
    args = {"trace": ["inspect", "pipe"],
            "plan": ["simulate", str(good), "--plan", "pipe"],
            "agent": ["plan", str(good), "-m", "60%", "--planner", "dqn", "--agent", "pipe", "-o", "p.json"]}[what]
    result: dict[str, Any] = {}

    def run() -> None:
        try:
            result["code"] = main(args)
        except SystemExit as e:
            result["code"] = int(e.code or 0)

    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(60)
    if t.is_alive():  # unblock the reader so the test process can end
        with open("pipe", "wb") as f:
            f.write(b"x")
        pytest.fail("the reader is waiting on the FIFO")
    err = capsys.readouterr().err.strip()
    assert result["code"] != 0 and "pipe: is a FIFO (named pipe), not a regular file" in err, err
    assert "\n" not in err
