"""The network generator: every family builds, trains and records; specs are reproducible; splits by family."""

import pytest
import torch

from dqn_swap.models import build_workload
from dqn_swap.models.corpus import record_corpus, record_spec
from dqn_swap.models.generator import FAMILIES, SPLITS, corpus, family_names, parse_name, sample
from dqn_swap.trace import Trace


def test_splits_partition_the_families_and_hold_out_the_issue_networks():
    by_split = {s: set(family_names(s)) for s in SPLITS}
    assert set().union(*by_split.values()) == set(FAMILIES)
    assert sum(len(v) for v in by_split.values()) == len(FAMILIES)
    assert by_split["test"] == {"inverted_residual_cnn", "vision_transformer", "gru_seq2seq", "wide_residual_cnn",
                                "mlp_mixer"}
    assert len(by_split["validation"]) >= 2 and len(by_split["train"]) >= 5
    with pytest.raises(ValueError, match="unknown split 'dev'"):
        family_names("dev")


def test_a_spec_is_a_function_of_family_and_seed():
    assert sample("mlp_mixer", 3) == sample("mlp_mixer", 3)
    assert len({sample("mlp_mixer", s) for s in range(8)}) == 8
    specs = corpus("test", per_family=2, first_seed=5)
    assert [(s.family, s.seed) for s in specs] == [(f, s) for f in family_names("test") for s in (5, 6)]
    assert all(s.split == "test" and s.name == f"gen:{s.family}:{s.seed}" for s in specs)
    lo, hi = FAMILIES["deep_mlp"].batch
    assert all(lo <= sample("deep_mlp", s).batch_size <= hi for s in range(20))


@pytest.mark.parametrize("name,message", [
    ("gen:mlp_mixer", "gen:FAMILY:SEED"), ("gen:mixer:1", "unknown network family 'mixer'"),
    ("gen:mlp_mixer:x", "gen:FAMILY:SEED"),
])
def test_bad_names_say_the_form(name, message):
    with pytest.raises(ValueError, match=message):
        parse_name(name)
    with pytest.raises(ValueError, match=message):
        build_workload(name, 2)


@pytest.mark.parametrize("family", list(FAMILIES))
def test_every_family_records_on_meta(family):
    """Forward, backward and the optimizer step of every family (shapes checked on meta)."""
    spec = sample(family, 0)
    trace = record_spec(spec, batch_size=2)
    assert trace.meta["family"] == family and trace.meta["split"] == FAMILIES[family].split
    assert trace.meta["profile"] == spec.profile and trace.meta["batch_size"] == 2
    assert trace.n_ops > 20 and trace.minimum_memory <= trace.peak_bytes


@pytest.mark.slow
@pytest.mark.parametrize("family", list(FAMILIES))
def test_every_family_trains_on_cpu(family):
    w = build_workload(sample(family, 0).name, 2, device="cpu")
    opt = w.make_optimizer(w.model.parameters())
    loss = w.loss_fn(w.model(*w.example_inputs))
    loss.backward()
    opt.step()
    assert torch.isfinite(loss) and all(p.grad is not None for p in w.model.parameters() if p.requires_grad)


def test_record_corpus_keeps_what_is_there(tmp_path):
    specs = [sample("deep_mlp", 0), sample("plain_cnn", 1)]
    paths = record_corpus(specs, tmp_path)
    assert [p.name for p in paths] == ["deep_mlp-0.trace", "plain_cnn-1.trace"]
    first = Trace.load(paths[0])
    assert first.meta["model"] == "gen:deep_mlp:0" and first.meta["batch_size"] == specs[0].batch_size
    stamp = paths[0].stat().st_mtime_ns
    record_corpus(specs, tmp_path)
    assert paths[0].stat().st_mtime_ns == stamp  # not recorded again, not overwritten


def test_every_zoo_and_hf_network_has_its_family():
    from dqn_swap.models import HF_NAMES, MODEL_NAMES
    from dqn_swap.models.generator import ZOO_FAMILIES, family_of, split_of

    assert set(ZOO_FAMILIES) == set(MODEL_NAMES) | set(HF_NAMES)
    assert all(f is None or f in FAMILIES for f in ZOO_FAMILIES.values())
    assert split_of("hf:vit") == "test" and split_of("densenet121") == "validation" and split_of("resnet50") == "train"
    assert family_of("gen:mlp_mixer:2") == "mlp_mixer" and split_of("kmeans") is None
    with pytest.raises(ValueError, match="no family is known for 'alexnet'"):
        family_of("alexnet")
