"""Hugging Face transformers as first-class models (needs the ``hf`` extra: ``pip install dqn-swap[hf]``).

GPT-2, Llama, BERT and ViT, built from small configurations (random weights, nothing
downloaded) and trained the way the library trains them (labels in, ``output.loss`` out;
the causal models also return their key/value cache), record on cpu and meta, plan with
every planner, and train under swap, recompute and mixed plans bit-identically to
unplanned training: losses, whole ``state_dict``, optimizer state, eval-mode outputs.
"""

from __future__ import annotations

import pytest

pytest.importorskip("transformers")

from dqn_swap.agents import get_planner, planner_names  # noqa: E402
from dqn_swap.models import build_workload  # noqa: E402
from dqn_swap.recorder import record_trace  # noqa: E402
from dqn_swap.simulator import simulate  # noqa: E402
from dqn_swap.trace import resolve_memory_limit  # noqa: E402

from ..runtime_support import MODELS, assert_same_training, hand_plan, train, trace_of  # noqa: E402

HF = ("hf:gpt2", "hf:llama", "hf:bert", "hf:vit")
assert all(name in MODELS for name in HF)  # runtime_support makes them cases of every runtime test


@pytest.mark.parametrize("name", HF)
def test_records_on_meta_with_the_structure_of_the_cpu_trace(name: str) -> None:
    meta = build_workload(name, 2, "meta", seed=0)
    trace = record_trace(meta.model, meta.example_inputs, meta.loss_fn, meta.make_optimizer, device="meta")
    cpu = trace_of(name)
    assert len(trace.saved) == len(cpu.saved) and trace.peak_bytes > 0
    assert abs(trace.peak_bytes / cpu.peak_bytes - 1) < 0.15  # only the kernels' scratch is estimated


@pytest.mark.parametrize("name", HF)
def test_every_planner_plans_it(name: str) -> None:
    trace = trace_of(name)
    limit = resolve_memory_limit(trace, "50%")
    for planner in planner_names():
        plan = get_planner(planner).plan(trace, limit)
        result = simulate(trace, plan)
        assert result.peak_bytes <= limit or not result.feasible
        assert plan.schedule is not None


@pytest.mark.parametrize("name", HF)
@pytest.mark.parametrize("kind", ["swap", "recompute", "mixed"])
def test_trains_bit_identically_under_a_plan(name: str, kind: str) -> None:
    plan = hand_plan(name, kind)
    assert plan.actions
    assert_same_training(name, train(name, plan))
