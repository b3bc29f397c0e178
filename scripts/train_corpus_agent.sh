#!/usr/bin/env bash
# Train the corpus agent from nothing, one command on the CPU: the candidate to replace the
# shipped checkpoints/default.pt (it has not yet: README, "Learning plans", says why).
# Measured: 1,944 s on one core of the 2-core machine (runs/ship/v2.pt; that run read the
# ResNet-50 trace recorded before module names were made deterministic: same ops, sizes
# and costs, and the same plans, another fingerprint).
#
# Corpus: two generated networks of each of the generator's 7 training families
# (dqn_swap/models/generator.py; each at its own batch size and device profile) and six zoo
# networks (the comparison grid's ResNet-50 b64, VGG-16 b64, U-Net b8 and GPT b8, plus
# LSTM-20 b64 and ResNet-18 b32, profile v100-pcie3), each at 90/70/50/30 % of the way
# from its minimum memory to its peak: 80 cells.  Never trained on: the validation
# families (dense_cnn, text_encoder) and the test families (inverted_residual_cnn,
# vision_transformer, gru_seq2seq, wide_residual_cnn, mlp_mixer), the grid's LSTM b64.
#
# Learning: DQfD demonstrations (the best baseline's replayed plan per cell, 3,000
# pre-training updates, half of every mini-batch, large-margin loss), improved during
# training by the dqn-search lookahead with the agent's own Q (demo_improve=search),
# learning rate 5e-4, 60,000 steps, one thread.  See checkpoints/README.md for the time
# it scores.
#
#   bash scripts/train_corpus_agent.sh [OUTPUT]     (default runs/corpus_agent.pt)
set -euo pipefail
cd "$(dirname "$0")/.."
PY=.venv/bin/python
[[ -n "${VIRTUAL_ENV:-}" ]] && PY=python
out="${1:-runs/corpus_agent.pt}"
mkdir -p "$(dirname "$out")"
gen=$("$PY" -c "from dqn_swap.models.generator import corpus
print(' '.join(s.name for s in sorted(corpus('train', 2), key=lambda s: (s.family, s.seed))))")
# shellcheck disable=SC2086  # $gen is a list of names
"$PY" -m dqn_swap train $gen resnet50:64 vgg16:64 unet:8 gpt:8 lstm_short:64 resnet18:32 \
    --memory-limits 90%,70%,50%,30% --steps 60000 --threads 1 \
    --set demonstrations=best-baseline --set demo_pretrain_steps=3000 --set demo_fraction=0.5 \
    --set demo_improve=search --set learning_rate=5e-4 --set eval_every=5000 \
    -o "$out" --curve "${out%.pt}.png"
