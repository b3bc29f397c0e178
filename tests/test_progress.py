"""Progress reports on standard error (dqn_swap.progress), by a fake clock: off by default, quiet for
short runs, a live line on a terminal, plain lines elsewhere; and the planners and commands use it."""

from __future__ import annotations

import io

import pytest

from dqn_swap.progress import PLAIN_EVERY, QUIET_SECONDS, progress, showing


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def run(live: bool, ticks: list[float], **kw) -> str:  # noqa: ANN003
    """A run reporting at the seconds ``ticks`` (from its start) with a fake clock; what was written."""
    out, clock = io.StringIO(), Clock()
    with showing(out, live=live, clock=clock, **kw):
        with progress("planner") as show:
            start = clock.now
            for i, t in enumerate(ticks):
                clock.now = start + t
                show(lambda i=i: f"step {i}")
    return out.getvalue()


def test_off_by_default_in_the_library(capsys: pytest.CaptureFixture[str]) -> None:
    show = progress("planner")
    show._start -= 100  # long past the quiet interval
    show("anything", force=True)
    show.close("done")
    assert not show.enabled and show.written == 0 and capsys.readouterr().err == ""


def test_a_short_run_writes_nothing() -> None:
    assert run(False, [0.1, 0.5, QUIET_SECONDS - 0.01]) == ""
    assert run(True, [0.1, 0.5, QUIET_SECONDS - 0.01]) == ""


def test_plain_lines_every_few_seconds_then_the_last_state() -> None:
    ticks = [0.5 * i for i in range(1, 31)]  # 15 s of reports, two a second
    text = run(False, ticks)
    lines = text.splitlines()
    assert "\r" not in text
    # first at the end of the quiet interval, then one every PLAIN_EVERY seconds, then the last state
    assert lines[0] == f"planner: step {int(QUIET_SECONDS / 0.5) - 1}, {QUIET_SECONDS:.0f} s"
    assert len(lines) == 1 + int((15 - QUIET_SECONDS) // PLAIN_EVERY) + 1
    assert lines[-1] == "planner: step 29, 15 s"


def test_a_live_line_is_rewritten_in_place_and_ended() -> None:
    text = run(True, [0.5 * i for i in range(1, 11)])
    assert "\n" not in text[:-1] and text.endswith("\n")
    parts = text[:-1].split("\r")[1:]
    assert parts[0].startswith("planner: step 3, 2 s")
    assert parts[-1].rstrip() == "planner: step 9, 5 s"
    # every rewrite covers the longer line before it
    assert all(len(b) >= len(a.rstrip()) for a, b in zip(parts, parts[1:]))


def test_the_prefix_and_nesting() -> None:
    out, clock = io.StringIO(), Clock()
    with showing(out, live=False, clock=clock):
        with showing(prefix="compare 3/8 r50 70%: "):
            show = progress("dqn-search")
            clock.now += 3
            show("polishing")
            show.close()
    assert out.getvalue().splitlines()[0] == "compare 3/8 r50 70%: dqn-search: polishing, 3 s"


def test_enabled_without_showing_goes_to_standard_error(capsys: pytest.CaptureFixture[str]) -> None:
    show = progress("optimal", enabled=True)
    show._start -= 10  # as if it had run for ten seconds
    show("round 1")
    show.close()
    err = capsys.readouterr().err
    assert "optimal: round 1, 10 s" in err


def test_a_planner_reports_through_it(tiny_resnet_trace) -> None:
    """A baseline that runs past the quiet interval says what it does (simulations, best so far)."""
    from dqn_swap.agents import get_planner

    trace = tiny_resnet_trace
    limit = int(trace.minimum_memory + 0.5 * (trace.peak_bytes - trace.minimum_memory))
    out = io.StringIO()
    # quiet=0: the tiny trace plans in a moment; the lines are those of a long run
    with showing(out, live=False, quiet=0.0, plain_every=0.0):
        get_planner("tflms").plan(trace, limit)
    lines = out.getvalue().splitlines()
    assert lines and all(line.startswith("tflms: ") for line in lines)
    assert "simulations, best" in lines[-1]
    assert get_planner("tflms").plan(trace, limit).settings["simulations"] == len(lines) - 1


def test_dqn_search_reports_its_stages(tiny_resnet_trace) -> None:
    from dqn_swap.agents import get_planner

    trace = tiny_resnet_trace
    limit = int(trace.minimum_memory + 0.4 * (trace.peak_bytes - trace.minimum_memory))
    out = io.StringIO()
    with showing(out, live=False, quiet=0.0, plain_every=0.0):
        plan = get_planner("dqn-search", threads=1, polish_simulations=50).plan(trace, limit)
    text = out.getvalue()
    assert "dqn-search: lookahead, " in text and "polishing the lookahead's plan (1 of 2)" in text
    assert text.splitlines()[-1].startswith("dqn-search: done, overhead ")
    assert plan.settings["cut_by_time"] == []
