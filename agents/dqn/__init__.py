"""The structure2vec DQN agent of the DQN paper (sections 4.4-4.10).

Modules, Stable-Baselines3 style:

* :mod:`.policy` -- the network: :class:`S2VConv` (Eq. 1), :class:`QNetwork` (Eq. 2-3);
* :mod:`.buffer` -- experience replay (uniform or prioritised) and n-step returns;
* :mod:`.algorithm` -- fitted Q-iteration (Eq. 4-5, Algorithm 1): :func:`train`, :func:`finetune`;
* :mod:`.agent_file` -- saving and loading agent files (:class:`AgentFileError`);
* :mod:`.planner` -- :class:`DQNPlanner` (``dqn``) and :class:`DQNSearchPlanner` (``dqn-search``).
"""

from .agent_file import AgentFileError, load_agent, save_agent, save_ensemble
from .config import DQNConfig
from .planner import DEFAULT_AGENT, DQNPlanner, DQNSearchPlanner
from .policy import QEnsemble, QNetwork, S2VConv


def train(*args, **kwargs):  # noqa: ANN002, ANN003, ANN201
    """See :func:`dqn_swap.agents.dqn.algorithm.train`."""
    from .algorithm import train as _train

    return _train(*args, **kwargs)


def finetune(*args, **kwargs):  # noqa: ANN002, ANN003, ANN201
    """See :func:`dqn_swap.agents.dqn.algorithm.finetune`."""
    from .algorithm import finetune as _finetune

    return _finetune(*args, **kwargs)


__all__ = ["DEFAULT_AGENT", "AgentFileError", "DQNConfig", "DQNPlanner", "DQNSearchPlanner", "QEnsemble", "QNetwork",
           "S2VConv", "finetune", "load_agent", "save_agent", "save_ensemble", "train"]
