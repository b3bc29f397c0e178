"""Damaged files, byte by byte: every trace, agent and plan file the tool reads either loads or fails
with its module's one-line error, whatever was damaged.

A flipped byte lands anywhere: in a zip header, in compressed data (zlib fails in a dozen ways), in an
``.npy`` header numpy parses, in a record of the weights-only unpickler, or in a plan's JSON values.
The hand-written cases of ``test_bad_inputs.py`` name what each check says; these seeded property
tests check that no damage escapes as a traceback.
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from dqn_swap.plan import Plan, PlanError
from dqn_swap.trace import Trace, TraceError

ROOT = Path(__file__).resolve().parents[1]


def damaged(data: bytes, rng: random.Random, positions: Callable[[int], int] | None = None) -> bytes:
    """``data`` with one byte changed (at ``positions(len)``, else anywhere)."""
    b = bytearray(data)
    pos = positions(len(b)) if positions else rng.randrange(len(b))
    b[pos] ^= rng.randrange(1, 256)
    return bytes(b)


def outcome(load: Callable[[Path], Any], error: type[Exception], path: Path) -> str:
    """'loaded', 'refused' (the one-line error), or what escaped."""
    try:
        load(path)
    except error as e:
        assert "\n" not in str(e), str(e)
        return "refused"
    except Exception as e:  # noqa: BLE001: what the test is about
        return f"{type(e).__module__}.{type(e).__name__}: {str(e)[:120]}"
    return "loaded"


@pytest.fixture(scope="module")
def trace_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from dqn_swap.models import build_workload
    from dqn_swap.recorder import record_trace

    w = build_workload("resnet_tiny", 2, "meta")
    trace = record_trace(w.model, w.example_inputs, w.loss_fn, w.make_optimizer, device="meta")
    return trace.save(tmp_path_factory.mktemp("corrupt") / "t.trace")


def test_a_damaged_trace_loads_or_gives_one_line(trace_file: Path, tmp_path: Path) -> None:
    data, rng = trace_file.read_bytes(), random.Random(0)
    seen: dict[str, int] = {}
    for i in range(400):
        blob = damaged(data, rng) if i < 350 else data[:rng.randrange(len(data))]
        path = tmp_path / "d.trace"
        path.write_bytes(blob)
        got = outcome(Trace.load, TraceError, path)
        seen[got] = seen.get(got, 0) + 1
    escaped = {k: v for k, v in seen.items() if k not in ("loaded", "refused")}
    assert escaped == {}
    assert seen["refused"] > 100  # most damage is caught (the rest hits values a trace may hold)


@pytest.mark.filterwarnings("error::UserWarning")  # a warning torch prints before failing is an escape too
@pytest.mark.parametrize("name", ["default.pt", "ensemble_groups.pt"])
def test_a_damaged_agent_file_loads_or_gives_one_line(tmp_path: Path, name: str) -> None:
    from dqn_swap.agents import get_planner
    from dqn_swap.agents.dqn.agent_file import AgentFileError

    def load_agent(path: Path) -> None:  # an agent or ensemble file, as the planner reads it
        get_planner("dqn", agent=str(path))

    data, rng = (ROOT / "checkpoints" / name).read_bytes(), random.Random(0)
    # the zip's local headers and pickled records lie at the start, its directory at the end
    where = [lambda n: rng.randrange(min(n, 4096)), lambda n: n - 1 - rng.randrange(min(n, 4096)), None]
    seen: dict[str, int] = {}
    for i in range(240):
        blob = damaged(data, rng, where[i % 3]) if i < 210 else data[:rng.randrange(len(data))]
        path = tmp_path / "d.pt"
        path.write_bytes(blob)
        got = outcome(load_agent, AgentFileError, path)
        seen[got] = seen.get(got, 0) + 1
    escaped = {k: v for k, v in seen.items() if k not in ("loaded", "refused")}
    assert escaped == {}
    assert seen["refused"] > 50


def test_a_plan_with_damaged_values_loads_or_gives_one_line(trace_file: Path, tmp_path: Path) -> None:
    """Any value of a plan replaced by one of another type or range: loading it for its trace either
    gives a plan the simulator takes, or a :class:`PlanError`; the only other outcome allowed is the
    simulator's own one-line refusal of an action or profile that cannot be (a ValueError)."""
    from dqn_swap.agents import get_planner
    from dqn_swap.simulator import simulate

    trace = Trace.load(trace_file)
    base = get_planner("greedy").plan(trace, int(trace.peak_bytes * 0.6)).to_json()
    rng = random.Random(0)
    values: list[Any] = [None, True, 0, -1, 1, 2**70, 1.5, "", "x", [], {}, [1], [[1, 2]], {"a": 1}, "swap"]

    def leaves(o: Any, path: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
        out = [path] if path else []
        items = o.items() if isinstance(o, dict) else enumerate(o) if isinstance(o, list) else ()
        for k, v in list(items)[:8]:
            out += leaves(v, path + (k,))
        return out

    paths = leaves(base)
    escaped: dict[str, int] = {}
    counts = {"refused": 0, "loaded": 0}
    for _ in range(400):
        doc = json.loads(json.dumps(base))
        p = rng.choice(paths)
        o = doc
        for k in p[:-1]:
            o = o[k]
        o[p[-1]] = rng.choice(values)
        path = tmp_path / "d.json"
        path.write_text(json.dumps(doc))
        try:
            simulate(trace, Plan.load(path, trace))
            counts["loaded"] += 1
        except PlanError as e:
            assert "\n" not in str(e)
            counts["refused"] += 1
        except ValueError as e:  # the simulator's refusal: one line, which the command line prints
            assert "\n" not in str(e) and ("invalid action" in str(e) or "device profile" in str(e)), str(e)
        except Exception as e:  # noqa: BLE001
            key = f"{type(e).__name__}: {str(e)[:120]} (at {p})"
            escaped[key] = escaped.get(key, 0) + 1
    assert escaped == {}
    assert counts["refused"] > 100


def test_a_trace_whose_array_claims_a_huge_size_gives_one_line(trace_file: Path, tmp_path: Path) -> None:
    """A hostile ``.npy`` header in the archive claiming 10^12 rows: numpy would allocate terabytes;
    the load says so in one line instead of a traceback."""
    import io
    import zipfile

    import numpy as np

    path = tmp_path / "huge.trace"
    with zipfile.ZipFile(trace_file) as src, zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as out:
        for info in src.infolist():
            data = src.read(info.filename)
            if info.filename == "op_flops.npy":
                rows = np.load(io.BytesIO(data)).shape[0]
                header_len = data.index(b"\n") + 1
                header = data[:header_len].decode("latin1").replace(f"({rows},)", "(1000000000000,)")
                header = header[:-1].rstrip().ljust(header_len - 1) + "\n"  # same length: same offsets
                data = header.encode("latin1") + data[header_len:]
            out.writestr(info, data)
    with pytest.raises(TraceError, match="huge.trace: corrupt trace file, or one too large") as info:
        Trace.load(path)
    assert "\n" not in str(info.value)


@pytest.mark.filterwarnings("error::UserWarning")
def test_torchs_warning_on_a_damaged_protocol_byte_does_not_reach_the_user(tmp_path: Path) -> None:
    """A flipped pickle protocol byte makes torch warn ("Detected pickle protocol 93") before it reads
    the file; the agent loader says what is wrong in its own line, or loads, without that warning."""
    from dqn_swap.agents.dqn import load_agent

    data = bytearray((ROOT / "checkpoints" / "default.pt").read_bytes())
    proto = data.index(b"\x80\x02", data.index(b"data.pkl"))  # PROTO 2, the first opcode of the pickle
    data[proto + 1] = 93
    path = tmp_path / "proto.pt"
    path.write_bytes(bytes(data))
    load_agent(path)  # the records are sound: it loads


class _RunsCode:
    """Unpickled, it would call ``pathlib.Path.touch`` on its marker: code a hostile file runs."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):  # noqa: ANN204
        return (Path.touch, (self.marker,))


def test_an_agent_file_holding_code_is_refused_without_running_it(tmp_path: Path) -> None:
    import torch

    from dqn_swap.agents.dqn import load_agent
    from dqn_swap.agents.dqn.agent_file import AgentFileError

    marker = tmp_path / "ran"
    path = tmp_path / "hostile.pt"
    torch.save({"format": "dqn-swap-agent", "state_dict": _RunsCode(marker)}, path)
    with pytest.raises(AgentFileError, match=r"hostile.pt: not a dqn-swap agent file: it holds a Python object "
                                             r"\([\w.]+\) that dqn-swap never loads") as info:
        load_agent(path)
    assert "\n" not in str(info.value) and "weights_only" not in str(info.value)
    assert not marker.exists()
