"""The shipped agents: agent files (:mod:`dqn_swap.agents.dqn.agent_file`) of trained DQN agents,
installed with the package as data of ``dqn_swap.checkpoints`` (the repository's ``checkpoints/``
folder); ``default.pt`` is the one the ``dqn`` planners read unless given another.  ``README.md``
says how each was trained.

Wherever an agent file is asked for, a shipped agent may be named instead (:func:`find`):
``ensemble``, ``ensemble.pt`` or ``checkpoints/ensemble.pt`` reach the installed file from any
folder, so that the repository's examples work for a pip-installed user too.  A file that exists
under the name given always wins."""

from importlib.resources import files
from pathlib import Path


def path(name: str) -> Path:
    """The agent file of the shipped agent ``name`` (``"default.pt"``, ``"grid/resnet50.pt"``)."""
    return Path(str(files(__name__) / name))


def names() -> list[str]:
    """The shipped agents' names, without ``.pt`` (``"default"``, ``"grid/resnet50"``), sorted."""
    root = files(__name__)
    out = [e.name[:-3] for e in root.iterdir() if e.name.endswith(".pt")]
    grid = root / "grid"
    if grid.is_dir():
        out += [f"grid/{e.name[:-3]}" for e in grid.iterdir() if e.name.endswith(".pt")]
    return sorted(out)


def find(spec: str) -> Path | None:
    """The shipped agent file ``spec`` names, or None: ``spec`` is a shipped agent's name, with or
    without ``.pt`` and with or without a leading ``checkpoints/`` (``ensemble``,
    ``checkpoints/ensemble.pt``, ``grid/resnet50``)."""
    name = spec.replace("\\", "/")
    if name.startswith("./"):
        name = name[2:]
    if name.startswith("checkpoints/"):
        name = name[len("checkpoints/"):]
    if name.endswith(".pt"):
        name = name[:-3]
    return path(f"{name}.pt") if name in names() else None
