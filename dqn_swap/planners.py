"""The planner contract and the one registry of planner names; plans made by hand from tensor lists.

A *planner* maps a recorded :class:`~dqn_swap.trace.Trace`, a memory limit in bytes and a
device profile to a :class:`~dqn_swap.plan.Plan` whose ``figures`` are the simulator's
(:class:`Planner`).  Every planner of the project is reached by its name through this module's
registry: :func:`get_planner` builds one, :func:`planner_names` lists them (by ``kind``),
:func:`planner_help` gives the one-line summary of each for ``--help``.  The core defines the
contract and holds the registry but implements no planner: the planners live on the agents'
side (``dqn_swap.agents``) and register themselves when that package is imported, so that the
core never imports the layers above it.  ``dqn_swap.get_planner`` and the command line import
the agents first.

Kinds of planner:

* ``dqn`` -- the learned planners (the DQN paper's structure2vec agent, greedy or with search, and
  :data:`DEFAULT_PLANNER`, ``auto``, which searches from the agent's plan and the baselines' best);
* ``baseline`` -- the heuristics of the papers the DQN is compared with;
* ``optimal`` -- the exact planner (a mixed-integer program) with its certified bound;
* ``simple`` -- plans made by a fixed rule (swap every activation, recompute every one, swap
  the largest until the plan fits), for experiments and tests.

The second half of the module makes a plan from named tensors (:func:`manual_plan`): the
tensors to swap and to recompute, each acting right after its last forward use, checked and
scheduled by the simulator.  The simple planners are built on it; tests use it directly.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

import numpy as np

from .cost import DeviceProfile, profile_of
from .plan import Action, ActionKind, Plan
from .activations import last_forward_event, saved_activations
from .planner_options import PlannerOption
from .trace import Trace

#: The kinds a planner is registered under, in the order names are listed.
#: ``switch``: what users switch on instead of planning (a framework's checkpointing or offloading flag).
KINDS = ("dqn", "baseline", "switch", "optimal", "simple", "user")

#: The planner every entry point uses unless told otherwise (``dqn_swap.agents.auto``).
DEFAULT_PLANNER = "auto"

#: Planner names that were renamed: old name -> new name (an old name is refused with one line saying so).
RENAMED = {"checkpoint": "sqrt-n"}


@runtime_checkable
class Planner(Protocol):
    """What every planner does: ``plan(trace, memory_limit, profile) -> Plan``.

    ``memory_limit`` is in bytes; ``profile`` is a :class:`~dqn_swap.cost.DeviceProfile`, the name
    of one, or ``None`` for the one the trace was recorded with.  The plan's ``figures`` are the
    simulator's for its actions (``figures["feasible"]`` false for a plan that does not fit).
    """

    name: str

    def plan(self, trace: Trace, memory_limit: int, profile: DeviceProfile | str | None = None) -> Plan:
        """Choose actions for ``trace`` under ``memory_limit``; ``Plan.figures`` are simulated."""
        ...


@dataclass(frozen=True)
class PlannerEntry:
    """One registered planner: its name, how to build it, its kind, its one-line summary and options.

    ``factory(**settings)`` builds the planner; with ``takes_agent`` it also takes ``agent``, the
    agent file the planner reads (``None``: the shipped agent).  ``options``: the settings the
    command line offers as flags (:class:`~dqn_swap.planner_options.PlannerOption`).
    """

    name: str
    factory: Callable[..., Planner]
    kind: str
    summary: str
    takes_agent: bool = False
    options: tuple[PlannerOption, ...] = ()


_REGISTRY: dict[str, PlannerEntry] = {}


def register(name: str, factory: Callable[..., Planner], *, kind: str = "user", summary: str | None = None,
             takes_agent: bool = False, options: Iterable[PlannerOption] = ()) -> None:
    """Register the planner ``name``: ``factory(**settings)`` builds it (see :class:`PlannerEntry`).

    A user's own planner needs only its name and factory: a class or a function that returns an
    object with ``plan(trace, memory_limit, profile=None) -> Plan`` (``memory_limit``: the plan's
    resolved bytes).  Its summary defaults to the first line of the factory's docstring.  Every
    entry point then takes the name: :func:`get_planner`, ``autoplan(planner=...)`` and the command
    line's ``--planner``, which also takes ``package.module:name`` and registers it on the way.
    ``options`` are the settings the command line offers for it as flags
    (:class:`~dqn_swap.planner_options.PlannerOption`); a flag another planner reads must be that
    planner's option itself, so that it means one thing.

    Raises:
        ValueError: the name is taken by another factory, the kind is outside :data:`KINDS`, the
            summary is not one line, or an option's flag means something else for another planner.

    Example::

        dqn_swap.planners.register("keep-all", lambda: KeepAll())
        planned = dqn_swap.autoplan(model, "50%", planner="keep-all")
    """
    if summary is None:
        doc = (getattr(factory, "__doc__", None) or "").strip()
        summary = doc.splitlines()[0] if doc and factory.__doc__ is not type(factory).__doc__ else \
            f"a planner registered by the user ({getattr(factory, '__qualname__', type(factory).__name__)})"
    if not isinstance(name, str) or not name or name in RENAMED:
        raise ValueError(f"a planner's name must be a new non-empty string, not {name!r}")
    if kind not in KINDS:
        raise ValueError(f"planner {name!r}: kind must be one of {', '.join(KINDS)}, not {kind!r}")
    if not summary or "\n" in summary:
        raise ValueError(f"planner {name!r}: the summary must be one line")
    options = tuple(options)
    if not all(isinstance(o, PlannerOption) for o in options):
        raise ValueError(f"planner {name!r}: options must be PlannerOption objects")
    taken: dict[str, tuple[PlannerOption, str]] = {}
    for e in _REGISTRY.values():
        for o in e.options if e.name != name else ():
            for flag in o.names:
                taken.setdefault(flag, (o, e.name))
    for o in options:
        for flag in o.names:
            other = taken.get(flag)
            if flag in ("--agent", "--planner", "--memory-limit", "--profile", "--json", "--keep", "--recompute") or (
                    other is not None and other[0] != o):
                raise ValueError(f"planner {name!r}: its option {flag} is taken"
                                 + (f" by planner {other[1]!r} with another meaning" if other else " by the command line"))
    entry = PlannerEntry(name, factory, kind, summary, takes_agent, options)
    old = _REGISTRY.get(name)
    if old is not None and old != entry:
        raise ValueError(f"planner {name!r} is already registered (kind {old.kind})")
    _REGISTRY[name] = entry


def unregister(name: str) -> None:
    """Remove a planner registered with kind ``user``; the project's own stay.

    Raises:
        ValueError: ``name`` is not a registered user planner.
    """
    entry = _REGISTRY.get(name)
    if entry is None or entry.kind != "user":
        raise ValueError(f"{name!r} is not a planner registered by the user")
    del _REGISTRY[name]


def planner_options(names: Iterable[str] | None = None) -> dict[str, tuple[PlannerOption, tuple[str, ...]]]:
    """Every flag the planners ``names`` (default: all registered) read: flag -> (its option, the
    planners that read it), in registration order."""
    out: dict[str, tuple[PlannerOption, tuple[str, ...]]] = {}
    for n in (planner_names() if names is None else names):
        for o in planner_entry(n).options:
            old = out.get(o.name)
            out[o.name] = (o, (*old[1], n) if old else (n,))
    return out


def settings_from(name: str, values: dict[str, Any]) -> dict[str, Any]:
    """The settings of planner ``name`` from the command line's ``values`` (flag's ``dest`` -> parsed
    value, ``None``: not given): only the options ``name`` reads."""
    out: dict[str, Any] = {}
    for o in planner_entry(name).options:
        value = values.get(o.dest)
        if value is not None:
            out.update(o.settings(value))
    return out


def check_options_apply(planners: Iterable[str], given: Iterable[str]) -> None:
    """Refuse, in one line, a flag in ``given`` that none of ``planners`` reads (``--agent`` with
    ``--planner greedy`` would otherwise be ignored, and the user left believing the agent planned).

    Raises:
        ValueError: names the flag, who reads it, and that the planners chosen do not.
    """
    planners = list(planners)
    every = planner_options()
    readers = {flag: who for flag, (_, who) in every.items()}
    readers["--agent"] = tuple(n for n in planner_names() if planner_entry(n).takes_agent)
    for flag in given:
        who = readers.get(flag, ())
        if set(who) & set(planners):
            continue
        chosen = (f"--planner {planners[0]} does not read it" + (f" (name one that does: --planner {who[0]})" if who else "")
                  if len(planners) == 1 else f"none of the planners chosen ({', '.join(planners)}) reads it")
        raise ValueError(f"{flag} is read by {', '.join(who) or 'no planner'} only, and {chosen}")


def planner_names(kind: str | None = None) -> tuple[str, ...]:
    """The registered planner names, by kind (:data:`KINDS` order) then in registration order;
    with ``kind``, only that kind's."""
    if kind is not None and kind not in KINDS:
        raise ValueError(f"unknown kind of planner {kind!r}; choose one of: {', '.join(KINDS)}")
    kinds = KINDS if kind is None else (kind,)
    return tuple(e.name for k in kinds for e in _REGISTRY.values() if e.kind == k)


