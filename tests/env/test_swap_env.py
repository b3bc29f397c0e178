"""The swap/recompute Gymnasium environment: API compliance, masks, and the returns identity."""

from __future__ import annotations

import gymnasium
import numpy as np
import pytest
from gymnasium.utils.env_checker import check_env

import dqn_swap.env as env_pkg
from dqn_swap.simulator import simulate
from dqn_swap.limits import resolve_limit
from dqn_swap.env import SwapRecomputeEnv
from dqn_swap.env.candidates import (F_CHOSEN, F_DEFICIT, F_EXEC, F_LIMIT, F_SLACK, F_TVIOL, F_VALID, NOTHING,
                                     RECOMPUTE, SWAP, build_action_graph)


@pytest.fixture(scope="module")
def trace(tiny_resnet_trace):
    return tiny_resnet_trace


def test_check_env_passes(trace):
    e = SwapRecomputeEnv(trace, "40%")
    check_env(e)  # unwrapped, as the issue asks


def test_registered_with_gymnasium(trace):
    e = gymnasium.make(env_pkg.ENV_ID, trace=trace, memory_limit="50%")
    obs, info = e.reset(seed=0)
    assert e.observation_space.contains(obs)
    assert info["action_mask"].shape == (e.unwrapped.graph.n_nodes,)
    e.close()


def run_random_episode(e: SwapRecomputeEnv, seed: int, p_invalid: float = 0.0):
    rng = np.random.default_rng(seed)
    _, info = e.reset(seed=seed)
    total, done = 0.0, False
    while not done:
        mask = e.action_masks()
        assert np.array_equal(mask, info["action_mask"])
        if rng.random() < p_invalid and (~mask).any():
            a = int(rng.choice(np.flatnonzero(~mask)))
        else:
            a = int(rng.choice(np.flatnonzero(mask)))
        _, r, term, trunc, info = e.step(a)
        total += r
        done = term or trunc
    return total, info


@pytest.mark.parametrize("limit", ["30%", "60%", "90%"])
@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize("reward", ["whole", "accrued"])
def test_returns_add_up_to_minus_simulated_overhead(trace, limit, seed, reward):
    e = SwapRecomputeEnv(trace, limit, reward=reward)
    total, info = run_random_episode(e, seed, p_invalid=0.2)
    plan = e.plan()
    res = simulate(trace, plan, memory_limit=e.memory_limit, profile=e.profile,
                   overcommit=reward == "whole")
    assert res.feasible == info["feasible"]
    assert total == pytest.approx(-res.overhead - info["penalty"], rel=1e-9, abs=1e-12)
    if res.feasible:
        assert info["penalty"] == pytest.approx(e.invalid_penalty * round(info["penalty"] / e.invalid_penalty))


def test_invalid_action_is_a_penalised_no_op(trace):
    e = SwapRecomputeEnv(trace, "30%")
    obs, info = e.reset(seed=0)
    invalid = np.flatnonzero(~info["action_mask"])
    assert len(invalid)
    obs2, r, term, trunc, info2 = e.step(int(invalid[0]))
    assert r == -e.invalid_penalty and not term and not trunc
    assert np.array_equal(obs.nodes, obs2.nodes) and info2["plan_actions"] == ()


def test_limit_above_peak_needs_no_action(trace):
    e = SwapRecomputeEnv(trace, trace.peak_bytes + 1)
    _, info = e.reset(seed=0)
    assert info["feasible"] and info["action_mask"].tolist() == [True] + [False] * (e.graph.n_nodes - 1)
    _, r, term, _, info = e.step(0)
    assert term and r == 0.0 and info["overhead"] == 0.0


def test_fast_path_matches_observation(trace):
    e = SwapRecomputeEnv(trace, "50%")
    obs, _ = e.reset(seed=0)
    assert np.array_equal(obs.nodes, e.node_features(e.state()))
    a = int(np.flatnonzero(e.action_masks())[0])
    obs, *_ = e.step(a)
    assert np.array_equal(obs.nodes, e.node_features(e.state()))
    assert obs.nodes[:, 6].min() == obs.nodes[:, 6].max() == pytest.approx(0.5, abs=1e-3)  # the limit


