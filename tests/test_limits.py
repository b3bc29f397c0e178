"""One memory-limit type: every form resolves to the same bytes in the command line, the
environment, the runtime, the experiment harness and the core, and bad forms are refused alike."""

from __future__ import annotations

import json
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dqn_swap.cli import main
from dqn_swap.integrations.experiment import _resolve_limit
from dqn_swap.limits import MemoryLimit, MemoryLimitError, resolve_limit
from dqn_swap.planners import manual_plan
from dqn_swap.runtime import PlannedExecution
from dqn_swap.trace import resolve_memory_limit
from dqn_swap.env import SwapRecomputeEnv
from dqn_swap.units import format_bytes

from .runtime_support import trace_of


@pytest.fixture(scope="module")
def trace():  # noqa: ANN201
    return trace_of("resnet_tiny")


@pytest.fixture(scope="module")
def trace_file(trace, tmp_path_factory):  # noqa: ANN001, ANN201
    return str(trace.save(tmp_path_factory.mktemp("limits") / "r.trace"))


def specs(trace):  # noqa: ANN001, ANN201
    low, high = trace.minimum_memory, trace.peak_bytes
    percent = st.floats(0, 100, allow_nan=False).map(lambda p: f"{p:.2f}%")
    times = st.floats(low / high, 2.0, allow_nan=False).map(lambda t: f"{t:.4f}x").filter(
        lambda text: round(float(text[:-1]) * high) >= low)
    size = st.integers(low, 2 * high)
    kib = st.integers(-(-low // 1024), 2 * high // 1024).map(lambda k: f"{k}KiB")
    return st.one_of(percent, times, size, kib, size.map(str), size.map(MemoryLimit.parse))


@settings(max_examples=60, deadline=None)
@given(data=st.data())
def test_every_layer_resolves_every_form_alike(trace, data) -> None:  # noqa: ANN001
    spec = data.draw(specs(trace))
    expected = MemoryLimit.parse(spec).resolve(trace)
    assert resolve_limit(trace, spec) == expected
    assert SwapRecomputeEnv(trace, spec).memory_limit == expected
    assert _resolve_limit(spec, trace, trace.peak_bytes) == expected
    assert PlannedExecution(None, manual_plan(trace), trace, memory_limit=spec).memory_limit == expected
    if not isinstance(spec, MemoryLimit):
        assert resolve_memory_limit(trace, spec) == expected


@pytest.mark.parametrize("spec", ["37.5%", "0.75x", "2MiB", "3000000", 3_100_000, "1.25x"])
def test_the_command_line_agrees(trace, trace_file, capsys, spec) -> None:  # noqa: ANN001
    code = main(["simulate", trace_file, "-m", str(spec), "--planner", "none", "--json"])
    out = json.loads(capsys.readouterr().out)
    assert code in (0, 1)
    assert out["memory_limit"] == MemoryLimit.parse(spec).resolve(trace)


@pytest.mark.parametrize("spec,message", [
    ("0.5", "ambiguous"), (0.5, "ambiguous"), (1.0, "ambiguous"), ("1", "ambiguous"), (True, "not a memory limit"),
    ("150%", "between 0%"), ("-5%", "between 0%"), ("0x", "positive"), ("-1GiB", "positive"), ("infx", "finite"),
    ("nan%", "finite"), ("abc", "not a memory limit"), ("", "empty"), (-5, "positive"), (float("inf"), "finite"),
    ("12 parsecs", "not a memory limit"),
])
def test_bad_forms_are_refused_alike(trace, trace_file, capsys, spec, message) -> None:  # noqa: ANN001
    for resolve in (lambda: resolve_limit(trace, spec), lambda: SwapRecomputeEnv(trace, spec),
                    lambda: PlannedExecution(None, manual_plan(trace), trace, memory_limit=spec)):
        with pytest.raises(MemoryLimitError, match=message):
            resolve()
    if isinstance(spec, str) and spec:
        code = main(["simulate", trace_file, f"--memory-limit={spec}", "--planner", "none"])
        err = capsys.readouterr().err.strip()
        assert code == 2 and err.count("\n") == 0 and message in err


def test_below_the_minimum_is_refused_with_the_minimum(trace) -> None:  # noqa: ANN001
    low = trace.minimum_memory
    # the multiple rounded down, so that it stays below the minimum whatever the trace's peak
    below = math.floor((low - 1) / trace.peak_bytes * 1e6) / 1e6
    for spec in (low - 1, f"{below:.6f}x", f"{(low - 1024) // 1024}KiB"):
        with pytest.raises(MemoryLimitError, match=format_bytes(low)):
            SwapRecomputeEnv(trace, spec)
    assert resolve_limit(trace, low - 1, check_minimum=False) == low - 1


def test_sizes_and_multiples_are_the_devices_and_leave_what_it_held_outside(trace) -> None:  # noqa: ANN001
    """On a GPU the device holds bytes the trace does not (cuBLAS's workspaces): a size or a multiple
    is of the device's memory, so those bytes come off before planning; a percentage is of the
    trace's own range and is unchanged."""
    low, high = trace.minimum_memory, trace.peak_bytes
    outside = high // 8
    gpu = trace.replace(meta={**trace.meta, "outside_bytes": outside})
    assert gpu.outside_bytes == outside and trace.outside_bytes == 0
    size = outside + (low + high) // 2
    assert resolve_limit(gpu, size) == size - outside == resolve_limit(trace, size - outside)
    assert resolve_limit(gpu, "0.8x", unplanned_peak=high + outside) == round(0.8 * (high + outside)) - outside
    assert resolve_limit(gpu, "0.8x") == round(0.8 * (high + outside)) - outside  # base: the trace's and outside
    assert resolve_limit(gpu, "40%") == resolve_limit(trace, "40%")
    assert SwapRecomputeEnv(gpu, size).memory_limit == size - outside  # every layer alike
    # the minimum is said in device bytes, with what the outside bytes are
    with pytest.raises(MemoryLimitError, match=f"{format_bytes(low + outside)}.*held on the device outside"):
        resolve_limit(gpu, outside + low - 1)
    assert resolve_limit(gpu, outside + low) == low
    assert resolve_limit(gpu, outside // 2, check_minimum=False) == 0


def test_the_command_line_says_what_a_size_lost_to_the_gpu(trace, tmp_path, capsys) -> None:  # noqa: ANN001
    """A trace recorded on a GPU with bytes held beside it: a size comes off by them, and the
    command says so in one line on stderr; a percentage is unchanged and says nothing."""
    outside = trace.peak_bytes // 8
    path = str(trace.replace(meta={**trace.meta, "outside_bytes": outside}).save(tmp_path / "gpu.trace"))
    size = outside + trace.peak_bytes
    assert main(["simulate", path, "-m", str(size), "--planner", "none", "--json"]) in (0, 1)
    out, err = capsys.readouterr()
    assert json.loads(out)["memory_limit"] == size - outside
    assert err.count("\n") == 1 and "outside the recorded iteration" in err and format_bytes(outside) in err
    main(["simulate", path, "-m", "50%", "--planner", "none", "--json"])
    assert "outside" not in capsys.readouterr().err