def planner_entry(name: str) -> PlannerEntry:
    """The registry's entry of ``name``; an unknown or renamed name raises ``ValueError`` (one line)."""
    entry = _REGISTRY.get(name) if isinstance(name, str) else None
    if entry is not None:
        return entry
    if isinstance(name, str) and ":" in name and name.partition(":")[0] not in ("hf", "gen"):
        return _user_planner(name)
    if isinstance(name, str) and name in RENAMED:
        raise ValueError(f"planner {name!r} is now called {RENAMED[name]!r}")
    if not _REGISTRY:
        raise ValueError(f"unknown planner {name!r}: no planner is registered yet; import dqn_swap.agents "
                         "(dqn_swap.get_planner does) to register them")
    raise ValueError(f"unknown planner {name!r}; choose one of: {', '.join(planner_names())}")


def _user_planner(spec: str) -> PlannerEntry:
    """Register the planner ``package.module:name`` names (module docstring of :func:`register`): a
    factory, or a planner object (anything with a ``plan`` method that is not a class).  A factory's
    ``options`` attribute, where it has one, lists its :class:`PlannerOption` flags."""
    from .user_code import load_attribute

    obj = load_attribute(spec, "planner")
    if callable(getattr(obj, "plan", None)) and not isinstance(obj, type):
        register(spec, lambda: obj, summary=f"{spec}, the user's planner")
    elif callable(obj):
        register(spec, obj, options=getattr(obj, "options", ()))  # a class may declare its flags
    else:
        raise ValueError(f"planner {spec!r} is neither a planner (an object with a plan method) nor a function "
                         "or class that makes one")
    return _REGISTRY[spec]