@pytest.mark.parametrize("mode", ["candidates", "dataflow", "events"])
def test_no_node_stands_for_two_actions(trace, mode):
    e = SwapRecomputeEnv(trace, "50%", graph=mode)
    g = e.graph
    assert g.kind[0] == NOTHING
    acts = [g.action(i) for i in g.action_nodes]
    assert len(set(acts)) == len(acts) == len(g.action_nodes)
    valid = e.sim.valid_actions()
    for a in acts:  # every action node is an action the simulator accepts
        assert trace.event_tensor[a.event] == a.tensor
    if mode == "events":
        assert g.n_nodes == trace.n_events + 1
    assert valid is not None


def test_dataflow_graph_joins_a_removal_to_the_inputs_it_re_runs(trace):
    """The dataflow graph is the candidates graph (same nodes and features) plus, for every recompute
    node, an edge to each action node of a tensor its producer op reads and did not allocate (what
    a re-run needs) -- and no other edge."""
    from dqn_swap.trace import EventKind

    cand = SwapRecomputeEnv(trace, "50%", recompute_chains=True).graph
    flow = SwapRecomputeEnv(trace, "50%", recompute_chains=True, graph="dataflow").graph
    assert flow.n_nodes == cand.n_nodes and np.array_equal(flow.x_static, cand.x_static)
    assert np.array_equal(flow.tensor, cand.tensor) and np.array_equal(flow.kind, cand.kind)

    def pairs(g):
        return {(int(a), int(b)) for a, b in g.edge_index.T}

    reads: dict[int, set[int]] = {}
    for e in np.flatnonzero(trace.event_kind == EventKind.READ):
        reads.setdefault(int(trace.event_op[e]), set()).add(int(trace.event_tensor[e]))
    expected = set()
    for i in np.flatnonzero(cand.kind == RECOMPUTE):
        producer = int(trace.tensor_alloc_op[cand.tensor[i]])
        inputs = {u for u in reads.get(producer, set()) if trace.tensor_alloc_op[u] != producer}
        for j in np.flatnonzero(np.isin(cand.tensor, sorted(inputs))):
            expected |= {(int(i), int(j)), (int(j), int(i))}
    added = pairs(flow) - pairs(cand)
    assert expected, "the test trace has removals that read other candidates"
    assert added == expected - pairs(cand) and pairs(cand) <= pairs(flow)
    assert flow.edge_index.shape[1] == flow.edge_attr.shape[0]


def test_memory_limit_forms(trace, tmp_path):
    """Any form of dqn_swap.limits; a trace file works as well as a Trace."""
    assert SwapRecomputeEnv(trace, "100%").memory_limit == trace.peak_bytes
    assert SwapRecomputeEnv(trace, "0%").memory_limit == trace.minimum_memory
    assert SwapRecomputeEnv(trace, "1x").memory_limit == trace.peak_bytes
    assert SwapRecomputeEnv(trace, trace.peak_bytes).memory_limit == trace.peak_bytes
    path = trace.save(tmp_path / "t.trace")
    assert SwapRecomputeEnv(str(path), "50%").memory_limit == resolve_limit(trace, "50%")
    for bad in (-5, 0.5, "0.5", 1, "abc%"):
        with pytest.raises(ValueError):
            SwapRecomputeEnv(trace, bad)


def test_action_graph_is_shared_between_limits(trace):
    a = SwapRecomputeEnv(trace, "30%")
    b = SwapRecomputeEnv(trace, "70%", action_graph=a.graph)
    assert b.graph is a.graph and b.memory_limit > a.memory_limit
    assert build_action_graph(trace, a.profile, a.sim.valid_actions()).n_nodes == a.graph.n_nodes


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_no_recompute_chains(trace, seed):
    """With ``recompute_chains=False`` no removed tensor's re-run needs another removed tensor."""
    e = SwapRecomputeEnv(trace, "5%", recompute_chains=False)
    chained = SwapRecomputeEnv(trace, "5%")
    total, info = run_random_episode(e, seed)
    removed = {a.tensor for a in e.actions if a.kind == 1}
    assert removed, "the limit is tight enough for random episodes to remove tensors"
    for x in removed:
        producer_inputs = set(e.sim.index.op_inputs[int(trace.tensor_alloc_op[x])])
        assert not (producer_inputs & removed), f"tensor {x} would need another re-run first"
    res = simulate(trace, e.plan(), memory_limit=e.memory_limit, profile=e.profile, overcommit=True)
    assert total == pytest.approx(-res.overhead - info["penalty"], rel=1e-9, abs=1e-12)
    # the rule only narrows the mask: every action valid without chains is valid with them
    rng = np.random.default_rng(seed)
    e.reset(), chained.reset()
    while not e._done:
        mask = e.action_masks()
        assert not (mask[1:] & ~chained.action_masks()[1:]).any()
        a = int(rng.choice(np.flatnonzero(mask)))
        e.step(a), chained.step(a)


