"""The exact planner ``optimal``: joint keep / swap / recompute as a mixed-integer program (HiGHS).

:mod:`.program` derives the program from the simulator's model, a relaxation of
it (the argument is in its docstring; :mod:`.exhaustive` checks it against every
plan of small traces); :mod:`.solver` runs HiGHS (SciPy's binding) silenced at
the file-descriptor level, from starting plans, under a CPU-time limit;
:mod:`.planner` seeds it with every cheap planner's plan, solves in rounds of row
generation and reports the certified bound.
"""

from .planner import OptimalPlanner
from .candidates import Candidate, candidates, critical_ops
from .program import ProgramSize, SwapProgram

__all__ = ["Candidate", "OptimalPlanner", "ProgramSize", "SwapProgram", "candidates", "critical_ops"]
