"""Planned training reports where users look: the ``Trainer``'s log history and TensorBoard, and
``autoplan(..., tensorboard=FOLDER)`` in a loop of one's own."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from dqn_swap.integrations import AutoPlanError, autoplan

from .test_autoplan import DictNet, batches, optimizer_of


def _scalars(folder: Path) -> dict[str, list[tuple[int, float]]]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(folder))
    acc.Reload()
    return {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}


def test_autoplan_writes_its_figures_to_tensorboard(tmp_path: Path) -> None:
    torch.manual_seed(0)
    model = DictNet()
    opt = optimizer_of(model)
    planned = autoplan(model, "40%", planner="lru", optimizer=opt, verbose=False,
                       tensorboard=tmp_path / "tb", log_every=2)
    for batch in batches(6):
        with planned.step():
            model(**batch)["loss"].backward()
        opt.step()
        opt.zero_grad()
    figures = planned.figures()
    planned.remove()
    assert planned.last == "planned"
    assert figures["dqn_swap/steps"] == 6 and figures["dqn_swap/plans"] == 1
    assert figures["dqn_swap/planned_peak_bytes"] <= figures["dqn_swap/memory_limit_bytes"]
    assert figures["dqn_swap/predicted_overhead"] >= 0
    scalars = _scalars(tmp_path / "tb")
    assert [s for s, _ in scalars["dqn_swap/steps"]] == [2, 4, 6, 6]  # every 2 steps, and at remove()
    assert scalars["dqn_swap/memory_limit_bytes"][-1][1] == pytest.approx(figures["dqn_swap/memory_limit_bytes"])
    with pytest.raises(AutoPlanError, match="log_every"):
        autoplan(DictNet(), "40%", log_every=0)


def test_the_trainer_callback_logs_the_planned_figures_into_the_log_history_and_tensorboard(tmp_path: Path) -> None:
    transformers = pytest.importorskip("transformers")
    pytest.importorskip("accelerate")
    from dqn_swap.trainer import AutoPlanCallback

    transformers.logging.set_verbosity_error()
    config = transformers.GPT2Config(n_layer=2, n_embd=32, n_head=2, vocab_size=128, n_positions=32,
                                     bos_token_id=0, eos_token_id=0)
    g = torch.Generator().manual_seed(0)
    data = [{"input_ids": ids, "labels": ids} for ids in (torch.randint(0, 128, (16,), generator=g) for _ in range(24))]
    torch.manual_seed(0)
    args = transformers.TrainingArguments(
        output_dir=str(tmp_path), per_device_train_batch_size=4, max_steps=6, report_to=["tensorboard"],
        logging_steps=2, use_cpu=True, seed=0, save_strategy="no",
        dataloader_num_workers=0)
    callback = AutoPlanCallback("40%", planner="lru")
    trainer = transformers.Trainer(model=transformers.GPT2LMHeadModel(config), args=args, train_dataset=data,
                                   callbacks=[callback])
    trainer.train()
    logged = [h for h in trainer.state.log_history if "dqn_swap/plans" in h]
    assert len(logged) >= 3  # steps 2, 4, 6 and the closing summary
    assert any("loss" in h for h in logged)  # beside the trainer's own figures, in the same entries
    last = logged[-1]
    assert last["dqn_swap/plans"] >= 1 and last["dqn_swap/steps"] == 6
    assert last["dqn_swap/planned_peak_bytes"] <= last["dqn_swap/memory_limit_bytes"]
    assert "dqn_swap/predicted_overhead" in last
    folder = Path(getattr(args, "logging_dir", None) or tmp_path / "runs")
    scalars = _scalars(folder / "dqn_swap")
    assert [s for s, _ in scalars["train/dqn_swap/plans"]][:3] == [2, 4, 6]
