"""Helpers shared by subcommands: progress, JSON output, loading inputs."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from ..trace import Trace
from ..units import format_bytes


def print_json(obj: Any) -> None:
    json.dump(obj, sys.stdout, indent=2, default=_json_default)
    sys.stdout.write("\n")


def _json_default(o: Any) -> Any:
    import numpy as np

    if isinstance(o, np.generic):
        return o.item()
    if isinstance(o, np.ndarray):
        return o.tolist()
    raise TypeError(f"not JSON serialisable: {type(o).__name__}")


def batch_size(text: str) -> int:
    """argparse type of ``--batch-size``: a whole number in range, said in one line otherwise."""
    from ..models.names import check_batch_size

    try:
        return check_batch_size(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def whole(low: int, high: int, what: str):
    """An argparse type: a whole number of ``what`` from ``low`` to ``high``, said in one line otherwise
    (the bounds of the command line and of the Python API are the same numbers)."""
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            value = None
        if value is None or not low <= value <= high:
            raise argparse.ArgumentTypeError(f"must be a whole number of {what} from {low} to {high}, not {text!r}")
        return value

    parse.__name__ = what.replace(" ", "_")  # argparse names the type in its messages
    return parse


#: Bounds shared by the commands: environment or training steps, random seeds, CPU threads.
MAX_STEPS = 10**9
MAX_SEED = 2**63 - 1
MAX_THREADS = 4096


#: ``--search-simulations``'s help, shared by simulate, plan and compare.
#: What --agent (and finetune's --from) accepts: shared by every command that reads an agent.
AGENT_HELP = ("agent file, or a shipped agent by name from any folder: default, ensemble (ten agents, "
              "by the mean of their Q-values), ensemble_groups, grid/... (checkpoints/README.md says what "
              "each is; default: default)")

def available_host_bytes() -> int | None:
    """Bytes this process may still allocate on the host: the kernel's ``MemAvailable``, lowered by an
    address-space limit (``ulimit -v``) if one is set; ``None`` where neither can be read."""
    import resource

    avail = None
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    avail = int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        soft, _ = resource.getrlimit(resource.RLIMIT_AS)
        if soft != resource.RLIM_INFINITY:
            with open("/proc/self/statm") as f:
                used = int(f.read().split()[0]) * resource.getpagesize()
            room = max(soft - used, 0)
            avail = room if avail is None else min(avail, room)
    except (OSError, ValueError, AttributeError):
        pass
    return avail


def check_host_memory(load: Any, model: str, batch_size: int) -> None:
    """Before a workload is built on the CPU: record it on ``meta`` (nothing allocated) and refuse,
    with one line that says both figures, if its iteration needs more than the host has available.

    ``load(device)`` builds the workload on ``device``."""
    from ..recorder import RecordingError, record_trace

    avail = available_host_bytes()
    if avail is None:
        return
    w = load("meta")
    try:
        need = record_trace(w.model, w.example_inputs, w.loss_fn, w.make_optimizer, device="meta").peak_bytes
    except RecordingError:  # a network that records only on a real device (bf16 autocast): no estimate
        return
    if need > avail:
        raise ValueError(f"{model} at batch size {batch_size} needs about {format_bytes(need)} of host memory for "
                         f"one iteration on --device cpu; {format_bytes(avail)} is available here (record on "
                         "--device meta, or use a smaller batch)")


def load_trace(path: str) -> Trace:
    return Trace.load(path)


def on_terminal() -> bool:
    return sys.stderr.isatty()


def showing_progress():  # noqa: ANN201
    """The command line's progress reports: every planner run inside the block that takes more than a
    few seconds says what it is doing on standard error (:mod:`dqn_swap.progress`)."""
    from ..progress import showing

    return showing()


def print_table(rows: list[tuple[str, str]]) -> None:
    width = max(len(k) for k, _ in rows)
    for k, v in rows:
        print(f"{k:<{width}}  {v}")


def human(key: str, value: Any) -> str:
    """Format a summary value for people: bytes as GiB/MiB, seconds with units."""
    if value is None:
        return "-"
    if key.endswith("bytes") and isinstance(value, (int, float)):
        return format_bytes(value)
    if key.endswith("_s") and isinstance(value, (int, float)):
        return f"{value * 1e3:.3f} ms" if value < 1 else f"{value:.3f} s"
    if isinstance(value, dict):
        return ", ".join(f"{k} {v}" for k, v in value.items())
    return str(value)


def add_plot_options(p, default: str) -> None:  # noqa: ANN001
    """``--plot PNG`` (``default`` says where it goes otherwise), ``--no-plot`` and ``--force``, as every
    command that draws one PNG has them."""
    p.add_argument("--plot", help=f"PNG to write (default: {default})")
    p.add_argument("--no-plot", action="store_true", help="do not write a plot")
    p.add_argument("--force", action="store_true", help="replace the plot file even if it is not ours")


def plot_path(args, default) -> Any:  # noqa: ANN001
    """The plot to write (checked before any work: :func:`dqn_swap.plots.check_output`), or None with
    ``--no-plot``.  The name as given: a ``Path`` would drop a trailing separator, which names a folder."""
    from ..plots import check_output

    if args.no_plot:
        return None
    return check_output(args.plot if args.plot is not None else default, args.force, png=True)


# ------------------------------------------------------------------------------------------ planner options
def add_planner_options(p: argparse.ArgumentParser) -> None:
    """A flag for every option the registered planners read (their registry entries declare them,
    :mod:`dqn_swap.planner_options`), each saying which planners read it; not given: ``None``."""
    from dqn_swap.agents import planner_options  # importing the agents registers their planners

    from ..planner_options import readers_text

    for _, (o, who) in planner_options().items():
        kwargs: dict = {"default": None, "dest": o.dest, "help": f"{readers_text(who)}: {o.help}"}
        if o.parse is not None:
            kwargs["type"] = _argparse_type(o.parse)
        for key in ("metavar", "choices", "nargs"):
            if getattr(o, key) is not None:
                kwargs[key] = getattr(o, key)
        p.add_argument(*o.names, **kwargs)


def _argparse_type(parse):  # noqa: ANN001, ANN202
    """``parse`` as an argparse type: its ``ValueError`` becomes the one line argparse prints."""
    def typed(text: str):  # noqa: ANN202
        try:
            return parse(text)
        except ValueError as e:
            raise argparse.ArgumentTypeError(str(e)) from None

    typed.__name__ = getattr(parse, "__name__", "value")
    return typed


def planner_values(args: argparse.Namespace) -> dict:
    """The planner options given on the command line: flag's ``dest`` -> value (those not given left out)."""
    from dqn_swap.agents import planner_options

    return {o.dest: getattr(args, o.dest) for o, _ in planner_options().values()
            if getattr(args, o.dest, None) is not None}


def given_flags(args: argparse.Namespace) -> list[str]:
    """The planner options given on the command line, as their flags (``--time-limit``)."""
    from dqn_swap.agents import planner_options

    return [flag for flag, (o, _) in planner_options().items() if getattr(args, o.dest, None) is not None]


def register_named_planners(argv: list[str]) -> None:
    """Register the users' planners that ``--planner`` / ``--planners`` name as ``package.module:name``
    before the parser is made, so that the options they declare are flags too.  A name that does not
    load is left for the command to refuse, in its one line."""
    names = []
    for i, tok in enumerate(argv):
        for flag in ("--planner", "--planners"):
            if tok == flag and i + 1 < len(argv):
                names += argv[i + 1].split(",")
            elif tok.startswith(flag + "="):
                names += tok.partition("=")[2].split(",")
    names = [n.strip() for n in names if ":" in n and n.partition(":")[0] not in ("hf", "gen")]
    if not names:
        return
    from dqn_swap.agents import check_planner_name

    for name in names:
        try:
            check_planner_name(name)
        except Exception:  # noqa: BLE001 -- the command itself says, in its one line, why the name does not load
            pass

