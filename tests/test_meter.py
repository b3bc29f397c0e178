"""The CPU memory meter (``dqn_swap.meter``) counts what the allocator hands out, exactly."""

import gc
import json
import subprocess
import sys
from pathlib import Path

import torch

from dqn_swap.meter import AllocatorTimeline, live_bytes


def _measured(keep: list) -> AllocatorTimeline:
    with AllocatorTimeline() as timeline:
        with AllocatorTimeline.mark("a"):
            x = torch.empty(1000, dtype=torch.uint8)  # +1000
            y = torch.empty(250, dtype=torch.float32)  # +1000
            del x  # -1000
        with AllocatorTimeline.mark("b"):
            keep.append(torch.empty(300, dtype=torch.uint8))  # +300
            del y  # -1000
    return timeline


def _figures() -> dict:
    """The timeline's figures of :func:`_measured`, with the garbage collector held still."""
    keep: list = []
    gc.collect()
    gc.disable()
    try:
        timeline = _measured(keep)
    finally:
        gc.enable()
    times, curve = timeline.curve()
    a, b = timeline.window("a"), timeline.window("b")
    return {"peak": timeline.peak, "net": timeline.net, "a": [a.peak, a.net], "b": [b.peak, b.net],
            "curve": curve.tolist(), "sorted": list(times) == sorted(times)}


def test_peak_net_and_marked_windows_are_exact():
    # The allocator's timeline is the whole process's: in a test session another test's leftovers
    # (a tensor freed by a thread it started, or by the garbage collector) may be freed inside the
    # block, and the meter is right to count them (CI saw a 128-byte and a 20-byte one).  The
    # region is measured in a fresh process, where nothing else runs.
    out = subprocess.run([sys.executable, "-c", "import json; from tests.test_meter import _figures; "
                          "print(json.dumps(_figures()))"], cwd=Path(__file__).resolve().parents[1],
                         capture_output=True, text=True, check=True)
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got["peak"] == 2000
    assert got["net"] == 300
    assert got["a"] == [2000, 1000]  # window "a": peak, net
    assert got["b"] == [300, -700]
    assert got["curve"] == [1000, 2000, 1000, 1300, 300] and got["sorted"]


def test_live_bytes_counts_each_storage_once():
    a = torch.empty(10)
    assert live_bytes([a, a[2:], {"x": a.view(2, 5)}]) == 40
