"""The exact planner ``optimal``: joint keep / swap / recompute as a mixed-integer program (HiGHS).

:mod:`.program` derives the program from the simulator's model; :mod:`.solver`
runs ``scipy.optimize.milp`` with a live progress line; :mod:`.planner` solves
in rounds of row generation and reports the certified bound.
"""

from .planner import OptimalPlanner
from .program import Candidate, ProgramSize, SwapProgram, candidates, critical_ops

__all__ = ["Candidate", "OptimalPlanner", "ProgramSize", "SwapProgram", "candidates", "critical_ops"]
