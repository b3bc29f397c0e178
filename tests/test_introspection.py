"""The package face's lazily imported functions show their real signatures to help() and editors."""

from __future__ import annotations

import inspect
import subprocess
import sys

import pytest

import dqn_swap
import dqn_swap.models


def test_lazy_public_functions_have_their_real_signatures():
    from dqn_swap.agents import get_planner
    from dqn_swap.recorder import record_trace
    from dqn_swap.integrations import autoplan

    for name, real in (("record_trace", record_trace), ("autoplan", autoplan), ("get_planner", get_planner)):
        shown = getattr(dqn_swap, name)
        assert shown is real
        params = inspect.signature(shown).parameters
        assert "args" not in params and list(params) == list(inspect.signature(real).parameters), name
        assert shown.__doc__ == real.__doc__
    assert list(inspect.signature(dqn_swap.record_trace).parameters)[:4] == ["model", "example_inputs", "loss_fn",
                                                                               "optimizer"]
    assert list(inspect.signature(dqn_swap.get_planner).parameters) == ["name", "agent", "pins", "settings"]
    assert list(inspect.signature(dqn_swap.models.build_workload).parameters) == ["name", "batch_size", "device",
                                                                                  "seed", "seq_len"]
    assert {"record_trace", "autoplan", "get_planner", "simulate"} <= set(dir(dqn_swap))


@pytest.mark.subprocess
def test_the_package_face_stays_lazy():
    """Importing dqn_swap (and its model names) loads neither torch nor the agents."""
    code = ("import sys, dqn_swap, dqn_swap.models; "
            "print(any(m == 'torch' or m.startswith(('torch.', 'dqn_swap.agents')) for m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"
