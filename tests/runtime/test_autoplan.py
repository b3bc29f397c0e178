"""``dqn_swap.autoplan``: planned training in the user's own loop, turned on with one line.

The loops here are written the way users write them: ``model(**batch)`` with dictionary
outputs, AdamW with two parameter groups, a scheduler, gradient accumulation over two
micro-batches and clipping.  Each planned run is compared, whole state included (every
``state_dict`` entry, the optimizer's state, the scheduler's learning rate), with the same
loop run without ``autoplan``.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from dqn_swap.integrations import AutoPlanError, autoplan
from dqn_swap.recorder import record_trace
from dqn_swap.trace import resolve_memory_limit

from ..runtime_support import assert_same_state


class DictNet(nn.Module):
    """A small classifier called like a Hugging Face model: keyword inputs, labels in, a dict out."""

    def __init__(self, width: int = 64, depth: int = 5, classes: int = 4) -> None:
        super().__init__()
        self.inp = nn.Linear(32, width)
        self.blocks = nn.ModuleList(nn.Sequential(nn.LayerNorm(width), nn.Linear(width, 2 * width), nn.GELU(),
                                                  nn.Dropout(0.1), nn.Linear(2 * width, width))
                                    for _ in range(depth))
        self.head = nn.Linear(width, classes)

    def forward(self, features: torch.Tensor, labels: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
        x = self.inp(features)
        for block in self.blocks:
            x = x + block(x)
        logits = self.head(x)
        out = {"logits": logits}
        if labels is not None:
            out["loss"] = F.cross_entropy(logits, labels)
        return out


def optimizer_of(model: nn.Module) -> torch.optim.Optimizer:
    decay = [p for n, p in model.named_parameters() if p.dim() > 1]
    rest = [p for n, p in model.named_parameters() if p.dim() <= 1]
    return torch.optim.AdamW([{"params": decay, "weight_decay": 0.01}, {"params": rest, "weight_decay": 0.0}],
                             lr=1e-3, foreach=False)


def batches(n: int, size: int = 256, seed: int = 0) -> list[dict[str, torch.Tensor]]:
    g = torch.Generator().manual_seed(seed)
    return [{"features": torch.randn(size, 32, generator=g), "labels": torch.randint(0, 4, (size,), generator=g)}
            for _ in range(n)]


def run(model: nn.Module, data: list[dict[str, torch.Tensor]], planned_kwargs: dict | None = None, *,
        accumulate: int = 2, read_between: bool = False) -> tuple[nn.Module, torch.optim.Optimizer, object, list]:
    """The user's loop; with ``planned_kwargs``, the same loop with ``autoplan`` turned on."""
    torch.manual_seed(1)
    opt = optimizer_of(model)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=2, gamma=0.5)
    planned = autoplan(model, optimizer=opt, verbose=False, **planned_kwargs) if planned_kwargs else None
    losses = []
    for i, batch in enumerate(data):
        with planned.step() if planned is not None else _null():
            out = model(**batch)
            loss = out["loss"] / accumulate
            if read_between:  # what a loop logs between forward and backward
                losses.append((out["logits"].argmax(-1) == batch["labels"]).float().mean().item())
                losses.append(float(batch["features"].sum()))
            loss.backward()
        losses.append(loss.item())
        if (i + 1) % accumulate == 0:
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            sched.step()
            opt.zero_grad(set_to_none=True)
    return model, opt, planned, losses


class _null:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        return None


def fresh(seed: int = 0, **kwargs: int) -> DictNet:
    torch.manual_seed(seed)
    return DictNet(**kwargs)


def test_the_recorded_step_is_the_iteration_record_trace_sees() -> None:
    """Recording inside the user's block (saved activations on the host) gives record_trace's trace."""
    model = fresh()
    ref = copy.deepcopy(model)
    batch = batches(1)[0]
    trace = record_trace(ref, (batch["features"], batch["labels"]), lambda out: out["loss"], optimizer_of(ref),
                         device="cpu")
    opt = optimizer_of(model)
    planned = autoplan(model, "1.0x", planner="none", optimizer=opt, verbose=False)
    for _ in range(2):  # warm-up (the optimizer's state appears), then the recorded step
        opt.zero_grad(set_to_none=True)
        with planned.step():
            out = model(**batch)
            out["loss"].backward()
            del out
        opt.step()
    got = next(iter(planned.entries.values())).trace
    for name in ("op_name", "op_phase", "op_scratch", "tensor_nbytes", "tensor_role", "tensor_alloc_op", "saved",
                 "saved_op"):
        assert np.array_equal(getattr(trace, name), getattr(got, name)), name
    assert [trace.op_names[i] for i in trace.op_name] == [got.op_names[i] for i in got.op_name]
    assert got.peak_bytes == trace.peak_bytes and got.minimum_memory >= trace.minimum_memory  # the caller holds its inputs
    assert not got.meta.get("inputs_released") and not got.movable[got.tensor_role == 3].any()  # the loop holds them
    assert got.meta["model"] == "DictNet" and got.meta["batch_size"] == 256  # the features' and labels' leading dim