@pytest.mark.parametrize("max_chain", [2, 3])
def test_removal_groups_stay_within_max_chain(trace, max_chain):
    """With chains off and ``max_chain`` k, removals linked by a producer reading another form
    groups of at most k tensors, and such groups do form; the environment blocks exactly the
    removals the rule forbids, a subset of those that k = 1 would block; returns still add up."""
    largest = 0
    for seed in range(6):
        e = SwapRecomputeEnv(trace, "5%", recompute_chains=False, max_chain=max_chain)
        rng = np.random.default_rng(seed)
        e.reset()
        total = 0.0
        while not e._done:
            blocked = chain_blocked_from_scratch(e)
            assert np.array_equal(e._chain_blocked & (e.graph.kind == RECOMPUTE), blocked)
            assert not (blocked & ~chain_blocked_from_scratch(e, 1)).any()
            total += e.step(int(rng.choice(np.flatnonzero(e.action_masks()))))[1]
        removed = {a.tensor for a in e.actions if a.kind == 1}
        sizes: dict[int, int] = {}
        for root in removal_groups(e, removed).values():
            sizes[root] = sizes.get(root, 0) + 1
        assert max(sizes.values(), default=0) <= max_chain
        largest = max(largest, max(sizes.values(), default=0))
        res = simulate(trace, e.plan(), memory_limit=e.memory_limit, profile=e.profile, overcommit=True)
        assert total == pytest.approx(-res.overhead - e._penalty, rel=1e-9, abs=1e-12)
    assert largest >= 2, "random episodes at this limit join removals into groups"


def test_max_chain_is_checked(trace):
    for bad in (0, 1.5, True):
        with pytest.raises(ValueError, match="max_chain"):
            SwapRecomputeEnv(trace, "50%", recompute_chains=False, max_chain=bad)


@pytest.mark.parametrize("reward", ["whole", "accrued"])
@pytest.mark.parametrize("seed", [0, 1])
def test_step_many_returns_add_up_to_minus_simulated_overhead(trace, reward, seed):
    """Batches of actions keep the identity of section 4.7, and each batch is one plan step."""
    e = SwapRecomputeEnv(trace, "30%", reward=reward)
    e.reset(seed=0)
    rng = np.random.default_rng(seed)
    total, done, n_actions = 0.0, False, 0
    while not done:
        valid = np.flatnonzero(e.action_masks())
        if valid[0] == 0:
            _, r, term, trunc, _ = e.step(0)
            total, done = total + r, True
            break
        picked = [int(a) for a in rng.choice(valid, size=min(3, len(valid)), replace=False)]
        r, done = e.step_many(picked)
        total += r
        assert n_actions < len(e.actions) <= n_actions + len(picked)  # skipped: same tensor or a chain
        n_actions = len(e.actions)
    res = simulate(trace, e.plan(), memory_limit=e.memory_limit, profile=e.profile, overcommit=reward == "whole")
    assert total == pytest.approx(-res.overhead - e._penalty, rel=1e-9, abs=1e-12)
    assert total == pytest.approx(e.episode_return)
    assert e.feasible == res.feasible


def test_step_many_refuses_invalid_nodes(trace):
    e = SwapRecomputeEnv(trace, "30%")
    _, info = e.reset(seed=0)
    invalid = np.flatnonzero(~info["action_mask"])
    with pytest.raises(ValueError, match="not a valid action"):
        e.step_many([int(invalid[-1])])
    with pytest.raises(ValueError, match="not a valid action"):
        e.step_many([0])  # "do nothing" goes through step()


