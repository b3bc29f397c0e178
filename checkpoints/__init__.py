"""The shipped agents: agent files (:mod:`dqn_swap.agents.dqn.agent_file`) of trained DQN agents,
installed with the package as data of ``dqn_swap.checkpoints`` (the repository's ``checkpoints/``
folder); ``default.pt`` is the one the ``dqn`` planners read unless given another.  ``README.md``
says how each was trained."""

from importlib.resources import files
from pathlib import Path


def path(name: str) -> Path:
    """The agent file of the shipped agent ``name`` (``"default.pt"``, ``"grid/resnet50.pt"``)."""
    return Path(str(files(__name__) / name))