def test_the_batch_size_is_the_leading_dimension_all_tensor_arguments_share() -> None:
    from dqn_swap.integrations import batch_size_of

    x, y = torch.zeros(8, 3), torch.zeros(8, dtype=torch.long)
    assert batch_size_of((x,), {"labels": y, "mask": None, "scale": 2.0}) == 8
    assert batch_size_of(({"input_ids": x, "extra": [y]},), {}) == 8  # nested in containers
    assert batch_size_of((x, torch.zeros(4)), {}) is None  # leading dimensions differ: ambiguous
    assert batch_size_of((torch.tensor(1.0),), {"n": 3}) is None  # no tensor with a dimension


@pytest.mark.parametrize("planner", ["lru", "sqrt-n", "greedy", "dqn"])
def test_planned_loop_is_bit_identical_to_the_plain_loop(planner: str) -> None:
    data = batches(8)
    a, oa, _, la = run(fresh(), data)
    b, ob, planned, lb = run(fresh(), data, {"memory_limit": "40%", "planner": planner}, read_between=False)
    assert_same_state(a, oa, b, ob)
    assert la == lb
    assert planned.last == "planned"
    plans = list(planned.entries.values())
    assert len(plans) == 2  # micro-steps without and with gradients are two signatures
    assert any(e.plan.actions for e in plans)
    assert planned.stats is not None and planned.stats.packed > 0


def test_reading_inputs_and_outputs_between_forward_and_backward() -> None:
    data = batches(6)
    a, oa, _, la = run(fresh(), data, read_between=True)
    b, ob, _, lb = run(fresh(), data, {"memory_limit": "30%", "planner": "lru"}, read_between=True)
    assert_same_state(a, oa, b, ob)
    assert la == lb


def test_the_recording_step_stays_under_the_limit() -> None:
    """The steps before the plan exists keep saved activations on the host: measured, they need
    less than the limit the plan is made for, where the unplanned step needs the trace's peak."""
    model = fresh(width=128, depth=6)
    _, _, planned, _ = run(model, batches(4, size=512), {"memory_limit": "30%", "planner": "greedy"})
    for key, entry in planned.entries.items():
        measured = entry.trace.initial_bytes + planned.record_peaks[key]
        limit = resolve_memory_limit(entry.trace, "30%")
        assert measured <= limit < entry.trace.peak_bytes, (measured, limit, entry.trace.peak_bytes)


def test_a_new_shape_gets_its_own_plan_and_refuse_says_so() -> None:
    data = batches(4) + batches(2, size=100, seed=3)  # a short last batch
    a, oa, _, _ = run(fresh(), data)
    b, ob, planned, _ = run(fresh(), data, {"memory_limit": "40%", "planner": "lru"})
    assert_same_state(a, oa, b, ob)
    assert len(planned.entries) == 4 and any("features=100x32" in line for line in planned.log)
    with pytest.raises(AutoPlanError, match="features=100x32 float32.*has no plan"):
        run(fresh(), data, {"memory_limit": "40%", "planner": "lru", "new_shapes": "refuse"})


def test_two_forward_passes_in_one_step_are_refused() -> None:
    model = fresh()
    planned = autoplan(model, "50%", planner="lru", verbose=False)
    batch = batches(1)[0]
    with pytest.raises(AutoPlanError, match="called twice in one planned.step"):
        with planned.step():
            model(**batch)["loss"].backward()
            model(**batch)["loss"].backward()
    with planned.step():  # the object is usable again
        model(**batch)["loss"].backward()


