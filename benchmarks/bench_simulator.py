"""Benchmark: full simulations per second, both engines measured in one run.

Default: ResNet-50 and ResNet-1001 at batch 64, recorded on the ``meta`` device
(no GPU needed; cached under ``runs/traces/``), each with a plan that swaps ~30%
of the saved activations, each right after its last forward use (the largest
reuse gap, as a planner would), under the plan's own minimal memory limit (so
memory is tight and the prefetch rule, swap-out waits and prefetch stalls are
all exercised).  Times are CPU seconds of this thread (``time.thread_time``);
the compiled engine's first-call time (compilation, or loading it from Numba's
cache) is reported apart.  ``--synthetic`` builds a trace of similar shape
without the recorder (~2,000 ops, ~1,000 saved activations).  Prints one JSON
object.

    PYTHONPATH=. python benchmarks/bench_simulator.py -o benchmarks/results/simulator.json
    PYTHONPATH=. python benchmarks/bench_simulator.py --models resnet50 --recompute-fraction 0.1
    PYTHONPATH=. python benchmarks/bench_simulator.py --synthetic --profile-top 15   # cProfile of the runs
    PYTHONPATH=. python benchmarks/bench_simulator.py --env-steps benchmarks/results/dqn_env_steps.json
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import pstats
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from dqn_swap.plan import Action, ActionKind  # noqa: E402
from dqn_swap.simulator import Simulator  # noqa: E402
from dqn_swap.trace import Phase, Role, Trace, TraceBuilder  # noqa: E402
from dqn_swap.files import write_text  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
TRACE_DIR = ROOT / "runs" / "traces"  # git-ignored


def recorded_trace(model: str, batch: int) -> Trace:
    """Record ``model`` at ``batch`` on the meta device (shapes and roofline times only); cached in
    ``runs/traces/`` (ResNet-1001 takes minutes to record)."""
    path = TRACE_DIR / f"bench_simulator_{model}_b{batch}.trace"
    if path.exists():
        return Trace.load(path)
    from dqn_swap.models import build_workload
    from dqn_swap.recorder import record_trace

    w = build_workload(model, batch, "meta")
    trace = record_trace(w.model, w.example_inputs, w.loss_fn, w.make_optimizer, device="meta", inputs="released",
                         meta={"model": model, "batch_size": batch})
    TRACE_DIR.mkdir(parents=True, exist_ok=True)
    trace.save(path, overwrite=True)
    return trace


def synthetic_trace(layers: int = 1000, seed: int = 0) -> Trace:
    """A CNN-like chain: ``layers`` forward ops each saving a 1-50 MB activation, a backward op per
    layer (reads the saved activations and the incoming gradient, frees them), an optimizer op per
    4 layers.  Durations 20-400 us.  ~2 ops per layer, ~10 events per layer."""
    rng = np.random.default_rng(seed)
    b = TraceBuilder()
    F, B, O = Phase.FORWARD, Phase.BACKWARD, Phase.OPTIMIZER
    n_params = layers // 4
    params = [b.tensor(int(rng.integers(1, 20)) * 2**16, Role.PARAMETER, preexisting=True)
              for _ in range(n_params)]
    x = b.tensor(64 * 2**20, Role.INPUT, preexisting=True)
    acts = [x]
    for i in range(layers):
        out = b.tensor(int(rng.integers(1, 50)) * 2**20, Role.SAVED)
        reads = [acts[-1]] + ([params[i // 4]] if i % 4 == 0 else [])
        b.op("aten.conv", F, reads=reads, outputs=[out], duration=float(rng.uniform(20e-6, 400e-6)))
        acts.append(out)
    grad = b.tensor(2**20, Role.TEMPORARY)
    b.op("aten.loss", F, reads=[acts[-1]], outputs=[grad], duration=10e-6)
    grads = {}
    for i in reversed(range(layers)):
        g = b.tensor(int(rng.integers(1, 50)) * 2**20, Role.TEMPORARY)
        outs = [g]
        if i % 4 == 0:
            grads[i // 4] = b.tensor(b.t_nbytes[params[i // 4]], Role.GRADIENT)
            outs.append(grads[i // 4])
        frees = [grad, acts[i + 1]]
        b.op("aten.conv_backward", B, reads=[grad, acts[i + 1], acts[i]], outputs=outs, frees=frees,
             duration=float(rng.uniform(40e-6, 800e-6)))
        grad = g
    b.free(grad)
    for j, p in enumerate(params):
        b.op("aten.add_", O, reads=[grads[j], p], writes=[p], frees=[grads[j]], duration=10e-6)
    return b.build({"profile": "v100-pcie3", "model": f"synthetic{layers}"})


def make_plan(sim: Simulator, swap_fraction: float, recompute_fraction: float,
              seed: int) -> list[Action]:
    """Act on a random ``swap_fraction`` (+ ``recompute_fraction``) of the saved activations, each at
    its valid event with the largest reuse gap (its last forward use)."""
    trace = sim.trace
    va = sim.valid_actions()
    gap = sim.index.event_return_op - trace.event_op
    best: dict[int, int] = {}
    for e in np.flatnonzero(va.can_swap).tolist():
        t = int(trace.event_tensor[e])
        if trace.tensor_role[t] == Role.SAVED and (t not in best or gap[e] > gap[best[t]]):
            best[t] = e
    rng = np.random.default_rng(seed)
    n_saved = int((trace.tensor_role == Role.SAVED).sum())
    tensors = rng.permutation(sorted(best)).tolist()
    n_swap = min(len(tensors), round(swap_fraction * n_saved))
    plan = [Action(best[t], t, ActionKind.SWAP) for t in tensors[:n_swap]]
    rest = [t for t in tensors[n_swap:] if va.can_recompute[best[t]]]
    n_rec = min(len(rest), round(recompute_fraction * n_saved))
    plan += [Action(best[t], t, ActionKind.RECOMPUTE) for t in rest[:n_rec]]
    return plan


def rate(run, seconds: float) -> dict[str, float]:
    """Calls of ``run`` per CPU second of this thread, over at least ``seconds``."""
    n, start = 0, time.thread_time()
    while True:
        for _ in range(10):
            run()
        n += 10
        elapsed = time.thread_time() - start
        if elapsed >= seconds:
            return {"runs": n, "cpu_seconds": elapsed, "sims_per_s": n / elapsed, "us_per_sim": 1e6 * elapsed / n}


def bench_trace(trace: Trace, source: str, args: argparse.Namespace) -> dict:
    """Both engines on one trace and plan: rates, their ratio, and the figures (equal for both)."""
    probe = Simulator(trace, trace.peak_bytes)
    plan = make_plan(probe, args.swap_fraction, args.recompute_fraction, args.seed)
    if args.limit is None:
        limit = max(int(probe.memory_need(plan).max()), trace.initial_bytes)
    else:
        limit = int(args.limit * trace.peak_bytes)
    t0 = time.thread_time()
    sim = Simulator(trace, limit, engine="compiled")
    t_init = time.thread_time() - t0
    ref = Simulator(trace, limit, engine="python", index=sim.index)
    t0 = time.thread_time()
    result = sim.run(plan)  # the first call compiles the engine, or loads it from Numba's cache
    t_first = time.thread_time() - t0
    expected = ref.run(plan)
    if result.figures() != expected.figures() or result.schedule != expected.schedule:
        raise SystemExit(f"{source}: the engines disagree: {result.figures()} vs {expected.figures()}")
    ev = np.array([a.event for a in plan], dtype=np.int64)
    te = np.array([a.tensor for a in plan], dtype=np.int64)
    kd = np.array([int(a.kind) for a in plan], dtype=np.int64)

    prof = cProfile.Profile() if args.profile_top else None
    if prof:
        prof.enable()
    compiled = rate(lambda: sim.run(plan), args.seconds)
    compiled_arrays = rate(lambda: sim.run_arrays(ev, te, kd), args.seconds)
    python = rate(lambda: ref.run(plan), args.seconds)
    if prof:
        prof.disable()
        out = io.StringIO()
        pstats.Stats(prof, stream=out).sort_stats("tottime").print_stats(args.profile_top)
        print(out.getvalue(), file=sys.stderr)
    return {
        "trace": source,
        "ops": trace.n_ops, "events": trace.n_events, "tensors": trace.n_tensors,
        "saved_tensors": int((trace.tensor_role == Role.SAVED).sum()),
        "actions": len(plan),
        "swaps": sum(a.kind == ActionKind.SWAP for a in plan),
        "recomputes": sum(a.kind == ActionKind.RECOMPUTE for a in plan),
        "memory_limit_over_peak": limit / trace.peak_bytes,
        "simulator_init_cpu_s": t_init, "first_run_cpu_s": t_first,
        "compiled": compiled, "compiled_run_arrays": compiled_arrays, "python": python,
        "speedup": compiled["sims_per_s"] / python["sims_per_s"],
        "result": result.figures(),
    }


def env_steps(trace: Trace, seconds: float) -> dict:
    """Environment steps per CPU second (``dqn_swap.env``, random valid actions, resetting at the end
    of each episode) at 70% and 30% limits, with each engine.

    The loop's time is the environment's: each step reads the mask and picks a valid node with a
    uniform number drawn before the clock starts (drawing one per step with ``Generator.choice``
    would cost a tenth of a step), then steps; the resets are counted."""
    from dqn_swap.env import SwapRecomputeEnv

    out: dict = {}
    for limit in ("70%", "30%"):
        row = {}
        for engine in ("compiled", "python"):
            env = SwapRecomputeEnv(trace, limit)
            env.sim = Simulator(trace, env.memory_limit, env.profile, engine=engine, index=env.sim.index)
            uniform = np.random.default_rng(0).random(1 << 16).tolist()
            env.reset(seed=0)
            n, t0 = 0, time.thread_time()
            while time.thread_time() - t0 < seconds:
                for _ in range(10):
                    valid = np.flatnonzero(env.action_masks())
                    _, _, term, trunc, _ = env.step(int(valid[int(uniform[n & 0xFFFF] * len(valid))]))
                    n += 1
                    if term or trunc:
                        env.reset(seed=n)
            dt = time.thread_time() - t0
            row[engine] = {"steps": n, "cpu_seconds": dt, "steps_per_s": n / dt}
        out[limit] = {**row["compiled"], "python_engine": row["python"],
                      "speedup": row["compiled"]["steps_per_s"] / row["python"]["steps_per_s"],
                      "nodes": env.graph.n_nodes, "events": trace.n_events}
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    src = ap.add_mutually_exclusive_group()
    src.add_argument("--trace", type=Path, help="a .trace file instead of recording")
    src.add_argument("--synthetic", action="store_true", help="synthetic trace, no recorder")
    ap.add_argument("--models", default="resnet50,resnet1001", help="models to record (comma-separated)")
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--layers", type=int, default=1000, help="synthetic trace size")
    ap.add_argument("--swap-fraction", type=float, default=0.3)
    ap.add_argument("--recompute-fraction", type=float, default=0.0)
    ap.add_argument("--limit", type=float, default=None,
                    help="memory limit as a fraction of the trace peak (default: the plan's own minimum)")
    ap.add_argument("--seconds", type=float, default=3.0, help="CPU time to spend measuring each engine")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--profile-top", type=int, default=0, help="print a cProfile of the runs (top N) to stderr")
    ap.add_argument("-o", "--output", type=Path, help="also write the JSON report here")
    ap.add_argument("--env-steps", type=Path, metavar="JSON",
                    help="instead: environment steps/s on ResNet-50 batch 64 (both engines), written here")
    args = ap.parse_args(argv)
    if args.seconds <= 0:
        ap.error("--seconds must be positive")

    from common import provenance
    from machine import relative_paths

    if args.env_steps:
        report = {**provenance(), "timer": "time.thread_time (CPU seconds of one thread)", "trace": "resnet50 batch 64 (meta)",
                  **env_steps(recorded_trace("resnet50", 64), args.seconds)}
        print(json.dumps(report, indent=1))
        write_text(args.env_steps, json.dumps(relative_paths(report), indent=1) + "\n", overwrite=True)
        return 0
    if args.trace:
        traces = [(Trace.load(args.trace), str(args.trace))]
    elif args.synthetic:
        traces = [(synthetic_trace(args.layers, args.seed), f"synthetic({args.layers} layers)")]
    else:
        traces = [(recorded_trace(m, args.batch), f"{m} batch {args.batch} (meta)")
                  for m in args.models.split(",") if m]

    report = {**provenance(), "timer": "time.thread_time (CPU seconds of one thread)",
              "traces": [bench_trace(trace, source, args) for trace, source in traces]}
    print(json.dumps(report, indent=1))
    if args.output:
        write_text(args.output, json.dumps(relative_paths(report), indent=1) + "\n", overwrite=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