def check_planner_name(name: str) -> str:
    """``name`` if it is a registered planner's; ``ValueError`` otherwise (see :func:`planner_entry`)."""
    return planner_entry(name).name


def get_planner(name: str, *, agent: str | None = None, pins: Any = None, **settings: Any) -> Planner:
    """The planner called ``name`` with ``settings`` (its own keyword arguments).

    ``agent`` is the agent file of the planners that read one (the learned planners, and the exact
    planner for its ``dqn`` incumbent; default: the shipped agent); the others ignore it.
    ``pins`` (:class:`dqn_swap.pins.Pins`, or its dict): activations every plan must keep or
    recompute; the planner's plans are made to honour them (:func:`enforce_pins`).

    Raises:
        ValueError: an unknown name (the message names the registered ones), a renamed one (it
            names the new name), or a factory that makes no planner.
    """
    entry = planner_entry(name)
    planner = entry.factory(agent=agent, **settings) if entry.takes_agent else entry.factory(**settings)
    if not callable(getattr(planner, "plan", None)):
        raise ValueError(f"planner {name!r}: its factory made a {type(planner).__name__}, which has no "
                         "plan(trace, memory_limit, profile) method")
    if pins:
        from .pins import Pins

        return _Pinned(planner, pins if isinstance(pins, Pins) else Pins.from_dict(pins))
    return planner