def test_where_the_planner_finds_no_plan_another_does_else_it_is_refused(monkeypatch) -> None:
    """sqrt-n cannot reach the minimum ("0%"); a fallback planner can, and training goes on as
    unplanned training does, said in the log.  With no fallback, the step is refused with one line."""
    import dqn_swap.integrations.loop_planning as ul

    data = batches(4)
    a, oa, _, _ = run(fresh(), data)
    b, ob, planned, _ = run(fresh(), data, {"memory_limit": "0%", "planner": "sqrt-n"})
    assert_same_state(a, oa, b, ob)
    assert any("'sqrt-n' found no plan" in line and "followed instead" in line for line in planned.log), planned.log
    monkeypatch.setattr(ul, "FALLBACK_PLANNERS", ())
    with pytest.raises(AutoPlanError, match="found no plan under .*allow_infeasible=True"):
        run(fresh(), data, {"memory_limit": "0%", "planner": "sqrt-n"})


def test_plans_saved_and_given_back_start_planned(tmp_path: Path) -> None:
    data = batches(4)
    a, oa, _, _ = run(fresh(), data, {"memory_limit": "40%", "planner": "lru", "cache": tmp_path})
    files = sorted(p.name for p in tmp_path.iterdir())
    index = json.loads((tmp_path / "index.json").read_text())
    assert len(index) == 2 and len(files) == 5
    before = {p.name: p.read_bytes() for p in tmp_path.iterdir()}
    b, ob, planned, _ = run(fresh(), data, {"memory_limit": "40%", "planner": "lru", "cache": tmp_path})
    assert planned.log[0].startswith("loaded 2 plan(s)")
    assert not any("recording" in line or "warm-up" in line for line in planned.log)
    assert_same_state(a, oa, b, ob)
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir()} == before  # nothing rewritten


@pytest.mark.parametrize("index,message", [
    ("{not json", "not a dqn-swap autoplan index"),
    ("[" * 200_000 + "]" * 200_000, "not a dqn-swap autoplan index"),
    ("[1, 2]", "not a dqn-swap autoplan index"),
    ('{"k": 5}', "not a dqn-swap autoplan index"),
    ('{"k": {"trace": "t.trace"}}', "entry 'k' is malformed"),
    ('{"k": {"trace": 5, "plan": "p.json"}}', "entry 'k' is malformed"),
    ('{"k": {"trace": "../t.trace", "plan": "p.json"}}', "file names in the index's folder"),
    ('{"k": {"trace": "/etc/hostname", "plan": "p.json"}}', "file names in the index's folder"),
])
def test_a_bad_cache_index_gets_one_line(tmp_path: Path, index: str, message: str) -> None:
    """A cache folder's index that is not what autoplan writes, or that names files outside the
    folder, is refused with one line before any step runs."""
    (tmp_path / "index.json").write_text(index)
    with pytest.raises(AutoPlanError, match=message) as info:
        autoplan(fresh(), "40%", planner="lru", cache=tmp_path, verbose=False)
    assert "\n" not in str(info.value)


def test_save_then_start_planned_from_the_folder(tmp_path: Path) -> None:
    data = batches(4)
    _, _, planned, _ = run(fresh(), data, {"memory_limit": "40%", "planner": "lru"})
    planned.save(tmp_path / "plans")
    assert len(json.loads((tmp_path / "plans" / "index.json").read_text())) == 2
    _, _, again, _ = run(fresh(), data, {"memory_limit": "40%", "planner": "lru", "cache": tmp_path / "plans"})
    assert again.log[0].startswith("loaded 2 plan(s)") and again.last == "planned"


def test_bad_arguments_get_one_line() -> None:
    with pytest.raises(AutoPlanError, match="needs a torch.nn.Module"):
        autoplan(lambda x: x, "50%")
    with pytest.raises(AutoPlanError, match="new_shapes"):
        autoplan(fresh(), "50%", new_shapes="sometimes")
    with pytest.raises(ValueError, match="ambiguous|limit"):
        autoplan(fresh(), "0.5")
    model = fresh()
    planned = autoplan(model, "50%", verbose=False)
    with pytest.raises(AutoPlanError, match="already active"):
        with planned.step():
            with planned.step():
                pass


