"""The shipped DQN agents (package data: ``dqn_swap.checkpoints``); ``README.md`` says how each was trained."""

from importlib.resources import files
from pathlib import Path


def path(name: str) -> Path:
    """The file of shipped agent ``name`` (``"default.pt"``, ``"grid/resnet50.pt"``)."""
    return Path(str(files(__name__) / name))