class _Pinned:
    """A planner whose plans honour pins (:func:`get_planner`'s ``pins``)."""

    def __init__(self, planner: Planner, pins: Any) -> None:
        self.planner, self.pins = planner, pins
        self.name = getattr(planner, "name", type(planner).__name__)

    def __getattr__(self, attr: str) -> Any:  # the wrapped planner's settings and the rest
        return getattr(self.planner, attr)

    def plan(self, trace: Trace, memory_limit: int, profile: DeviceProfile | str | None = None) -> Plan:
        # Pins that cannot hold are refused before planning.  The planner sees the tensors pinned to
        # stay as ones no plan may move (Trace.movable), so it plans around them; what it cannot know
        # (a recompute it must make) is added after (enforce_pins).
        sets = pinned_sets(trace, self.pins)
        view = trace.replace(meta={**trace.meta, "pinned_keep": sorted(sets[0])}) if sets[0] else trace
        return enforce_pins(trace, self.planner.plan(view, memory_limit, profile), self.pins, profile, resolved=sets)


def planner_help(kind: str | None = None) -> str:
    """Every registered planner (of ``kind``) with its one-line summary, for ``--help``:
    ``"dqn: the trained structure2vec agent's own plan ...; dqn-search: ..."``."""
    return "; ".join(f"{n}: {_REGISTRY[n].summary}" for n in planner_names(kind))


def plan_cost(plan: Plan) -> tuple[bool, float]:
    """Sort key of plans of one trace: plans that fit first, then by simulated overhead (``min`` keeps
    the earlier of equals)."""
    fits = bool(plan.figures.get("feasible"))
    return (not fits, float(plan.figures.get("overhead", np.inf)) if fits else np.inf)


# --------------------------------------------------------------------------- plans made by hand
def recomputable_activations(trace: Trace) -> list[int]:
    """The :func:`saved_activations` a plan may remove for recomputation (the simulator's rules)."""
    from .simulator import Simulator

    sim = Simulator(trace, trace.peak_bytes)
    return [t for t in saved_activations(trace)
            if sim.why_invalid(Action(last_forward_event(trace, t), t, ActionKind.RECOMPUTE)) is None]


def manual_plan(trace: Trace, swap: Iterable[int] = (), recompute: Iterable[int] = (), *,
                memory_limit: int | None = None, planner: str = "manual",
                profile: DeviceProfile | str | None = None) -> Plan:
    """A plan that swaps ``swap`` and recomputes ``recompute`` (tensor ids) right after their last
    forward use, checked and scheduled by the simulator (``ValueError`` names an action it does not
    allow); its figures are the simulator's.

    ``memory_limit`` defaults to the trace's unplanned peak; ``profile`` to the trace's own.
    """
    from .simulator import Simulator

    swap, recompute = list(swap), list(recompute)
    both = sorted(set(swap) & set(recompute))
    if both:
        raise ValueError(f"tensor {both[0]} is both in swap and in recompute: a plan does one or the other")
    limit = int(memory_limit if memory_limit is not None else trace.peak_bytes)
    actions = [Action(last_forward_event(trace, t), int(t), ActionKind.SWAP) for t in swap]
    actions += [Action(last_forward_event(trace, t), int(t), ActionKind.RECOMPUTE) for t in recompute]
    sim = Simulator(trace, limit, profile_of(trace, profile))
    for a in actions:
        why = sim.why_invalid(a)
        if why is not None:
            raise ValueError(why)
    result = sim.run(actions)
    name = sim.profile.name if profile is not None else str(trace.meta.get("profile", ""))
    return Plan(actions=Plan.sorted_actions(actions), memory_limit=limit, trace_fingerprint=trace.fingerprint,
                profile=name, planner=planner, figures=result.figures(), schedule=result.schedule)