def test_hugging_face_model_called_with_its_batch() -> None:
    transformers = pytest.importorskip("transformers")
    config = transformers.GPT2Config(n_layer=2, n_embd=64, n_head=4, vocab_size=256, n_positions=64)

    def gpt() -> nn.Module:
        torch.manual_seed(0)
        return transformers.GPT2LMHeadModel(config)

    g = torch.Generator().manual_seed(0)
    data = []
    for _ in range(4):
        ids = torch.randint(0, 256, (4, 32), generator=g)
        data.append({"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": ids})

    def loop(model: nn.Module, planned_kwargs: dict | None) -> tuple:
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
        planned = autoplan(model, optimizer=opt, verbose=False, **planned_kwargs) if planned_kwargs else None
        for batch in data:
            with planned.step() if planned is not None else _null():
                loss = model(**batch).loss
                loss.backward()
            opt.step()
            opt.zero_grad()
        return model, opt, planned

    a, oa, _ = loop(gpt(), None)
    b, ob, planned = loop(gpt(), {"memory_limit": "40%", "planner": "sqrt-n"})
    assert_same_state(a, oa, b, ob)
    assert planned.last == "planned" and planned.stats.recompute_removed > 0


def test_hugging_face_trainer_with_the_callback() -> None:
    """A real ``transformers.Trainer`` (accumulation, clipping, a linear schedule with warm-up):
    the callback trains bit-identically to the same Trainer without it, and the planned
    micro-steps, measured with the allocator's timeline, stay under the plan's limit, at the
    simulator's prediction."""
    transformers = pytest.importorskip("transformers")
    pytest.importorskip("accelerate")
    from dqn_swap.meter import AllocatorTimeline
    from dqn_swap.simulator import instant_copy_peak
    from dqn_swap.trainer import AutoPlanCallback

    transformers.logging.set_verbosity_error()
    config = transformers.GPT2Config(n_layer=2, n_embd=64, n_head=4, vocab_size=256, n_positions=64,
                                     bos_token_id=0, eos_token_id=0)
    g = torch.Generator().manual_seed(0)
    data = []
    for _ in range(32):
        ids = torch.randint(0, 256, (32,), generator=g)
        data.append({"input_ids": ids, "labels": ids})

    def train(callback: AutoPlanCallback | None,
              tmp: Path) -> tuple[nn.Module, list[tuple[str, int, int, int]]]:
        torch.manual_seed(0)
        model = transformers.GPT2LMHeadModel(config)
        args = transformers.TrainingArguments(
            output_dir=str(tmp), per_device_train_batch_size=4, max_steps=5, gradient_accumulation_steps=2,
            report_to=[], use_cpu=True, seed=0, save_strategy="no", logging_strategy="no",
            dataloader_num_workers=0, max_grad_norm=1.0, lr_scheduler_type="linear", warmup_steps=1)
        peaks: list[tuple[str, int, int, int]] = []  # (signature, measured, predicted, limit)
        seen: dict[str, int] = {}
        open_timelines: list[AllocatorTimeline] = []

        class Measure(transformers.TrainerCallback):
            """Ends the measurement of a micro-step once the AutoPlanCallback (before it in the list)
            has closed the step.  The step stays open after ``training_step`` returns (through the
            loss bookkeeping and, at the last micro-batch, gradient clipping), so only then do
            ``planned.last`` and ``planned.last_entry`` describe it; read at ``training_step``'s
            return they still describe the micro-step before (the other signature's plan)."""

            def _end(self) -> None:
                if not open_timelines:
                    return
                timeline = open_timelines.pop()
                timeline.__exit__(None, None, None)
                assert callback is not None and callback.planned is not None
                entry = callback.planned.last_entry
                if callback.planned.last != "planned" or entry is None:
                    return
                # On the cpu the runtime's host buffers are the same memory: measure once its pool is
                # filled (each plan's first planned step fills it), as measured_cpu_peak does.
                seen[entry.key] = seen.get(entry.key, 0) + 1
                if seen[entry.key] > 1:
                    plan, trace = entry.plan, entry.trace
                    predicted = instant_copy_peak(trace, plan)
                    peaks.append((entry.description, trace.initial_bytes + timeline.peak, predicted,
                                  plan.memory_limit))

            def on_substep_end(self, *a: object, **k: object) -> None:
                self._end()

            def on_pre_optimizer_step(self, *a: object, **k: object) -> None:
                self._end()

        trainer = transformers.Trainer(model=model, args=args, train_dataset=data,
                                       callbacks=[callback, Measure()] if callback else [])
        step = trainer.training_step

        def measured(*a: object, **k: object) -> object:
            if callback is None or callback.planned is None or not callback.planned.entries:
                return step(*a, **k)
            # From the start of the micro-step to the close of its planned step (Measure._end).
            timeline = AllocatorTimeline().__enter__()
            open_timelines.append(timeline)
            try:
                return step(*a, **k)
            except BaseException:
                open_timelines.pop().__exit__(None, None, None)
                raise

        trainer.training_step = measured
        trainer.train()
        assert not open_timelines
        return model, peaks

    import tempfile

    with tempfile.TemporaryDirectory() as d:
        a, _ = train(None, Path(d))
        callback = AutoPlanCallback("40%", planner="lru")
        b, peaks = train(callback, Path(d))
    for k, v in a.state_dict().items():
        assert torch.equal(v, b.state_dict()[k]), k
    planned = callback.planned
    assert planned is not None and planned.last == "planned"
    entries = list(planned.entries.values())
    assert len(entries) == 2 and all(e.plan.actions for e in entries)  # without and with gradients present
    assert {desc for desc, *_ in peaks} == {e.description for e in entries}, peaks
    for desc, measured, predicted, limit in peaks:  # each planned micro-step against its own plan
        assert measured <= limit, (desc, measured, limit)
        assert abs(measured - predicted) <= 1024, (desc, measured, predicted)


