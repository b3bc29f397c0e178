"""MODEL[:BATCH] names of every kind: the zoo, Hugging Face models (their names hold a colon) and
generated networks (their own batch unless one is given)."""

from __future__ import annotations

import pytest

from dqn_swap.models import split_model_spec


@pytest.mark.parametrize("spec, want", [
    ("resnet18:32", ("resnet18", 32)),
    ("resnet18", ("resnet18", None)),
    ("hf:gpt2", ("hf:gpt2", None)),
    ("hf:gpt2:8", ("hf:gpt2", 8)),
    ("hf:configs/llama-8l:16", ("hf:configs/llama-8l", 16)),
    ("gen:mlp_mixer:3", ("gen:mlp_mixer:3", None)),
    ("gen:mlp_mixer:3:16", ("gen:mlp_mixer:3", 16)),
])
def test_model_specs_split_into_name_and_batch(spec, want):
    assert split_model_spec(spec) == want


@pytest.mark.parametrize("spec", ["resnet18:x", "resnet18:0", "gen:mlp_mixer:3:-1", "resnet18:99999999999"])
def test_a_bad_batch_is_one_line_naming_the_form(spec):
    with pytest.raises(ValueError, match="batch size after ':'"):
        split_model_spec(spec)


def test_hugging_face_and_generated_specs_record():
    from dqn_swap.agents.dqn.report import load_trace_spec
    from dqn_swap.models.generator import sample

    pytest.importorskip("transformers")
    hf = load_trace_spec("hf:gpt2:2")
    assert hf.meta["model"] == "hf:gpt2" and hf.meta["batch_size"] == 2
    gen = load_trace_spec("gen:deep_mlp:0")
    spec = sample("deep_mlp", 0)
    assert gen.meta["batch_size"] == spec.batch_size and gen.meta["model"] == "gen:deep_mlp:0"


def test_a_generated_network_at_another_batch_keeps_its_seed_and_profile():
    from dqn_swap.agents.dqn.report import load_trace_spec
    from dqn_swap.models.corpus import record_spec
    from dqn_swap.models.generator import sample

    spec = sample("deep_mlp", 1)
    got = load_trace_spec(f"gen:deep_mlp:1:{spec.batch_size + 1}")
    want = record_spec(spec, batch_size=spec.batch_size + 1)
    assert got.fingerprint == want.fingerprint and got.meta["profile"] == spec.profile
