"""Pinned tensors (``dqn_swap.pins``): every registered planner's plan keeps what is pinned to
keep and recomputes what is pinned to recompute; the plan records its pins, and a plan file that
breaks them is refused before training."""

from __future__ import annotations

import dataclasses

import pytest

from dqn_swap.agents import get_planner, planner_names
from dqn_swap.pins import PinError, Pins
from dqn_swap.plan import Action, ActionKind
from dqn_swap.planners import pinned_sets, recomputable_activations, saved_activations
from dqn_swap.simulator import verify_plan

from .runtime_support import assert_same_state, mlp_loop

QUICK = {"auto": {"time_limit": 1.0}, "dqn-search": {"time_limit": 1.0}, "optimal": {"time_limit": 1.0}}


def _pins(trace) -> tuple[Pins, set[int], set[int]]:  # noqa: ANN001
    """Keep every activation of the first module that makes one; recompute the largest recomputable one
    of another module."""
    movable = saved_activations(trace)
    module_of = {t: trace.module_names[trace.op_module[trace.tensor_alloc_op[t]]]
                 for t in movable if trace.tensor_alloc_op[t] >= 0}
    first = next(m for m in module_of.values() if m)
    keep = {t for t, m in module_of.items() if m == first}
    rec = max((t for t in recomputable_activations(trace) if t not in keep), key=lambda t: trace.tensor_nbytes[t])
    return Pins(keep=(first,), recompute=(rec,)), keep, {rec}


@pytest.mark.parametrize("name", [n for n in planner_names() if n != "none"])
def test_every_planner_honours_the_pins(tiny_resnet_trace, name: str) -> None:  # noqa: ANN001
    trace = tiny_resnet_trace
    pins, keep, rec = _pins(trace)
    assert pins.resolve(trace) == (keep, rec)
    limit = trace.minimum_memory + (trace.peak_bytes - trace.minimum_memory) // 2
    free = get_planner(name, **QUICK.get(name, {})).plan(trace, limit)
    plan = get_planner(name, pins=pins, **QUICK.get(name, {})).plan(trace, limit)
    assert pins.violations(trace, plan.actions) == []
    assert not {a.tensor for a in plan.actions} & keep
    assert {a.tensor for a in plan.actions if a.kind == ActionKind.RECOMPUTE} >= rec
    assert plan.settings["pins"] == pins.to_dict() and plan.planner == free.planner
    if free.figures.get("feasible"):
        assert plan.figures["feasible"], plan.settings.get("pins_changed")
    # the planner planned around the kept tensors (a view in which they cannot move): nothing of its
    # plan touched them, and here nothing had to be swapped after to fit
    changed = plan.settings.get("pins_changed", {"dropped": 0, "added": 0, "swaps_to_fit": 0})
    assert changed["dropped"] <= len(rec) and changed["swaps_to_fit"] == 0
    verify_plan(trace, plan)


def test_a_plan_that_breaks_its_pins_is_refused(tiny_resnet_trace) -> None:  # noqa: ANN001
    trace = tiny_resnet_trace
    pins, keep, rec = _pins(trace)
    limit = trace.minimum_memory + (trace.peak_bytes - trace.minimum_memory) // 2
    plan = get_planner("greedy-swap", pins=pins).plan(trace, limit)
    (t,) = rec
    edited = dataclasses.replace(plan, actions=tuple(a for a in plan.actions if a.tensor != t), schedule=None)
    with pytest.raises(PinError, match=f"tensor {t} .* pinned to recompute, and the plan keeps it"):
        verify_plan(trace, edited, "plan.json")
    k = min(keep)
    from dqn_swap.planners import last_forward_event

    edited = dataclasses.replace(plan, actions=(*plan.actions, Action(last_forward_event(trace, k), k,
                                                                      ActionKind.SWAP)), schedule=None)
    with pytest.raises(PinError, match=f"plan.json: tensor {k} .* pinned to keep, and the plan swaps it"):
        verify_plan(trace, edited, "plan.json")


def test_pins_that_cannot_hold_are_refused_in_one_line(tiny_resnet_trace) -> None:  # noqa: ANN001
    trace = tiny_resnet_trace
    pins, keep, rec = _pins(trace)
    with pytest.raises(PinError, match="matches no saved activation"):
        Pins(keep=("no.such.module",)).resolve(trace)
    with pytest.raises(PinError, match="pinned both to keep and to recompute"):
        Pins(keep=tuple(rec), recompute=tuple(rec)).resolve(trace)
    with pytest.raises(PinError, match="not a saved activation"):
        Pins(keep=(10**6,)).resolve(trace)
    never = [t for t in saved_activations(trace) if t not in set(recomputable_activations(trace))]
    if never:
        with pytest.raises(PinError, match="cannot be recomputed"):
            pinned_sets(trace, Pins(recompute=(never[0],)))
    with pytest.raises(PinError, match="a tensor id or a pattern"):
        Pins(keep=(1.5,))
    with pytest.raises(PinError):
        get_planner("greedy", pins=Pins(keep=("no.such.module",))).plan(trace, trace.peak_bytes)


def test_autoplan_follows_a_pinned_plan_bit_identically() -> None:
    plain, plain_opt, _ = mlp_loop(None)
    model, opt, planned = mlp_loop({"memory_limit": "20%", "planner": "sqrt-n",
                                    "planner_options": {"pins": Pins(keep=("aten.gelu*",))}})
    entry = planned.last_entry
    assert entry.plan.settings["pins"] == {"keep": ["aten.gelu*"], "recompute": []} and entry.plan.actions
    assert_same_state(plain, plain_opt, model, opt)


def test_autoplans_fallback_planner_honours_the_pins_too() -> None:
    """Where the chosen planner finds no plan (``none`` at 20 %), the planner autoplan falls back on is
    bound by the same pins (it once planned without them, and moved what was pinned to stay)."""
    pins = Pins(keep=("aten.gelu*",))
    plain, plain_opt, _ = mlp_loop(None)
    model, opt, planned = mlp_loop({"memory_limit": "20%", "planner": "none", "planner_options": {"pins": pins}})
    entry = planned.last_entry
    assert entry.plan.planner != "none" and entry.plan.actions and entry.plan.figures["feasible"]
    assert entry.plan.settings["pins"] == pins.to_dict() and pins.violations(entry.trace, entry.plan.actions) == []
    assert_same_state(plain, plain_opt, model, opt)


def test_the_command_line_pins_and_the_plan_file_keeps_them(tiny_resnet_trace, tmp_path) -> None:  # noqa: ANN001
    import json

    from dqn_swap.cli import main

    trace = tiny_resnet_trace
    pins, keep, rec = _pins(trace)
    trace.save(tmp_path / "t.trace")
    (t,) = rec
    out = tmp_path / "p.json"
    assert main(["plan", str(tmp_path / "t.trace"), "-m", "50%", "--planner", "lru", "--keep", pins.keep[0],
                 "--recompute", str(t), "-o", str(out)]) == 0
    saved = json.loads(out.read_text())
    assert saved["settings"]["pins"] == {"keep": [pins.keep[0]], "recompute": [t]}
    assert not {a[1] for a in saved["actions"]} & keep and [t, "recompute"] in [a[1:] for a in saved["actions"]]
    assert main(["simulate", str(tmp_path / "t.trace"), "--plan", str(out), "--keep", "x"]) == 2
    assert main(["plan", str(tmp_path / "t.trace"), "-m", "50%", "--keep", "no.such.module", "-o",
                 str(tmp_path / "q.json")]) == 2 and not (tmp_path / "q.json").exists()