def test_whisper_with_its_defaults_records_in_the_loop() -> None:
    """Whisper called with its defaults makes data-dependent calls (``.item()`` in the library's
    padding and packed-sequence checks) that cannot run on ``meta``; recorded in the loop, they run."""
    transformers = pytest.importorskip("transformers")
    transformers.logging.set_verbosity_error()
    config = transformers.WhisperConfig(
        vocab_size=128, num_mel_bins=16, encoder_layers=2, decoder_layers=2, d_model=64, encoder_attention_heads=4,
        decoder_attention_heads=4, encoder_ffn_dim=128, decoder_ffn_dim=128, max_source_positions=32,
        max_target_positions=32, pad_token_id=0, bos_token_id=1, eos_token_id=2, decoder_start_token_id=1)
    g = torch.Generator().manual_seed(0)
    data = [{"input_features": torch.randn(2, 16, 64, generator=g),
             "labels": torch.randint(3, 128, (2, 12), generator=g)} for _ in range(5)]

    def loop(planned_kwargs: dict | None) -> tuple:
        torch.manual_seed(0)
        model = transformers.WhisperForConditionalGeneration(config)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
        planned = autoplan(model, optimizer=opt, verbose=False, **planned_kwargs) if planned_kwargs else None
        for batch in data:
            with planned.step() if planned is not None else _null():
                model(**batch).loss.backward()
            opt.step()
            opt.zero_grad()
        return model, opt, planned

    a, oa, _ = loop(None)
    b, ob, planned = loop({"memory_limit": "40%", "planner": "lru"})
    assert_same_state(a, oa, b, ob)
    assert planned.last == "planned" and planned.last_entry.plan.actions


def test_a_deep_copy_of_a_planned_model_runs_unplanned_and_the_original_stays_planned() -> None:
    """An EMA or evaluation copy (copy.deepcopy) of a model autoplan is attached to: the copy shares the
    planner, which plans its own model only; the copy trains unplanned and the original stays exact."""
    data = batches(6)

    def loop(planned_on: bool):
        torch.manual_seed(1)
        model = fresh()
        opt = optimizer_of(model)
        planned = autoplan(model, "40%", optimizer=opt, planner="lru", verbose=False) if planned_on else None
        copies, losses = None, []
        for i, batch in enumerate(data):
            with planned.step() if planned is not None else _null():
                out = model(**batch)
                out["loss"].backward()
            losses.append(out["loss"].item())
            opt.step()
            opt.zero_grad()
            if i == 3:  # after the plan is made: the runtime's threads and locks are attached by then
                copies = copy.deepcopy(model), copy.deepcopy(opt)
        return model, opt, planned, copies, losses

    a, oa, _, _, la = loop(False)
    b, ob, planned, (ema, ema_opt), lb = loop(True)
    assert planned.last == "planned" and la == lb
    assert_same_state(a, oa, b, ob)
    steps = planned.steps
    ema(**data[0])["loss"].backward()  # a copy's calls and its optimizer's steps are none of the planner's
    ema_opt.step()
    assert planned.steps == steps and planned.last == "planned"
