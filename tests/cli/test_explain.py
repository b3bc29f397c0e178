"""``dqn-swap explain`` and the plan format's schema: a zoo network, a Hugging Face model and a
user's own module."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from dqn_swap.cli import main
from dqn_swap.explain import explain_plan
from dqn_swap.plan import Plan, PlanError
from dqn_swap.recorder import record_trace
from dqn_swap.trace import resolve_memory_limit

SCHEMA = json.loads((Path(__file__).parents[2] / "docs" / "plan.schema.json").read_text())


def _valid(value, schema) -> bool:  # noqa: C901 - the subset of JSON Schema the plan's schema uses
    """``value`` against ``schema``: const, enum, type, required, properties, items, prefixItems,
    minItems, maxItems, minimum, minLength (what docs/plan.schema.json uses)."""
    if "const" in schema and value != schema["const"]:
        return False
    if "enum" in schema and value not in schema["enum"]:
        return False
    kind = schema.get("type")
    types = {"object": dict, "array": list, "string": str, "integer": int}
    if kind is not None and (not isinstance(value, types[kind]) or isinstance(value, bool)):
        return False
    if isinstance(value, dict):
        if any(k not in value for k in schema.get("required", ())):
            return False
        if any(not _valid(value[k], s) for k, s in schema.get("properties", {}).items() if k in value):
            return False
    if isinstance(value, list):
        if not schema.get("minItems", 0) <= len(value) <= schema.get("maxItems", len(value)):
            return False
        prefix = schema.get("prefixItems", [])
        if any(not _valid(v, s) for v, s in zip(value, prefix)):
            return False
        if "items" in schema and any(not _valid(v, schema["items"]) for v in value[len(prefix):]):
            return False
    if isinstance(value, int) and not isinstance(value, bool) and value < schema.get("minimum", value):
        return False
    if isinstance(value, str) and len(value) < schema.get("minLength", 0):
        return False
    return True


class OwnNet(torch.nn.Module):
    """A user's own module: names of its own, a residual add."""

    def __init__(self) -> None:
        super().__init__()
        self.encoder = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.Tanh(), torch.nn.Linear(64, 64))
        self.head = torch.nn.Linear(64, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.encoder(x)
        return self.head(torch.tanh(h) + h)


@pytest.fixture(scope="module")
def own_trace():
    torch.manual_seed(0)
    return record_trace(OwnNet(), torch.randn(512, 32), lambda y: y.pow(2).mean(),
                        lambda p: torch.optim.Adam(p, lr=1e-3), device="meta", meta={"model": "own"})


def _plan(trace, limit: str, planner: str = "lru") -> Plan:
    from dqn_swap.agents import get_planner

    return get_planner(planner).plan(trace, resolve_memory_limit(trace, limit))


def _check_report(trace, plan: Plan, report: dict) -> None:
    f, b = report["figures"], report["binds"]
    assert f["swapped"] + f["recomputed"] == len(plan.actions) == len(report["actions"]) > 0
    assert f["swapped_bytes"] == sum(int(trace.tensor_nbytes[a.tensor]) for a in plan.actions if a.kind == 0)
    assert f["recomputed_bytes"] == sum(int(trace.tensor_nbytes[a.tensor]) for a in plan.actions if a.kind == 1)
    # the module sums are the actions' sums, every module path is the trace's own
    assert sum(m["swapped_bytes"] + m["recomputed_bytes"] for m in report["modules"]) == (
        f["swapped_bytes"] + f["recomputed_bytes"])
    for row in report["actions"]:
        assert row["module"] in trace.module_names or row["module"] in ("<top>", "<input>")
        assert ("copy_back_from" in row) == (row["kind"] == "swap")
    # the limit binds where the unplanned iteration first goes over it, and the plan stays under it
    op = int(np.flatnonzero(trace.op_memory > plan.memory_limit)[0])
    assert b["first_overflow_op"] == trace.op_label(op)
    assert b["overflow_bytes_there"] == int(trace.op_memory[op]) - plan.memory_limit > 0
    assert f["planned_peak_bytes"] <= plan.memory_limit < f["unplanned_peak_bytes"]
    assert b["headroom_bytes"] == plan.memory_limit - f["planned_peak_bytes"]


def test_explain_a_zoo_network_sums_per_module_and_names_where_the_limit_binds(tiny_resnet_trace):
    trace = tiny_resnet_trace
    plan = _plan(trace, "30%", "lru")
    report = explain_plan(trace, plan)
    _check_report(trace, plan, report)
    shallow = explain_plan(trace, plan, depth=1)
    assert {m["module"] for m in shallow["modules"]} <= {"stem", "blocks", "head", "fc", "<top>", "<input>"}
    assert sum(m["swapped"] for m in shallow["modules"]) == plan.n_swap


def test_explain_a_users_module_names_its_layers_and_re_runs(own_trace):
    plan = _plan(own_trace, "10%", "sqrt-n")
    report = explain_plan(own_trace, plan)
    _check_report(own_trace, plan, report)
    assert any(m["module"].startswith("encoder") for m in report["modules"])
    recomputed = [a for a in report["actions"] if a["kind"] == "recompute"]
    assert recomputed and all(a["re_run"] and a["re_created_before"] != "-" for a in recomputed)


def test_explain_command_on_a_hugging_face_model_writes_json_and_a_non_trivial_png(tmp_path, monkeypatch, capsys):
    pytest.importorskip("transformers")
    from PIL import Image

    monkeypatch.chdir(tmp_path)
    assert main(["record", "--model", "hf:gpt2", "--batch-size", "2", "-o", "g.trace", "--json"]) == 0
    assert main(["plan", "g.trace", "-m", "30%", "--planner", "lru", "-o", "p.json", "--json"]) == 0
    capsys.readouterr()
    plan_json = json.loads(Path("p.json").read_text())
    assert _valid(plan_json, SCHEMA)
    # the trace is found beside the plan by its fingerprint
    assert main(["explain", "p.json", "--json", "--actions", "--depth", "3"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["trace"] == "g.trace" and report["plot"] == "p-explained.png"
    assert any(m["module"].startswith("model.transformer.h") for m in report["modules"])
    with Image.open("p-explained.png") as im:
        assert im.size[0] > 600 and im.size[1] > 400
        colours = im.convert("RGB").getcolors(maxcolors=1 << 20)
        assert colours is not None and len(colours) > 50  # curves, shading and lanes, not a blank canvas
    # a second run replaces its own plot; text output names the binding op
    assert main(["explain", "p.json", "--trace", "g.trace"]) == 0
    out = capsys.readouterr().out
    assert "over the limit first at #" in out and "model.transformer" in out


def test_explain_refuses_in_one_line(tmp_path, monkeypatch, capsys, mlp_trace, tiny_resnet_trace):
    monkeypatch.chdir(tmp_path)
    mlp_trace.save("mlp.trace")
    _plan(tiny_resnet_trace, "40%").save("p.json")
    assert main(["explain", "p.json", "--no-plot"]) == 2  # no trace of its own beside it
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "give it with --trace" in err
    assert main(["explain", "p.json", "--trace", "mlp.trace", "--no-plot"]) == 2
    assert "made for trace" in capsys.readouterr().err
    assert main(["explain", "p.json", "--depth", "0", "--no-plot"]) == 2
    # autoplan's cache: KEY.trace beside KEY.plan.json is found first
    Path("cache").mkdir()
    tiny_resnet_trace.save("cache/k1.trace")
    _plan(tiny_resnet_trace, "40%").save("cache/k1.plan.json")
    assert main(["explain", "cache/k1.plan.json", "--no-plot", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["trace"] == "cache/k1.trace"
    Path("user.png").write_bytes(b"mine")
    tiny_resnet_trace.save("r.trace")
    assert main(["explain", "p.json", "--plot", "user.png"]) == 2
    assert Path("user.png").read_bytes() == b"mine"


def test_the_schema_accepts_what_planners_write_and_refuses_what_the_loader_refuses(tiny_resnet_trace):
    plan = _plan(tiny_resnet_trace, "40%", "auto")
    good = plan.to_json()
    good = json.loads(json.dumps(good))
    assert _valid(good, SCHEMA)
    Plan.from_json(good)
    bad = [
        {**good, "format": "other"},
        {**good, "memory_limit": 0},
        {**good, "memory_limit": 1.5},
        {**good, "planner": ""},
        {**good, "actions": [[1, 2]]},
        {**good, "actions": [[-1, 2, "swap"]]},
        {**good, "actions": [[1, 2, "move"]]},
        {**good, "schedule": {**good["schedule"], "prefetch": [[1, -3]]}},
        {k: v for k, v in good.items() if k != "trace_fingerprint"},
    ]
    for d in bad:
        assert not _valid(d, SCHEMA), d
        with pytest.raises(PlanError):
            Plan.from_json(d)
    try:
        import jsonschema
    except ImportError:
        return
    jsonschema.validate(good, SCHEMA)  # the schema is valid JSON Schema, and agrees
    for d in bad:
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate(d, SCHEMA)
