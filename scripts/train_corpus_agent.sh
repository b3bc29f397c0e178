#!/usr/bin/env bash
# Train an agent on the whole training corpus from nothing, one command on the CPU.  It is not the
# shipped agent (checkpoints/default.pt): docs/learning.md, "Expert iteration", compares the two.
#
# Corpus: two generated networks of each of the generator's 10 training families
# (dqn_swap/models/generator.py; each at its own batch size, device profile and precision) and
# six zoo networks (the comparison grid's ResNet-50 b64, VGG-16 b64, U-Net b8 and GPT b8, plus
# LSTM-20 b64 and ResNet-18 b32, profile v100-pcie3), each at 90/70/50/30 % of the way from its
# minimum memory to its peak: 104 cells.  Never trained on: the validation families (dense and
# inception CNNs, BERT-style encoders, audio encoders, graph networks) and the test families
# (inverted-residual, wide residual and squeeze-excitation CNNs, vision transformers, GRU
# sequence-to-sequence models, MLP-mixers, Hugging Face encoder-decoders), nor the grid's
# 100-step LSTM b64.
#
# Learning: expert iteration (docs/learning.md, "Expert iteration"): DQfD demonstrations that
# start as the best baseline's plan polished by local search and are improved every 2,000 steps
# by dqn-search with the agent's own Q, plus the greedy agent's own states labelled by them
# (demo_dagger); 3,000 pre-training updates, three quarters of every mini-batch from the
# demonstrations, learning rate 5e-4, 12,000 steps, one thread.
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
OMP_NUM_THREADS=1 "$PY" -m dqn_swap train $gen resnet50:64 vgg16:64 unet:8 gpt:8 lstm_short:64 resnet18:32 \
    --memory-limits 90%,70%,50%,30% --steps 12000 --threads 1 \
    --set demonstrations=best-baseline --set demo_pretrain_steps=3000 --set demo_fraction=0.75 \
    --set demo_improve=polish --set demo_dagger=True --set demo_improve_every=2000 --set eval_every=2000 \
    --set learning_rate=5e-4 -o "$out" --curve "${out%.pt}.png"
