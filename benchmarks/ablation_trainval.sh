#!/usr/bin/env bash
# Corpus breadth in families: the recipe of checkpoints/ensemble.pt's agents (expert iteration,
# 24,000 steps, one network a family at 90/70/50/30 %; benchmarks/ablation_expert.sh), trained on
# the generator's 10 training families and its 5 validation families together (60 cells), four
# seeds reading columns 0-10 and four reading swap_slack. Their ensembles then plan alone and in one
# pass on the test families' 56 cells and on the comparison grid's 20, against ensembles of as many
# of the shipped ensemble's own agents (trained on the 10 training families alone), which this
# script takes out of checkpoints/ensemble.pt. The validation families are training families
# here, so only the test families and the grid are unseen by both sides:
#
#   bash benchmarks/ablation_trainval.sh [OUT_DIR]      (default runs/trainval)
#
# writes OUT_DIR/*.pt, benchmarks/results/generalization_test_trainval.{json,md} and
# benchmarks/results/dqn_grid_{train,trainval}8.{json,md}.
# 19-25 minutes of one core an agent (2-core Intel Xeon @ 2.50 GHz, two agents side by side).
default_out=runs/trainval
# shellcheck source=benchmarks/ablation_common.sh
source "$(dirname "$0")/ablation_common.sh"
tv="$(networks train 1) $(networks validation 1)"
common=(--memory-limits 90%,70%,50%,30% --steps 24000 --threads 1 --log-dir none --force
        --set demonstrations=best-baseline --set demo_pretrain_steps=2000 --set learning_rate=5e-4
        --set eval_every=2000 --set demo_improve=polish --set demo_dagger=True --set demo_improve_every=2000
        --set demo_fraction=0.75)
for seed in 0 1 2 3; do
  # shellcheck disable=SC2086  # $tv is a list of names
  "$PY" -m dqn_swap train $tv "${common[@]}" --seed $seed -o "$out/expert_s$seed.pt" &
  expert=$!
  "$PY" -m dqn_swap train $tv "${common[@]}" --seed $seed --set swap_slack=True -o "$out/slack_s$seed.pt" &
  slack=$!
  wait "$expert"  # each by its pid, so that a failed run stops the script (set -e)
  wait "$slack"
done
# the shipped ensemble's agents, one agent file each (expert_24k, expert_24k_s1..s5, slack_24k_s0..s3)
"$PY" - "$out" <<'EOF'
import sys, torch
e = torch.load("checkpoints/ensemble.pt", weights_only=True)
names = ["shipped_e0", "shipped_e1", "shipped_e2", "shipped_e3", "shipped_e4", "shipped_e5",
         "shipped_s0", "shipped_s1", "shipped_s2", "shipped_s3"]
for name, member in zip(names, e["members"]):
    torch.save(member, f"{sys.argv[1]}/{name}.pt")
EOF
train4=$(plus shipped_e0 shipped_e1 shipped_s0 shipped_s1)
tv4=$(plus expert_s0 expert_s1 slack_s0 slack_s1)
train8=$(plus shipped_e{0,1,2,3} shipped_s{0,1,2,3})
tv8=$(plus expert_s{0,1,2,3} slack_s{0,1,2,3})
"$PY" benchmarks/bench_generalization.py --split test --per-family 2 \
    --agents shipped=checkpoints/ensemble.pt train4="$train4" trainval4="$tv4" train8="$train8" trainval8="$tv8" \
    --reuse benchmarks/results/generalization_test.json --best-known benchmarks/results/best_known.json \
    --json benchmarks/results/generalization_test_trainval.json \
    --md benchmarks/results/generalization_test_trainval.md
"$PY" benchmarks/bench_dqn.py grid --tolerance 1e-3 --threads 1 --default-agent "$train8" \
    --json benchmarks/results/dqn_grid_train8.json --md benchmarks/results/dqn_grid_train8.md
"$PY" benchmarks/bench_dqn.py grid --tolerance 1e-3 --threads 1 --default-agent "$tv8" \
    --json benchmarks/results/dqn_grid_trainval8.json --md benchmarks/results/dqn_grid_trainval8.md
