"""Agent files: a trained agent's weights, configuration, format version, training traces' fingerprints.

An agent file (``.pt``; the shipped agents are in ``dqn_swap.checkpoints``) is a
``torch.save`` of plain containers and tensors only, so it loads with
``torch.load(weights_only=True)`` and cannot run code::

    {"format": "dqn-swap-agent", "version": 1,
     "config": {... DQNConfig ...}, "state_dict": {...},
     "trace_fingerprints": [...], "training": {...}}

An *ensemble* file (:func:`save_ensemble`) holds two or more agents of one environment, each
as above, and plans by the mean of their Q-values
(:class:`~dqn_swap.agents.dqn.policy.QEnsemble`)::

    {"format": "dqn-swap-ensemble", "version": 1, "members": [{... an agent file's dict ...}, ...],
     "sources": ["the members' file names", ...],
     "training": {... the record of a fine-tuning of the ensemble as a whole, if any ...}}

:func:`load_agent` reads both kinds, so an ensemble file goes wherever an agent file does;
fine-tuning an ensemble (``finetune``, ``train(init_from=...)``) trains the mean of its members'
Q-values and writes an ensemble file again (:func:`save_trained_ensemble`).

Any problem (missing file, not an agent file, other version, corrupt weights)
raises :class:`AgentFileError` with one line naming the file.  Saving never
replaces an existing file unless ``overwrite=True``, and writes through a
temporary file so a crash never leaves half a file under the real name.
"""

from __future__ import annotations

import io
import os
import pickle
import re
import warnings
from pathlib import Path
from typing import Any

import torch

from dqn_swap import checkpoints as shipped
from dqn_swap.errors import DqnSwapInputError
from dqn_swap.files import not_a_regular_file, other_kind, unreadable, write_atomically

from .config import DQNConfig
from .policy import QEnsemble, QNetwork

FORMAT = "dqn-swap-agent"
VERSION = 1
RESUME_FORMAT = "dqn-swap-agent-resume"
ENSEMBLE_FORMAT = "dqn-swap-ensemble"


class AgentFileError(DqnSwapInputError):
    """An agent file that cannot be used; the message is one line naming the file."""


def _atomic_save(obj: Any, path: Path, overwrite: bool) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    buf = io.BytesIO()
    torch.save(obj, buf)
    return write_atomically(path, buf.getvalue(), overwrite=overwrite)


def save_agent(path: str | os.PathLike[str], net: QNetwork, config: DQNConfig, *,
               trace_fingerprints: list[str], training: dict[str, Any] | None = None,
               overwrite: bool = False) -> Path:
    """Write an agent file (see the module docstring)."""
    obj = {"format": FORMAT, "version": VERSION, "config": config.to_dict(), "state_dict": _weights(net),
           "trace_fingerprints": list(trace_fingerprints), "training": dict(training or {})}
    return _atomic_save(obj, Path(path), overwrite)


def _weights(net: torch.nn.Module) -> dict[str, torch.Tensor]:
    """``net``'s state dict as CPU copies, detached: what an agent file stores."""
    return {k: v.detach().cpu().clone() for k, v in net.state_dict().items()}


def _why_unreadable(path: Path, e: Exception) -> str:
    """One line for a file ``torch.load`` failed on: another of dqn-swap's files; code the
    weights-only unpickler refused (torch's own message opens with advice to load with
    ``weights_only=False``, which would run it); a record claiming more memory than there is; or
    damage, which fails in many ways inside torch.load (a bad zip entry, a record that does not fit
    the unpickler's stack, ...)."""
    other = other_kind(path, "agent")
    if other:
        return other
    if isinstance(e, pickle.UnpicklingError):
        found = re.search(r"GLOBAL ([\w.]+)", str(e))
        if found:
            return (f"{path}: not a dqn-swap agent file: it holds a Python object ({found.group(1)}) that "
                    "dqn-swap never loads, since loading it could run code")
        return (f"{path}: not a dqn-swap agent file (not tensors and plain values that torch reads without "
                "running code)")
    if isinstance(e, MemoryError):
        return f"{path}: corrupt agent file, or one too large for this machine ({str(e)[:120]})"
    first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
    return f"{path}: corrupt or truncated agent file ({first[:120]})"