def test_deficit_ahead_reads_the_simulators_memory_need(trace):
    e = SwapRecomputeEnv(trace, "30%")
    e.reset(seed=0)
    assert not e.feasible and e.deficit_ahead(0) == 0.0
    need = e.sim.memory_need([])
    assert np.array_equal(need, e.sim.index.op_memory)  # the empty plan needs what the trace allocates
    op = e.decision_op
    for k in (1, 5, 40):
        expect = max(int(need[op + 1: op + 1 + k].max()) - e.memory_limit, 0) if op + 1 < len(need) else 0
        assert e.deficit_ahead(k) == expect
    # a swap lowers the need while its tensor is away, and nowhere raises it
    a = int(np.flatnonzero(e.action_masks() & (e.graph.kind == 1))[0])
    act = e.graph.action(a)
    after = e.sim.memory_need([act])
    assert np.all(after <= need)
    # away from when it leaves (after its event, or later where a holder outside autograd keeps it)
    leaves = max(int(e.graph.event_op[a]), int(trace.held_op[act.tensor]))
    away = slice(leaves + 1, int(e.graph.reuse_op[a]))
    assert away.start < away.stop
    assert np.all(need[away] - after[away] == trace.tensor_nbytes[act.tensor])


def removal_groups(e: SwapRecomputeEnv, removed: set[int]) -> dict[int, int]:
    """Per removed tensor, a label of its group: removals joined by a producer reading another."""
    label = {x: x for x in removed}

    def find(x: int) -> int:
        while label[x] != x:
            x = label[x]
        return x

    for x in removed:
        for y in e.sim.index.op_inputs[int(e.trace.tensor_alloc_op[x])]:
            if int(y) in removed and int(y) != x:
                label[find(x)] = find(int(y))
    return {x: find(x) for x in removed}


def chain_blocked_from_scratch(e: SwapRecomputeEnv, max_chain: int | None = None) -> np.ndarray:
    """The recompute nodes the chain rule blocks, from the removals taken alone: with chains off,
    those whose removal would join removals into a group of more than ``max_chain`` tensors
    (default the environment's)."""
    max_chain = e.max_chain if max_chain is None else max_chain
    g = e.graph
    blocked = np.zeros(g.n_nodes, dtype=bool)
    if e.recompute_chains:
        return blocked
    removed = {a.tensor for a in e.actions if a.kind == 1}
    groups = removal_groups(e, removed)
    size: dict[int, int] = {}
    for root in groups.values():
        size[root] = size.get(root, 0) + 1
    inputs, alloc = e.sim.index.op_inputs, e.trace.tensor_alloc_op
    readers: dict[int, set[int]] = {}
    for x in range(e.trace.n_tensors):
        for y in inputs[int(alloc[x])]:
            readers.setdefault(int(y), set()).add(x)
    for n in np.flatnonzero(g.kind == RECOMPUTE):
        u = int(g.tensor[n])
        if u in removed:
            continue
        linked = ({int(y) for y in inputs[int(alloc[u])]} | readers.get(u, set())) & removed - {u}
        roots = {groups[x] for x in linked}
        blocked[n] = 1 + sum(size[r] for r in roots) > max_chain
    return blocked


def features_from_scratch(e: SwapRecomputeEnv) -> tuple[np.ndarray, np.ndarray, int, float]:
    """``(nodes, mask, current, deficit)`` of the class docstring's observation, computed from the
    simulator's full result of the plan so far and the graph alone (what the environment keeps
    up to date step by step)."""
    g, res = e.graph, e.result
    acted = np.isin(g.tensor, [a.tensor for a in e.actions])
    blocked = chain_blocked_from_scratch(e)
    x = g.x_static.copy()
    if res.feasible:
        valid, cur, deficit = np.zeros(g.n_nodes, dtype=bool), 0, 0.0
        tv = np.zeros(g.n_nodes)
    else:
        inf = res.infeasible
        op = inf.op if inf is not None else res.peak_op
        deficit = float(max(inf.needed - inf.available if inf is not None else res.peak_bytes - e.memory_limit, 0))
        valid = (g.event_op >= 0) & (g.event_op < op) & (g.reuse_op > op) & ~acted & ~blocked
        cur = max(int(np.searchsorted(g.node_op, op, side="left")) - 1, 0)
    if not valid.any():
        valid[0] = True
    if not res.feasible:
        tv = np.where(valid, np.log1p(np.maximum(e.trace.op_start[op] - g.event_time, 0.0) / g.time_scale), 0.0)
    deficit = float(np.log1p(deficit / g.size_scale))
    lo, hi = e.trace.minimum_memory, e.trace.peak_bytes
    x[:, F_VALID], x[:, F_LIMIT] = valid, np.clip((e.memory_limit - lo) / max(hi - lo, 1), -1.0, 2.0)
    x[cur, F_EXEC], x[:, F_DEFICIT], x[:, F_TVIOL] = 1.0, deficit, tv.astype(np.float32)
    x[:, F_CHOSEN] = np.isin(np.arange(g.n_nodes), e._nodes)
    x[:, F_SLACK] = swap_slack_from_scratch(e, valid)
    return x, valid, cur, deficit


