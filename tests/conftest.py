import pytest
import torch

from dqn_swap.recorder import record_trace


class TinyMLP(torch.nn.Module):
    """Linear(8, 16) - ReLU - Linear(16, 4): small enough to write its trace by hand."""

    def __init__(self) -> None:
        super().__init__()
        self.fc1 = torch.nn.Linear(8, 16)
        self.act = torch.nn.ReLU()
        self.fc2 = torch.nn.Linear(16, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(self.act(self.fc1(x)))


def record_mlp(device: str = "meta"):
    torch.manual_seed(0)
    model = TinyMLP()
    return record_trace(model, torch.randn(2, 8), lambda y: y.pow(2).mean(),
                        lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9), device=device)


@pytest.fixture(scope="session")
def mlp_trace():
    return record_mlp("meta")


@pytest.fixture(scope="session")
def tiny_resnet_trace():
    from dqn_swap.models import build_workload

    w = build_workload("resnet_tiny", 4, "meta")
    return record_trace(w.model, w.example_inputs, w.loss_fn, w.make_optimizer, device="meta",
                        inputs="released", meta={"model": "resnet_tiny", "batch_size": 4})


def pytest_collection_finish(session) -> None:  # noqa: ANN001
    """Everything made by imports and collection (torch, transformers, the parametrized cases) is moved
    out of the garbage collector's reach: every later ``gc.collect()`` (the memory measurements make one
    before each measured iteration) scans only what the tests make, in milliseconds instead of a tenth of
    a second or more.  Those objects live to the end of the session anyway."""
    import gc

    gc.collect()
    gc.freeze()


# --------------------------------------------------------------------------- tests that start processes
# A test that starts another process (a command, a worker, a distributed group) is marked
# ``subprocess``, so that ``pytest -m "not subprocess"`` runs the in-process suite alone.  The mark is
# checked, not trusted: a test that starts a process without it fails at its teardown.
_started: list[str] = []


def _noting(what: str, start):  # noqa: ANN001, ANN202
    def started(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202
        _started.append(what)
        return start(*args, **kwargs)

    return started


def pytest_configure(config) -> None:  # noqa: ANN001
    import multiprocessing.process
    import subprocess

    try:
        # matplotlib builds its font cache on first use with `fc-list` (a process): on a fresh machine,
        # here, before the check below, rather than inside whichever test plots first.
        import matplotlib.font_manager  # noqa: F401
    except ImportError:
        pass
    subprocess.Popen.__init__ = _noting("subprocess", subprocess.Popen.__init__)
    multiprocessing.process.BaseProcess.start = _noting("multiprocessing", multiprocessing.process.BaseProcess.start)


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item) -> None:  # noqa: ANN001
    _started.clear()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):  # noqa: ANN001, ANN201
    outcome = yield
    if call.when == "teardown" and _started and item.get_closest_marker("subprocess") is None:
        what = sorted(set(_started))
        _started.clear()
        report = outcome.get_result()
        report.outcome = "failed"
        report.longrepr = (f"{item.nodeid} started a process ({', '.join(what)}) and is not marked "
                           "@pytest.mark.subprocess")
