#!/usr/bin/env bash
# The learning ablation on the validation families: how the agent is taught (TD learning with the
# best baseline's demonstrations improved by the lookahead, against expert iteration with the whole
# dqn-search as the teacher and the student's own states labelled), how wide its training corpus is,
# and how wide its network is.  Every arm trains 6,000 steps (the 24k arm 24,000), seed 0, one thread; all but the narrow
# arm on one network of each of the generator's 10 training families at 90/70/50/30 % (40 cells).
# The narrow arm trains on the five zoo networks the first shipped agent saw (20 cells); the
# cross-entropy arm imitates by cross-entropy over the valid actions instead of the margin; the 24k arm
# trains four times as long, with six seeds, and on the corpus of scripts/train_corpus_agent.sh
# (two networks a family and six zoo networks).  The chains arms offer every removal the simulator allows
# (recompute_chains=True), without which the environment cannot reach the best plans known
# (benchmarks/bench_env_ceiling.py), two seeds each with the candidates graph and with the dataflow
# graph (graph=dataflow: a removal joined to the inputs it re-runs); then the chains arm trained
# longer, on two and four networks a family, and TD learning with it.  The groups3 arm offers
# removals in groups of up to three linked tensors (max_chain=3, chains otherwise off), four seeds;
# the slack arm reads the observation's swap_slack column (swap_slack=True), six seeds; the g3slack arm
# does both, eight seeds.  The distilled arms fine-tune each agent of checkpoints/ensemble.pt and
# of checkpoints/ensemble_groups.pt for 6,000 steps on two networks a family, with the plan of the
# shipped ensembles decoded by members as one more candidate demonstration (demo_teacher).  The agents
# are then planned, alone and in one pass, on two networks of each validation family at four limits
# (40 cells), beside the shipped agent, and on the test families' 56 cells against the best plans
# known.  The ensemble arms (A+B...) decode the mean of their agents' Q-values (QEnsemble); the six
# seeds of the 24k arm and the first four of the slack arm together are checkpoints/ensemble.pt.  The
# members: arms decode an ensemble by members (the mean's plan and each agent's own, the fastest
# simulated kept; DQNPlanner's members=True, dqn-swap plan --members); after '|', more agent files
# decoded the same way in their own environments (checkpoints/ensemble_groups.pt: the g3slack seeds):
#
#   bash benchmarks/ablation_expert.sh [OUT_DIR]      (default runs/ablation_expert)
#
# writes OUT_DIR/*.pt and benchmarks/results/generalization_{validation,test}_ablation.{json,md}.
default_out=runs/ablation_expert
# shellcheck source=benchmarks/ablation_common.sh
source "$(dirname "$0")/ablation_common.sh"
gen=$(networks train 1)
gen2=$(networks train 2)
gen4=$(networks train 4)
zoo="resnet_tiny:8 gpt_tiny:4 resnet18:32 lstm_short:64 resnet50:64"
corpus="$("$PY" -c "from dqn_swap.models.generator import corpus
print(' '.join(s.name for s in sorted(corpus('train', 2), key=lambda s: (s.family, s.seed))))")
resnet50:64 vgg16:64 unet:8 gpt:8 lstm_short:64 resnet18:32"  # scripts/train_corpus_agent.sh's networks
common=(--memory-limits 90%,70%,50%,30% --steps 6000 --threads 1 --set demonstrations=best-baseline
        --set demo_pretrain_steps=2000 --set learning_rate=5e-4 --set eval_every=2000 --force)