def _load_raw(path: Path, fmt: str | tuple[str, ...]) -> dict[str, Any]:
    special = not_a_regular_file(path)
    if special:
        raise AgentFileError(special)
    try:
        with warnings.catch_warnings():
            # a damaged file can make torch warn of an unusual pickle protocol before it fails; the
            # failure is said in one line below, and a sound file raises no warning
            warnings.simplefilter("ignore", UserWarning)
            obj = torch.load(path, map_location="cpu", weights_only=True)
    except OSError as e:
        raise AgentFileError(unreadable(path, e, "agent", f" (shipped agents: {', '.join(shipped.names())})")
                             or _why_unreadable(path, e)) from None
    except Exception as e:  # noqa: BLE001: any failure to decode the file is the file's, said in one line
        raise AgentFileError(_why_unreadable(path, e)) from None
    if not isinstance(obj, dict) or obj.get("format") not in ((fmt,) if isinstance(fmt, str) else fmt):
        raise AgentFileError(f"{path}: not a dqn-swap agent file")
    if obj.get("version") != VERSION:
        raise AgentFileError(f"{path}: agent file format version {obj.get('version')} is not supported "
                              f"(this dqn-swap reads version {VERSION})")
    return obj


#: The configuration fields that make an agent's environment and its rewards: the agents of an
#: ensemble must agree on them, since they read the same observations (:func:`load_ensemble`).
ENVIRONMENT_FIELDS = ("graph", "recompute_chains", "max_chain", "reward", "infeasible_penalty", "invalid_penalty",
                      "reward_scale")


def _network(obj: Any) -> tuple[QNetwork, DQNConfig]:
    """The network and config of one agent's dict; raises KeyError, TypeError, ValueError or RuntimeError."""
    config = DQNConfig.from_dict(dict(obj["config"]))
    net = QNetwork(config)
    net.load_state_dict(obj["state_dict"])
    bad = [k for k, v in obj["state_dict"].items() if isinstance(v, torch.Tensor) and not torch.isfinite(v).all()]
    if bad:
        raise ValueError(f"weights {bad[0]} are not finite (NaN or infinity)")
    return net.eval(), config


def environment_difference(a: DQNConfig, b: DQNConfig, fields: tuple[str, ...] = ENVIRONMENT_FIELDS) -> str | None:
    """The first of ``fields`` on which ``a`` and ``b`` differ, as ``"FIELD A's value, not B's value"``; None: none."""
    field = next((f for f in fields if getattr(a, f) != getattr(b, f)), None)
    return None if field is None else f"{field} {getattr(a, field)!r}, not {getattr(b, field)!r}"


def _check_environments(configs: list[DQNConfig], names: list[str]) -> None:
    for c, name in zip(configs[1:], names[1:]):
        diff = environment_difference(c, configs[0])
        if diff:
            raise AgentFileError(f"{name}: plans in another environment than {names[0]} ({diff}); an ensemble's "
                                 "agents must agree on " + ", ".join(ENVIRONMENT_FIELDS))


def ensemble_training(members: list[dict[str, Any]], sources: list[str],
                      finetuned: dict[str, Any] | None = None) -> dict[str, Any]:
    """An ensemble's training record: its members' training environments together, and those of
    the ensemble's own fine-tuning (``finetuned``) if any (``environments``), each member's record
    (``members``), where each came from (``sources``) and the fine-tuning's record (``finetuned``)."""
    records = [m.get("training", {}) for m in members] + ([finetuned] if finetuned else [])
    out = {"environments": sorted({str(e) for r in records for e in r.get("environments", [])}),
           "members": [dict(m.get("training", {})) for m in members], "sources": sources}
    if finetuned:
        out["finetuned"] = dict(finetuned)
    return out


def agent_location(spec: str | os.PathLike[str]) -> Path:
    """Where the agent ``spec`` names is: the file ``spec`` if anything exists there, else the
    shipped agent it names (:func:`dqn_swap.checkpoints.find`), else ``spec`` itself (whose loading
    then says there is no such file and which agents are shipped)."""
    path = Path(spec)
    if os.path.lexists(path):
        return path
    return shipped.find(str(spec)) or path


def load_agent(path: str | os.PathLike[str]) -> tuple[QNetwork | QEnsemble, DQNConfig, dict[str, Any]]:
    """``(network, config, the file's dict)``; raises :class:`AgentFileError`.

    For an ensemble file, the network is the :class:`~dqn_swap.agents.dqn.policy.QEnsemble` of its
    agents, the config the first agent's, and the dict's ``training`` holds the members' training
    environments together (``environments``) and each member's record (``members``).

    ``path`` may also name a shipped agent (``ensemble``, ``checkpoints/ensemble.pt``) where no
    file of that name exists (:func:`agent_location`)."""
    path = agent_location(path)
    obj = _load_raw(path, (FORMAT, ENSEMBLE_FORMAT))
    try:
        if obj["format"] == ENSEMBLE_FORMAT:
            members = list(obj["members"])
            if len(members) < 2:
                raise ValueError("an ensemble needs at least two agents")
            loaded = [_network(m) for m in members]
            sources = [str(x) for x in obj.get("sources", [f"agent {i}" for i in range(len(members))])]
            _check_environments([c for _, c in loaded], [f"{path}: {s}" for s in sources])
            training = ensemble_training(members, sources, obj.get("training") or None)
            return (QEnsemble([n for n, _ in loaded]).eval(), _ensemble_config([c for _, c in loaded]),
                    {**obj, "training": training})
        net, config = _network(obj)
    except AgentFileError:
        raise
    except (KeyError, TypeError, ValueError, RuntimeError) as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise AgentFileError(f"{path}: corrupt agent file ({first[:160]})") from None
    return net, config, obj