def swap_slack_from_scratch(e: SwapRecomputeEnv, valid: np.ndarray) -> np.ndarray:
    """Column ``swap_slack`` by running the device-to-host queue copy by copy: the plan's swaps in
    order of their decision events, each starting when the engine is free and its event has run."""
    g, out = e.graph, np.zeros(e.graph.n_nodes, dtype=np.float32)
    if e.result.feasible or not e.swap_slack:
        return out
    d2h = np.asarray(e.sim.tt_d2h)
    queue = sorted((float(g.event_time[n]), float(d2h[g.tensor[n]])) for n in e._nodes if g.kind[n] == SWAP)
    t_v = float(e.trace.op_start[e.decision_op])
    for n in np.flatnonzero(valid & (g.kind == SWAP)):
        t_e, free = float(g.event_time[n]), 0.0
        for t, d in queue:
            if t > t_e:
                break
            free = max(free, t) + d
        slack = (t_v - (max(t_e, free) + float(d2h[g.tensor[n]]))) / g.time_scale
        out[n] = np.sign(slack) * np.log1p(abs(slack))
    return out


@pytest.mark.parametrize("limit,graph,chains,reward", [("30%", "candidates", True, "whole"),
                                                       ("5%", "candidates", False, "accrued"),
                                                       ("5%", "candidates", 3, "whole"),
                                                       ("50%", "events", True, "whole")])
def test_observation_kept_step_by_step_is_the_one_made_from_scratch(trace, limit, graph, chains, reward):
    """Through episodes with invalid actions, batches, snapshots and restores, the observation,
    mask and state kept up to date in place are those computed afresh from the simulator's result.
    ``chains``: True, False, or a number (chains off, groups of at most that many); the 50 % case
    leaves column ``swap_slack`` uncomputed (zero)."""
    groups = {} if isinstance(chains, bool) else {"max_chain": chains}
    e = SwapRecomputeEnv(trace, limit, graph=graph, recompute_chains=chains is True, reward=reward,
                         swap_slack=limit != "50%", **groups)
    rng = np.random.default_rng(0)
    checked = 0

    def check(obs=None, info=None):  # noqa: ANN001, ANN202
        nonlocal checked
        x, valid, cur, deficit = features_from_scratch(e)
        st = e.state()
        assert np.array_equal(e.action_masks(), valid) and np.array_equal(st.valid, valid)
        assert st.current == cur and st.deficit == deficit
        assert np.array_equal(e.node_features(st), x)
        if obs is not None:
            assert np.array_equal(obs.nodes, x) and np.array_equal(info["action_mask"], valid)
        checked += 1

    for episode in range(3):
        obs, info = e.reset(seed=episode)
        check(obs, info)
        snap, done = None, False
        while not done:
            mask = e.action_masks()
            if rng.random() < 0.15 and (~mask).any():
                a = int(rng.choice(np.flatnonzero(~mask)))
            else:
                a = int(rng.choice(np.flatnonzero(mask)))
            if snap is None and len(e.actions) == 2:
                snap = e.snapshot()
            obs, _, term, trunc, info = e.step(a)
            check(obs, info)
            obs.nodes[:] = -1.0  # what a step returns is the user's
            done = term or trunc
        if snap is not None:
            e.restore(snap)
            check()
            valid = [int(v) for v in np.flatnonzero(e.action_masks()) if v]
            if valid:
                e.step_many(valid[:3])
                check()
    assert checked > 10