def pinned_sets(trace: Trace, pins: Any) -> tuple[frozenset[int], frozenset[int]]:
    """``pins`` (:class:`dqn_swap.pins.Pins`) resolved on ``trace``: the tensor ids kept and recomputed.

    Raises:
        PinError: as :meth:`Pins.resolve <dqn_swap.pins.Pins.resolve>`, or a pinned recompute the
            simulator does not allow.
    """
    from .pins import PinError, maker

    keep, recompute = pins.resolve(trace)
    if recompute:
        bad = sorted(recompute - set(recomputable_activations(trace)))
        if bad:
            raise PinError(f"tensor {bad[0]} (made by {maker(trace, bad[0])}) cannot be recomputed: the "
                           "simulator allows no re-run of it (its inputs are gone by backward, or it is an "
                           "input); pin it to keep, or leave it to the planner")
    return keep, recompute


def enforce_pins(trace: Trace, plan: Plan, pins: Any, profile: DeviceProfile | str | None = None, *,
                 resolved: tuple[frozenset[int], frozenset[int]] | None = None) -> Plan:
    """``plan`` made to honour ``pins`` (module docstring): actions on kept tensors dropped, a pinned
    recompute added where missing (a swap of it replaced), then, if it no longer fits, the largest
    activations left free swapped, one at a time, until it does.  ``plan.settings`` records the pins
    and what was changed (``pins_changed``: actions dropped, added and swaps added to fit).
    ``resolved``: :func:`pinned_sets` of ``pins`` on ``trace``, where the caller has them."""
    import dataclasses

    from .simulator import Simulator

    keep, recompute = resolved if resolved is not None else pinned_sets(trace, pins)
    kept = [a for a in plan.actions if a.tensor not in keep
            and not (a.tensor in recompute and a.kind == ActionKind.SWAP)]
    dropped = len(plan.actions) - len(kept)
    have = {a.tensor for a in kept}
    added = [Action(last_forward_event(trace, t), t, ActionKind.RECOMPUTE) for t in sorted(recompute - have)]
    actions = kept + added
    changed = {"dropped": dropped, "added": len(added), "swaps_to_fit": 0}
    prof = profile_of(trace, profile if profile is not None else (plan.profile or None))
    sim = Simulator(trace, int(plan.memory_limit), prof)
    result = sim.run(actions)  # (figures of the trace itself, whatever view the planner was given)
    if (dropped or added) and not result.feasible and plan.figures.get("feasible"):
        can_swap = sim.valid_actions().can_swap
        free = [t for t in saved_activations(trace) if t not in keep and t not in recompute and t not in have]
        for t in sorted(free, key=lambda t: -int(trace.tensor_nbytes[t])):
            e = last_forward_event(trace, t)
            if not can_swap[e]:
                continue
            actions.append(Action(e, t, ActionKind.SWAP))
            changed["swaps_to_fit"] += 1
            result = sim.run(actions)
            if result.feasible:
                break
    settings = {**plan.settings, "pins": pins.to_dict()}
    if not (dropped or added):
        return dataclasses.replace(plan, settings=settings, figures={**plan.figures, **result.figures()},
                                   schedule=result.schedule)
    settings["pins_changed"] = changed
    return Plan(actions=Plan.sorted_actions(actions), memory_limit=plan.memory_limit,
                trace_fingerprint=plan.trace_fingerprint, profile=plan.profile, planner=plan.planner,
                figures=result.figures(), schedule=result.schedule, settings=settings)


__all__ = ["KINDS", "RENAMED", "Planner", "PlannerEntry", "PlannerOption", "check_options_apply", "check_planner_name",
           "enforce_pins", "get_planner", "planner_options", "settings_from",
           "last_forward_event", "manual_plan", "planner_entry", "pinned_sets", "planner_help", "planner_names",
           "recomputable_activations", "register", "saved_activations", "unregister"]