def load_ensemble(paths: "list[str | os.PathLike[str]]") -> tuple[QEnsemble, DQNConfig, list[dict[str, Any]]]:
    """``(the mean of the agents' Q-values, the config it plans with, the files' dicts)`` for two or
    more agent files (:class:`~dqn_swap.agents.dqn.policy.QEnsemble`); raises
    :class:`AgentFileError` naming the file when one does not load, is itself an ensemble, or plans
    in another environment than the first (a field of :data:`ENVIRONMENT_FIELDS` differs)."""
    if len(paths) < 2:
        raise AgentFileError("an ensemble needs at least two agent files")
    nets, configs, objs = [], [], []
    for path in paths:
        net, c, obj = load_agent(path)
        if isinstance(net, QEnsemble):
            raise AgentFileError(f"{path}: is an ensemble already; name its agents instead")
        nets.append(net)
        configs.append(c)
        objs.append(obj)
    _check_environments(configs, [str(p) for p in paths])
    return QEnsemble(nets).eval(), _ensemble_config(configs), objs


def _same_weights(a: torch.nn.Module, b: torch.nn.Module) -> bool:
    sa, sb = a.state_dict(), b.state_dict()
    return sa.keys() == sb.keys() and all(sa[k].shape == sb[k].shape and torch.equal(sa[k], sb[k]) for k in sa)


def _ensemble_config(configs: list[DQNConfig]) -> DQNConfig:
    """The config an ensemble plans with: the first agent's, with the observation's ``swap_slack``
    column computed when any member reads it."""
    return configs[0].replace(swap_slack=any(c.swap_slack for c in configs))


def save_ensemble(path: str | os.PathLike[str], agents: "list[str | os.PathLike[str]]", *,
                  overwrite: bool = False) -> Path:
    """Write the ensemble of two or more agent files of one environment as one file (the module
    docstring); raises :class:`AgentFileError` as :func:`load_ensemble` does, and when two of the
    files hold the same weights (planning in memory, :class:`QEnsemble` takes copies as the mean of
    equal Q-values; written to a file, they are a slip)."""
    net, _, objs = load_ensemble(agents)
    for i, member in enumerate(net.members):
        for earlier, other in zip(agents, net.members[:i]):
            if _same_weights(member, other):  # a file named twice, or a copy: most likely a slip
                raise AgentFileError(f"{agents[i]}: the same agent as {earlier} (equal weights): an ensemble of "
                                     "copies plans as the agent alone; name different agents")
    obj = {"format": ENSEMBLE_FORMAT, "version": VERSION, "members": objs,
           "sources": [Path(p).name for p in agents]}
    return _atomic_save(obj, Path(path), overwrite)


def save_trained_ensemble(path: str | os.PathLike[str], net: QEnsemble, source: dict[str, Any], *,
                          trace_fingerprints: list[str], training: dict[str, Any],
                          overwrite: bool = False) -> Path:
    """Write ``net``, an ensemble trained as a whole from the ensemble file whose loaded dict is
    ``source`` (:func:`load_agent`'s third value), as an ensemble file: each member keeps its
    configuration, fingerprints and training record, with its new weights; the file's ``training``
    is this fine-tuning's record (with the one before it, if the ensemble was fine-tuned before,
    under ``previous``) and the fine-tuning traces' fingerprints."""
    members = [{**m, "state_dict": _weights(member)} for m, member in zip(source["members"], net.members)]
    before = source.get("training", {}).get("finetuned")
    record = {**training, "trace_fingerprints": list(trace_fingerprints)} | ({"previous": before} if before else {})
    obj = {"format": ENSEMBLE_FORMAT, "version": VERSION, "members": members,
           "sources": list(source.get("sources", [])), "training": record}
    return _atomic_save(obj, Path(path), overwrite)


def save_resume(path: Path, state: dict[str, Any]) -> Path:
    """Training state for ``resume=True`` (always replaced: it is ours)."""
    return _atomic_save({"format": RESUME_FORMAT, "version": VERSION, **state}, path, overwrite=True)


def load_resume(path: Path) -> dict[str, Any]:
    return _load_raw(path, RESUME_FORMAT)


def resume_path(out_path: str | os.PathLike[str]) -> Path:
    p = Path(out_path)
    return p.with_name(p.name + ".resume")
