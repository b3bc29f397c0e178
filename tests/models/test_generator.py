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
                                "mlp_mixer", "se_cnn", "hf_seq2seq"}
    assert {"grouped_cnn", "video_cnn", "hf_decoder"} <= by_split["train"]
    assert {"inception_cnn", "audio_encoder", "graph_network"} <= by_split["validation"]
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
def test_every_family_records(family):
    """Forward, backward and the optimizer step of every family (shapes checked on meta, or run on the
    CPU where the spec records there)."""
    spec = sample(family, 0)
    trace = record_spec(spec, batch_size=2)
    assert trace.meta["family"] == family and trace.meta["split"] == FAMILIES[family].split
    assert trace.meta["profile"] == spec.profile and trace.meta["batch_size"] == 2
    assert trace.meta["device"] == spec.record_device
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


# --------------------------------------------------------------------------- the newer families
NEW_FAMILIES = ("se_cnn", "hf_seq2seq", "grouped_cnn", "video_cnn", "hf_decoder", "inception_cnn", "audio_encoder",
                "graph_network")
TRANSFORMERS = ("hf_seq2seq", "hf_decoder", "audio_encoder")


def test_existing_families_draw_what_they_drew():
    """Families added later do not change the specs of earlier ones (agents and results name them)."""
    assert sample("mlp_mixer", 3) == sample("mlp_mixer", 3)
    assert sample("mlp_mixer", 3).config() == {"image": 96, "patch": 8, "layers": 6, "channels": 320,
                                               "token_hidden": 256, "channel_hidden": 640, "classes": 1000}
    spec = sample("residual_cnn", 0)
    assert (spec.batch_size, spec.profile) == (8, "v100-pcie3")
    assert spec.config() == {"block": "basic", "blocks": (2, 1, 1, 1), "width": 64, "image": 32, "classes": 100}
    assert list(FAMILIES)[:14] == ["plain_cnn", "residual_cnn", "bottleneck_cnn", "encoder_decoder_cnn",
                                   "decoder_transformer", "recurrent_lm", "deep_mlp", "dense_cnn", "text_encoder",
                                   "inverted_residual_cnn", "vision_transformer", "gru_seq2seq",
                                   "wide_residual_cnn", "mlp_mixer"]


@pytest.mark.parametrize("family", NEW_FAMILIES)
def test_new_families_sample_reproducibly_within_their_ranges(family):
    specs = [sample(family, s) for s in range(12)]
    assert specs == [sample(family, s) for s in range(12)]
    assert len({s.sizes for s in specs}) >= 10
    lo, hi = FAMILIES[family].batch
    assert all(lo <= s.batch_size <= hi for s in specs)
    if family in TRANSFORMERS:
        assert {s.config()["bf16"] for s in specs} == {True, False}
        assert all(s.record_device == ("cpu" if s.config()["bf16"] else "meta") for s in specs)
    elif family == "graph_network":
        assert all(s.record_device == "cpu" for s in specs)
    else:
        assert all(s.record_device == "meta" and "bf16" not in s.config() for s in specs)


@pytest.mark.parametrize("family", NEW_FAMILIES)
def test_new_families_record_at_their_own_batch(family):
    """Seed 1 at its own batch size: a few hundred to a few thousand ops, on the spec's device."""
    spec = sample(family, 1)
    trace = record_spec(spec)
    assert trace.meta["device"] == spec.record_device and trace.meta["batch_size"] == spec.batch_size
    assert 100 < trace.n_ops < 5000 and 0 < trace.minimum_memory <= trace.peak_bytes


def test_se_cnn_drops_paths_per_sample_and_records_the_same_trace_each_time():
    spec = sample("se_cnn", 0)
    first, second = record_spec(spec, batch_size=4), record_spec(spec, batch_size=4)
    assert (first.n_ops, first.peak_bytes, first.minimum_memory) == (second.n_ops, second.peak_bytes,
                                                                     second.minimum_memory)
    labels = [first.op_label(i) for i in range(first.n_ops)]
    draws = [label for label in labels if "aten.rand " in label and "forward" in label]
    assert len(draws) == sum(spec.config()["blocks"])  # every block survives with p < 1: each draws its mask


def test_drop_path_keeps_whole_samples_and_scales_them():
    from dqn_swap.models.cnn_families import drop_path

    torch.manual_seed(0)
    x = torch.ones(400, 3, 2, 2)
    y = drop_path(x, 0.75, training=True)
    per_sample = y.flatten(1)
    assert torch.all((per_sample == 0).all(1) | (per_sample == 1 / 0.75).all(1))
    assert 0.6 < float((per_sample[:, 0] > 0).float().mean()) < 0.9
    assert torch.equal(drop_path(x, 0.75, training=False), x)


def test_bf16_networks_record_under_autocast_on_the_cpu():
    pytest.importorskip("transformers")
    spec = next(sample("hf_decoder", s) for s in range(20) if sample("hf_decoder", s).config()["bf16"])
    trace = record_spec(spec, batch_size=2)
    dtypes = {d for d, _ in trace.saved_signatures}
    assert trace.meta["device"] == "cpu" and "bfloat16" in dtypes and "float32" in dtypes
    w = build_workload(spec.name, 2, device="meta")
    with pytest.raises(ValueError, match="bfloat16 autocast does not act on meta tensors"):
        w.model(*w.example_inputs)


def test_hf_families_need_transformers(monkeypatch):
    import sys

    monkeypatch.setitem(sys.modules, "transformers", None)
    with pytest.raises(ValueError, match="need the transformers package"):
        build_workload(sample("hf_seq2seq", 0).name, 2)


def test_hf_seq2seq_is_an_encoder_decoder_with_cross_attention():
    pytest.importorskip("transformers")
    kinds = {}
    for seed in range(12):
        spec = sample("hf_seq2seq", seed)
        kinds.setdefault(spec.config()["kind"], spec)
    assert set(kinds) == {"t5", "bart", "marian"}
    for kind, spec in kinds.items():
        w = build_workload(spec.name, 2, device="meta")
        hf = w.model.model if hasattr(w.model, "input_name") else w.model.model.model
        assert hf.config.is_encoder_decoder and hf.config.model_type == kind
        assert any("EncDecAttention" in n or "encoder_attn" in n for n, _ in hf.named_modules())


def test_random_graphs_keep_edges_inside_their_graph():
    from dqn_swap.models.graph import random_graphs

    gen = torch.Generator().manual_seed(0)
    edges = random_graphs(3, 50, 200, lambda high, *shape: torch.randint(high, shape, generator=gen))
    assert edges.shape == (2, 600)
    graph = torch.arange(3).repeat_interleave(200)
    assert torch.equal(edges[0] // 50, graph) and torch.equal(edges[1] // 50, graph)


def test_hf_decoders_of_the_zoo_are_of_the_hf_decoder_family():
    from dqn_swap.models.generator import split_of

    assert split_of("hf:gpt2") == split_of("hf:llama") == "train"
    assert FAMILIES["hf_decoder"].split == "train"
