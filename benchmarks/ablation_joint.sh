#!/usr/bin/env bash
# The shipped ensemble fine-tuned as a whole: the mean of checkpoints/ensemble.pt's ten agents'
# Q-values is the network trained (dqn-swap finetune --from an ensemble file), on two networks of
# each of the generator's 10 training families at 90/70/50/30 % (80 cells), with the shipped
# ensembles' plan of every cell decoded by members (demo_teacher) as one more candidate
# demonstration beside the baselines'. Two arms: expert iteration as the agents were trained
# (the demonstrations polished, improved by the lookahead and DAgger every 1,000 steps; 3,000
# steps) and the demonstrations alone, never improved (5,000 steps); both pre-train 1,000 steps on
# the demonstrations. The fine-tuned ensembles then plan alone and in one pass on the validation
# families' 40 cells and the test families' 56 cells, against the shipped ensemble:
#
#   bash benchmarks/ablation_joint.sh [OUT_DIR]      (default runs/ablation_expert)
#
# writes OUT_DIR/joint_{expert,demos}.pt and benchmarks/results/generalization_{validation,test}_joint.{json,md}.
# 81-84 minutes of one core per arm (2-core Intel Xeon @ 2.50 GHz, the two arms side by side).
default_out=runs/ablation_expert
# shellcheck source=benchmarks/ablation_common.sh
source "$(dirname "$0")/ablation_common.sh"
gen2=$(networks train 2)
common=(--from checkpoints/ensemble.pt --threads 1 --log-dir none --force --set demo_pretrain_steps=1000
        --set eval_every=1000 --set demo_teacher=checkpoints/ensemble.pt,checkpoints/ensemble_groups.pt)
# shellcheck disable=SC2086  # $gen2 is a list of names
"$PY" -m dqn_swap finetune $gen2 "${common[@]}" --steps 3000 --set demo_improve_every=1000 \
    -o "$out/joint_expert.pt" &
expert=$!
"$PY" -m dqn_swap finetune $gen2 "${common[@]}" --steps 5000 --set demo_improve=none --set demo_improve_every=0 \
    --set demo_dagger=False -o "$out/joint_demos.pt" &
demos=$!
wait "$expert"
wait "$demos"
arms=(shipped=checkpoints/ensemble.pt joint-expert="$out/joint_expert.pt" joint-demos="$out/joint_demos.pt")
"$PY" benchmarks/bench_generalization.py --split validation --per-family 2 --agents "${arms[@]}" \
    --reuse benchmarks/results/generalization_validation_ablation.json \
    --json benchmarks/results/generalization_validation_joint.json \
    --md benchmarks/results/generalization_validation_joint.md
"$PY" benchmarks/bench_generalization.py --split test --per-family 2 --agents "${arms[@]}" \
    --reuse benchmarks/results/generalization_test.json --best-known benchmarks/results/best_known.json --keep-table \
    --json benchmarks/results/generalization_test_joint.json \
    --md benchmarks/results/generalization_test_joint.md
