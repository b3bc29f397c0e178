"""The shipped ensembles, decoded by members, in a Hugging Face loop: one line turns planning on.

::

    python examples/hf_members.py 50%

A GPT-2 from a small config, called with ``model(**batch).loss`` under bf16 autocast, dropout on,
AdamW with two parameter groups; ``dqn_swap.autoplan`` plans it with ``checkpoints/ensemble.pt``
decoded by members, ``checkpoints/ensemble_groups.pt`` beside it.  It trains six steps planned
and six unplanned from the same seeds, and prints whether the whole state (parameters, buffers,
AdamW's moments and steps) is bit-identical, and the last planned step's peak measured on the
CPU (the allocator's timeline) against the plan's limit and prediction.  Exits 1 otherwise.
Run it from the repository's folder (the agent files are given by path); needs ``transformers``.
"""
import copy
import sys

import torch
import transformers
import dqn_swap
from dqn_swap.meter import AllocatorTimeline, collector_still
torch.set_num_threads(1)
transformers.logging.set_verbosity_error()
cfg = transformers.GPT2Config(vocab_size=512, n_positions=64, n_embd=64, n_layer=3, n_head=4)
torch.manual_seed(0)
base = transformers.GPT2LMHeadModel(cfg).train()
def batch(i):
    g = torch.Generator().manual_seed(100 + i)
    ids = torch.randint(0, 512, (4, 48), generator=g)
    return {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": ids.clone()}
def optimizer(m):
    decay = [p for p in m.parameters() if p.dim() >= 2]
    rest = [p for p in m.parameters() if p.dim() < 2]
    return torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": rest, "weight_decay": 0.0}], lr=1e-3)
def run(planned_limit, steps=6):
    m = copy.deepcopy(base); opt = optimizer(m)
    plan = None
    if planned_limit:
        plan = dqn_swap.autoplan(m, planned_limit, optimizer=opt, planner_options={
            "agent": "checkpoints/ensemble.pt", "members": True, "more_agents": ["checkpoints/ensemble_groups.pt"]})
    torch.manual_seed(1)
    peak = None
    for i in range(steps):
        b = batch(i)
        tl = AllocatorTimeline()
        with collector_still(), tl:
            ctx = plan.step() if plan else torch.enable_grad()
            with ctx:
                with torch.autocast("cpu", dtype=torch.bfloat16):
                    loss = m(**b).loss
                loss.backward()
            opt.step(); opt.zero_grad(set_to_none=True)
        peak = tl.peak
    state = {f"m.{k}": v for k, v in m.state_dict().items()}
    for gi, st in opt.state_dict()["state"].items():
        for k, v in st.items():
            state[f"o.{gi}.{k}"] = v
    return state, peak, plan
ref, ref_peak, _ = run(None)
LIMIT = sys.argv[1] if len(sys.argv) > 1 else "50%"
got, got_peak, plan = run(LIMIT)
same = ref.keys() == got.keys() and all(torch.equal(ref[k], got[k]) for k in ref)
s = plan.summary()
print("log:", s["log"])
print("plans:", s["plans"])
limit = next(iter(s["plans"].values()))["memory_limit"]
print(f"bit-identical {same} ({len(ref)} tensors); last step peak above start: planned {got_peak} unplanned {ref_peak}")
e = plan.last_entry
from dqn_swap.simulator import instant_copy_peak
pred = instant_copy_peak(e.trace, e.plan)
print("decoded_by:", e.plan.settings.get("decoded_by"))
measured = e.trace.initial_bytes + got_peak
print(f"{LIMIT}: measured peak {measured} B, limit {limit} B, predicted {pred} B, "
      f"unplanned {e.trace.initial_bytes + ref_peak} B (trace peak {e.trace.peak_bytes})")
sys.exit(0 if same and measured <= limit else 1)