expert=(--set demo_improve=polish --set demo_dagger=True --set demo_improve_every=2000 --set demo_fraction=0.75)
# shellcheck disable=SC2086  # $gen and $zoo are lists of names
{
  "$PY" -m dqn_swap train $gen "${common[@]}" --set demo_improve=search --set demo_fraction=0.5 -o "$out/td_search.pt"
  "$PY" -m dqn_swap train $gen "${common[@]}" "${expert[@]}" -o "$out/expert.pt"
  "$PY" -m dqn_swap train $zoo "${common[@]}" "${expert[@]}" -o "$out/expert_narrow.pt"
  "$PY" -m dqn_swap train $gen "${common[@]}" "${expert[@]}" --set p=64 -o "$out/expert_p64.pt"
  "$PY" -m dqn_swap train $gen "${common[@]}" "${expert[@]}" --set demo_loss=cross_entropy -o "$out/expert_ce.pt"
  "$PY" -m dqn_swap train $gen "${common[@]}" "${expert[@]}" --steps 24000 -o "$out/expert_24k.pt"
  "$PY" -m dqn_swap train $gen "${common[@]}" "${expert[@]}" --steps 24000 --seed 1 -o "$out/expert_24k_s1.pt"
  for seed in 2 3 4 5; do  # the seed's spread, and the members of checkpoints/ensemble.pt
    "$PY" -m dqn_swap train $gen "${common[@]}" "${expert[@]}" --steps 24000 --seed $seed -o "$out/expert_24k_s$seed.pt"
  done
  "$PY" -m dqn_swap train $corpus "${common[@]}" "${expert[@]}" --steps 24000 -o "$out/corpus_24k.pt"
  chains=(--set recompute_chains=True)
  for seed in 0 1; do
    "$PY" -m dqn_swap train $gen "${common[@]}" "${expert[@]}" "${chains[@]}" --seed $seed -o "$out/chains_s$seed.pt"
    "$PY" -m dqn_swap train $gen "${common[@]}" "${expert[@]}" "${chains[@]}" --seed $seed --set graph=dataflow \
        -o "$out/dataflow_s$seed.pt"
  done
  "$PY" -m dqn_swap train $gen "${common[@]}" "${expert[@]}" "${chains[@]}" --steps 24000 -o "$out/chains_24k.pt"
  "$PY" -m dqn_swap train $gen2 "${common[@]}" "${expert[@]}" "${chains[@]}" --steps 12000 -o "$out/chains_2pf.pt"
  "$PY" -m dqn_swap train $gen2 "${common[@]}" "${expert[@]}" "${chains[@]}" --steps 12000 --set graph=dataflow \
      -o "$out/dataflow_2pf.pt"
  "$PY" -m dqn_swap train $gen4 "${common[@]}" "${expert[@]}" "${chains[@]}" --steps 16000 -o "$out/chains_4pf.pt"
  "$PY" -m dqn_swap train $gen "${common[@]}" "${chains[@]}" --set demo_improve=search --set demo_fraction=0.5 \
      -o "$out/td_search_chains.pt"
  for seed in 0 1 2 3; do  # removals in groups of up to three linked tensors
    "$PY" -m dqn_swap train $gen "${common[@]}" "${expert[@]}" --set max_chain=3 --steps 24000 --seed $seed \
        -o "$out/groups3_24k_s$seed.pt"
  done
  for seed in 0 1 2 3 4 5; do  # the swap_slack column read
    "$PY" -m dqn_swap train $gen "${common[@]}" "${expert[@]}" --set swap_slack=True --steps 24000 --seed $seed \
        -o "$out/slack_24k_s$seed.pt"
  done
  for seed in 0 1 2 3 4 5 6 7; do  # both: removals in groups of up to three, and the swap_slack column
    "$PY" -m dqn_swap train $gen "${common[@]}" "${expert[@]}" --set swap_slack=True --set max_chain=3 --steps 24000 \
        --seed $seed -o "$out/g3slack_24k_s$seed.pt"
  done
  # distillation: each agent of checkpoints/ensemble.pt fine-tuned (6,000 steps, two networks a family) with
  # the shipped ensembles' plan decoded by members as one more candidate demonstration of every cell
  for m in expert_24k expert_24k_s1 expert_24k_s2 expert_24k_s3 expert_24k_s4 expert_24k_s5 \
           slack_24k_s0 slack_24k_s1 slack_24k_s2 slack_24k_s3; do
    "$PY" -m dqn_swap finetune $gen2 --from "$out/$m.pt" --steps 6000 --threads 1 --log-dir none --force \
        --set demo_teacher=checkpoints/ensemble.pt,checkpoints/ensemble_groups.pt -o "$out/distill_$m.pt"
  done
  for seed in 0 1 2 3; do  # and the g3slack seeds of checkpoints/ensemble_groups.pt, the same way
    "$PY" -m dqn_swap finetune $gen2 --from "$out/g3slack_24k_s$seed.pt" --steps 6000 --threads 1 --log-dir none \
        --force --set demo_teacher=checkpoints/ensemble.pt,checkpoints/ensemble_groups.pt \
        -o "$out/distill_g3slack_24k_s$seed.pt"
  done
}
arms=(shipped=checkpoints/default.pt td+search-demos="$out/td_search.pt" expert="$out/expert.pt"
      expert-narrow="$out/expert_narrow.pt" expert-p64="$out/expert_p64.pt" expert-ce="$out/expert_ce.pt"
      expert-24k="$out/expert_24k.pt" expert-24k-s1="$out/expert_24k_s1.pt" expert-24k-s2="$out/expert_24k_s2.pt"
      expert-24k-s3="$out/expert_24k_s3.pt" expert-24k-s4="$out/expert_24k_s4.pt" expert-24k-s5="$out/expert_24k_s5.pt"
      corpus-24k="$out/corpus_24k.pt"
      chains="$out/chains_s0.pt" chains-s1="$out/chains_s1.pt"
      dataflow="$out/dataflow_s0.pt" dataflow-s1="$out/dataflow_s1.pt" chains-24k="$out/chains_24k.pt"
      chains-2pf="$out/chains_2pf.pt" dataflow-2pf="$out/dataflow_2pf.pt" chains-4pf="$out/chains_4pf.pt"
      td+search-demos-chains="$out/td_search_chains.pt"
      ensemble-24k="$out/expert_24k.pt+$out/expert_24k_s1.pt"
      ensemble-24k+expert="$out/expert_24k.pt+$out/expert_24k_s1.pt+$out/expert.pt"
      ensemble-shipped+24k="checkpoints/default.pt+$out/expert_24k.pt+$out/expert_24k_s1.pt"
      ensemble-chains="$out/chains_s0.pt+$out/chains_s1.pt" ensemble-dataflow="$out/dataflow_s0.pt+$out/dataflow_s1.pt"
      ensemble-24k-4seeds="$out/expert_24k.pt+$out/expert_24k_s1.pt+$out/expert_24k_s2.pt+$out/expert_24k_s3.pt"
      ensemble-24k-s2-s5="$out/expert_24k_s2.pt+$out/expert_24k_s3.pt+$out/expert_24k_s4.pt+$out/expert_24k_s5.pt"
      ensemble-24k-6seeds="$out/expert_24k.pt+$out/expert_24k_s1.pt+$out/expert_24k_s2.pt+$out/expert_24k_s3.pt+$out/expert_24k_s4.pt+$out/expert_24k_s5.pt"
      groups3-s0="$out/groups3_24k_s0.pt" groups3-s1="$out/groups3_24k_s1.pt" groups3-s2="$out/groups3_24k_s2.pt"
      groups3-s3="$out/groups3_24k_s3.pt"
      ensemble-groups3-4seeds="$out/groups3_24k_s0.pt+$out/groups3_24k_s1.pt+$out/groups3_24k_s2.pt+$out/groups3_24k_s3.pt"
      slack-s0="$out/slack_24k_s0.pt" slack-s1="$out/slack_24k_s1.pt" slack-s2="$out/slack_24k_s2.pt"
      slack-s3="$out/slack_24k_s3.pt" slack-s4="$out/slack_24k_s4.pt" slack-s5="$out/slack_24k_s5.pt"
      ensemble-slack-6seeds="$out/slack_24k_s0.pt+$out/slack_24k_s1.pt+$out/slack_24k_s2.pt+$out/slack_24k_s3.pt+$out/slack_24k_s4.pt+$out/slack_24k_s5.pt"
      ensemble-24k-6seeds+slack-4seeds="$out/expert_24k.pt+$out/expert_24k_s1.pt+$out/expert_24k_s2.pt+$out/expert_24k_s3.pt+$out/expert_24k_s4.pt+$out/expert_24k_s5.pt+$out/slack_24k_s0.pt+$out/slack_24k_s1.pt+$out/slack_24k_s2.pt+$out/slack_24k_s3.pt"
      ensemble-24k-6seeds+slack-6seeds="$out/expert_24k.pt+$out/expert_24k_s1.pt+$out/expert_24k_s2.pt+$out/expert_24k_s3.pt+$out/expert_24k_s4.pt+$out/expert_24k_s5.pt+$out/slack_24k_s0.pt+$out/slack_24k_s1.pt+$out/slack_24k_s2.pt+$out/slack_24k_s3.pt+$out/slack_24k_s4.pt+$out/slack_24k_s5.pt"
      g3slack-s0="$out/g3slack_24k_s0.pt" g3slack-s1="$out/g3slack_24k_s1.pt" g3slack-s2="$out/g3slack_24k_s2.pt"
      g3slack-s3="$out/g3slack_24k_s3.pt"
      ensemble-g3slack-4seeds="$out/g3slack_24k_s0.pt+$out/g3slack_24k_s1.pt+$out/g3slack_24k_s2.pt+$out/g3slack_24k_s3.pt"
      ensemble-groups3+g3slack="$out/groups3_24k_s0.pt+$out/groups3_24k_s1.pt+$out/groups3_24k_s2.pt+$out/groups3_24k_s3.pt+$out/g3slack_24k_s0.pt+$out/g3slack_24k_s1.pt+$out/g3slack_24k_s2.pt+$out/g3slack_24k_s3.pt"
      g3slack-s4="$out/g3slack_24k_s4.pt" g3slack-s5="$out/g3slack_24k_s5.pt" g3slack-s6="$out/g3slack_24k_s6.pt"
      g3slack-s7="$out/g3slack_24k_s7.pt"
      ensemble-g3slack-8seeds="$(plus g3slack_24k_s{0,1,2,3,4,5,6,7})"
      distilled-expert-24k="$out/distill_expert_24k.pt" distilled-expert-24k-s1="$out/distill_expert_24k_s1.pt"
      distilled-expert-24k-s2="$out/distill_expert_24k_s2.pt" distilled-expert-24k-s3="$out/distill_expert_24k_s3.pt"
      distilled-expert-24k-s4="$out/distill_expert_24k_s4.pt" distilled-expert-24k-s5="$out/distill_expert_24k_s5.pt"
      distilled-slack-s0="$out/distill_slack_24k_s0.pt" distilled-slack-s1="$out/distill_slack_24k_s1.pt"
      distilled-slack-s2="$out/distill_slack_24k_s2.pt" distilled-slack-s3="$out/distill_slack_24k_s3.pt"
      ensemble-distilled="$(plus distill_expert_24k{,_s1,_s2,_s3,_s4,_s5} distill_slack_24k_s{0,1,2,3})"
      distilled-g3slack-s0="$out/distill_g3slack_24k_s0.pt" distilled-g3slack-s1="$out/distill_g3slack_24k_s1.pt"
      distilled-g3slack-s2="$out/distill_g3slack_24k_s2.pt" distilled-g3slack-s3="$out/distill_g3slack_24k_s3.pt"
      ensemble-distilled-g3slack="$(plus distill_g3slack_24k_s{0,1,2,3})"
      members:ensemble-distilled="$(plus distill_expert_24k{,_s1,_s2,_s3,_s4,_s5} distill_slack_24k_s{0,1,2,3})"
      members:shipped=checkpoints/ensemble.pt
      "members:shipped+groups=checkpoints/ensemble.pt|checkpoints/ensemble_groups.pt"
      members:ensemble-g3slack-4seeds="$out/g3slack_24k_s0.pt+$out/g3slack_24k_s1.pt+$out/g3slack_24k_s2.pt+$out/g3slack_24k_s3.pt"
      members:ensemble-groups3+g3slack="$out/groups3_24k_s0.pt+$out/groups3_24k_s1.pt+$out/groups3_24k_s2.pt+$out/groups3_24k_s3.pt+$out/g3slack_24k_s0.pt+$out/g3slack_24k_s1.pt+$out/g3slack_24k_s2.pt+$out/g3slack_24k_s3.pt")
members=(members:shipped members:ensemble-g3slack-4seeds members:ensemble-groups3+g3slack "members:shipped+groups"
         members:ensemble-distilled)
"$PY" benchmarks/bench_generalization.py --split validation --per-family 2 --agents "${arms[@]}" \
    --members "${members[@]}" --reuse benchmarks/results/generalization_validation_ablation.json \
    --json benchmarks/results/generalization_validation_ablation.json \
    --md benchmarks/results/generalization_validation_ablation.md
"$PY" benchmarks/bench_generalization.py --split test --per-family 2 --agents "${arms[@]}" \
    --members "${members[@]}" --reuse benchmarks/results/generalization_test.json --best-known benchmarks/results/best_known.json --keep-table \
    --json benchmarks/results/generalization_test_ablation.json \
    --md benchmarks/results/generalization_test_ablation.md
