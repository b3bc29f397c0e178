"""The package list, found in the tree rather than listed by hand (pyproject.toml holds the rest).

The repository's top-level folders ``env/``, ``agents/`` and ``checkpoints/`` install inside the
``dqn_swap`` package (pyproject.toml says why).  Every folder with an ``__init__.py`` under them is
a package of the wheel: a new one is never left out, as ``dqn_swap/simulator/`` once was from a
hand-written list.
"""

from setuptools import find_packages, setup

#: installed name -> folder of the repository
ROOTS = {"dqn_swap": "dqn_swap", "dqn_swap.env": "env", "dqn_swap.agents": "agents",
         "dqn_swap.checkpoints": "checkpoints"}
INSIDE = {"env", "agents", "checkpoints"}  # links a benchmark snapshot may make inside dqn_swap/

packages = []
for name, folder in ROOTS.items():
    packages.append(name)
    packages += [f"{name}.{p}" for p in find_packages(folder)
                 if not (folder == "dqn_swap" and p.split(".")[0] in INSIDE)]

setup(packages=packages, package_dir=ROOTS)
