"""``autoplan(..., planning="background")``: plans made on a worker thread while training goes on,
the steps that wait for them in safe mode, and training bit-identical to the plain loop."""

from __future__ import annotations

import threading

import pytest
import torch

from dqn_swap.integrations import AutoPlan, AutoPlanError, autoplan

from .test_autoplan import assert_same_state, batches, fresh, run


def test_steps_wait_in_safe_mode_until_the_worker_plans_then_follow_the_plan(monkeypatch) -> None:
    """The worker is held until the test lets it go: the steps in between run in safe mode, the
    first after it follows the plan; the plan was made on another thread; the run trains as the
    plain loop does, bit for bit, dropout included."""
    release = threading.Event()
    threads: list[str] = []
    make_plan = AutoPlan._make_plan

    def held(self, trace, desc, worker=False):  # noqa: ANN001
        threads.append(threading.current_thread().name)
        assert release.wait(30)
        return make_plan(self, trace, desc, worker)

    monkeypatch.setattr(AutoPlan, "_make_plan", held)
    data = batches(12)
    a, oa, _, la = run(fresh(), data, accumulate=1)
    model = fresh()
    torch.manual_seed(1)
    kinds = []

    def steps() -> tuple:
        from .test_autoplan import optimizer_of

        opt = optimizer_of(model)
        sched = torch.optim.lr_scheduler.StepLR(opt, step_size=2, gamma=0.5)
        planned = autoplan(model, "40%", planner="lru", optimizer=opt, verbose=False, planning="background")
        losses = []
        for i, batch in enumerate(data):
            if i == 6:
                release.set()
                planned.wait_for_plans()  # the plan is in by the next step
            with planned.step():
                loss = model(**batch)["loss"]
                loss.backward()
            kinds.append(planned.last)
            losses.append(loss.item())
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            sched.step()
            opt.zero_grad(set_to_none=True)
        planned.remove()
        return opt, planned, losses

    ob, planned, lb = steps()
    assert kinds[:2] == ["warmup", "record"]
    assert set(kinds[2:6]) == {"waiting"} and set(kinds[6:]) == {"planned"}, kinds
    assert planned.waiting_steps == 4 and planned.figures()["dqn_swap/waiting_steps"] == 4
    assert threads and all(t.startswith("dqn-swap-planner") for t in threads)
    assert any("in the background" in line for line in planned.log)
    assert_same_state(a, oa, model, ob)
    assert la == lb


def test_the_agent_plans_on_the_worker_and_training_stays_bit_identical() -> None:
    """The DQN planner on the worker (it runs torch itself there): the training thread's torch thread
    count and random streams are untouched, so the run is the plain loop's."""
    data = batches(8)
    threads = torch.get_num_threads()
    a, oa, _, la = run(fresh(), data)
    b, ob, planned, lb = run(fresh(), data, {"memory_limit": "40%", "planner": "dqn", "planning": "background"})
    planned.wait_for_plans()
    assert torch.get_num_threads() == threads
    assert_same_state(a, oa, b, ob)
    assert la == lb
    assert len(planned.entries) == 2 and all(e.plan.actions for e in planned.entries.values())
    with pytest.raises(AutoPlanError, match="planning="):
        autoplan(fresh(), "40%", planning="later")
