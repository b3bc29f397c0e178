"""Plan files: version 2 carries the simulator's schedule; version 1 is still read; bad files
give one line."""

from __future__ import annotations

import json

import pytest

from dqn_swap.plan import Plan, PlanError, RecomputeStep, Schedule
from dqn_swap.planners import manual_plan, recomputable_activations, saved_activations
from dqn_swap.simulator import schedule_plan, simulate

from .runtime_support import trace_of


def mixed_plan():  # noqa: ANN201
    trace = trace_of("resnet_tiny")
    rec = recomputable_activations(trace)
    swap = [t for t in saved_activations(trace) if t not in rec[::2]]
    return trace, manual_plan(trace, swap=swap, recompute=rec[::2])


def test_round_trip_keeps_the_schedule(tmp_path) -> None:
    trace, plan = mixed_plan()
    assert plan.schedule is not None and plan.schedule.prefetch and plan.schedule.recompute
    path = plan.save(tmp_path / "p.json")
    data = json.loads(path.read_text())
    assert data["version"] == 2 and "schedule" in data
    again = Plan.load(path, trace)
    assert again == plan


def test_a_version_1_file_is_read_and_scheduled(tmp_path) -> None:
    trace, plan = mixed_plan()
    data = plan.to_json()
    data["version"] = 1
    del data["schedule"]
    path = tmp_path / "v1.json"
    path.write_text(json.dumps(data))
    old = Plan.load(path, trace)
    assert old.schedule is None and old.actions == plan.actions
    assert schedule_plan(trace, old).schedule == plan.schedule == simulate(trace, old).schedule


@pytest.mark.parametrize("mutate,message", [
    (lambda d: d.update(version=3), "version 3 is not supported"),
    (lambda d: d["schedule"].update(prefetch=[[1, 2, 3]]), "corrupt plan"),
    (lambda d: d["schedule"].update(prefetch=[["a", 2]]), "corrupt plan"),
    (lambda d: d["schedule"].update(max_inflight_d2h_bytes=-1), "corrupt plan"),
    (lambda d: d["schedule"].update(recompute=[[5]]), "corrupt plan"),
    # an action's event or tensor that is not a whole number is refused, not truncated or parsed
    (lambda d: d["actions"][0].__setitem__(0, d["actions"][0][0] + 0.5), "corrupt plan"),
    (lambda d: d["actions"][0].__setitem__(1, str(d["actions"][0][1])), "corrupt plan"),
    (lambda d: d["actions"][0].__setitem__(0, True), "corrupt plan"),
    (lambda d: d.update(profile=[1]), "profile must be a non-empty string"),
    (lambda d: d.update(planner={"a": 1}), "planner must be a non-empty string"),
    (lambda d: d.update(settings=[]), "settings must be an object"),
])
def test_bad_schedules_give_one_line(tmp_path, mutate, message) -> None:
    trace, plan = mixed_plan()
    data = plan.to_json()
    mutate(data)
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(data))
    with pytest.raises(PlanError, match=message) as info:
        Plan.load(path, trace)
    assert "\n" not in str(info.value)


def test_a_schedule_that_does_not_fit_the_trace_is_refused() -> None:
    trace, plan = mixed_plan()
    not_swapped = next(a.tensor for a in plan.actions if a.kind == 1)  # removed, not swapped
    bad = plan.with_schedule(Schedule(prefetch=((not_swapped, trace.n_ops - 1),),
                                      recompute=plan.schedule.recompute))
    with pytest.raises(PlanError, match="does not swap"):
        bad.check_trace(trace)
    target = next(a.tensor for a in plan.actions if a.kind == 1)
    wrong_op = plan.with_schedule(Schedule(prefetch=plan.schedule.prefetch,
                                           recompute=((trace.n_ops - 1, (RecomputeStep(0, (target,)),)),)))
    with pytest.raises(PlanError):
        wrong_op.check_trace(trace)
    missing = plan.with_schedule(Schedule(prefetch=plan.schedule.prefetch))
    with pytest.raises(PlanError, match="does not re-create"):
        missing.check_trace(trace)


def test_a_plan_file_nested_past_what_json_reads_gives_one_line(tmp_path) -> None:
    path = tmp_path / "deep.json"
    path.write_text("[" * 200_000 + "]" * 200_000)
    with pytest.raises(PlanError, match="deep.json: corrupt plan file") as info:
        Plan.load(path)
    assert "\n" not in str(info.value)
