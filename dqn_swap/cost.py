"""Cost model: device profiles that price compute and host-device transfers.

Every time in dqn-swap comes from one :class:`DeviceProfile`:

* **compute** -- a roofline (Williams et al., 2009):
  ``t = launch + max(flops / peak, bytes_moved / memory_bandwidth)``, with
  ``flops`` from :mod:`torch.utils.flop_counter` and ``bytes_moved`` the bytes
  the op reads and writes.  Matrix ops (convolution, matmul) run at the
  tensor-core or SIMT matrix rate, everything else at the vector rate.  Peak
  rates are derated by ``efficiency``: kernels rarely reach the datasheet.
* **transfer** -- ``t = latency + bytes / bandwidth`` per direction.  With
  ``duplex`` the device-to-host and host-to-device copy engines run at the
  same time; without it one engine serves both directions in turn.
* **recompute** -- re-running the producing op, so its compute time.
* **collectives** (FSDP2's all-gathers and reduce-scatters) -- ``t = latency +
  bytes / interconnect_bandwidth``, with the bytes one rank sends in a ring
  algorithm (Patarasuk and Yuan, 2009): ``B (w - 1) / w`` for an all-gather or a
  reduce-scatter of ``B`` bytes over ``w`` ranks, twice that for an all-reduce.

The profiles are the machines of the papers: the DQN paper's GTX 1080 Ti on
PCIe 3, the offloading paper's V100 on PCIe 3 (about 12 GB/s measured, its
section 6), the window paper's V100 on NVLink 2 (2 x 50 GB/s), and the
A100 / H100 on PCIe 4 / 5.  On a GPU :func:`measure_profile` replaces the
transfer figures with a pinned-copy bandwidth test.
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass
from typing import Any

import numpy as np

GB = 1e9
TFLOP = 1e12


@dataclass(frozen=True)
class DeviceProfile:
    """Rates of one GPU and its link to the host.

    Attributes:
        name: key in :data:`PROFILES`.
        description: one line for ``--help`` and reports.
        matrix_flops: peak FLOP/s of convolution and matmul kernels.
        vector_flops: peak FLOP/s of elementwise and reduction kernels.
        memory_bandwidth: device-memory bytes per second.
        d2h_bandwidth: device-to-host (swap-out) bytes per second, pinned memory.
        h2d_bandwidth: host-to-device (prefetch) bytes per second, pinned memory.
        duplex: whether both directions copy at once (two copy engines).
        memory_bytes: device memory, the physical limit.
        efficiency: fraction of the peak compute and memory rates kernels reach.
        launch_overhead: seconds added to every op (kernel launch).
        transfer_latency: seconds added to every copy and every collective.
        interconnect_bandwidth: bytes per second one rank sends (and receives) in a collective
            between data-parallel ranks (NCCL's "bus bandwidth"): an all-gather or a
            reduce-scatter over ``w`` ranks of a ``B``-byte buffer moves ``B (w - 1) / w`` bytes
            per rank (:meth:`collective_time`).  Estimates for the profiles' machines
            (peer-to-peer over their links); :func:`measure_collective_bandwidth` measures the
            process group at hand.
    """

    name: str
    description: str
    matrix_flops: float
    vector_flops: float
    memory_bandwidth: float
    d2h_bandwidth: float
    h2d_bandwidth: float
    duplex: bool
    memory_bytes: int
    efficiency: float = 0.7
    launch_overhead: float = 5e-6
    transfer_latency: float = 10e-6
    interconnect_bandwidth: float = 10 * GB

    def __post_init__(self) -> None:
        import math

        for name in ("name", "description"):
            if not isinstance(getattr(self, name), str):
                raise ValueError(f"device profile: {name} is {getattr(self, name)!r}, not a string")
        if not isinstance(self.duplex, bool):
            raise ValueError(f"device profile {self.name}: duplex is {self.duplex!r}, not true or false")
        for name in ("matrix_flops", "vector_flops", "memory_bandwidth", "d2h_bandwidth", "h2d_bandwidth",
                     "memory_bytes", "efficiency", "launch_overhead", "transfer_latency",
                     "interconnect_bandwidth"):
            value = getattr(self, name)
            positive = name not in ("launch_overhead", "transfer_latency")
            if (isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value)
                    or value < 0 or (positive and value == 0) or (name == "efficiency" and value > 1)):
                want = "in (0, 1]" if name == "efficiency" else "a positive number" if positive else "a number >= 0"
                raise ValueError(f"device profile {self.name}: {name} is {value!r}, not {want}")

    def compute_time(self, flops: np.ndarray | float, bytes_moved: np.ndarray | float,
                     is_matrix: np.ndarray | bool) -> np.ndarray:
        """Roofline time of ops (vectorised over arrays)."""
        flops = np.asarray(flops, dtype=np.float64)
        rate = np.where(is_matrix, self.matrix_flops, self.vector_flops) * self.efficiency
        mem = np.asarray(bytes_moved, dtype=np.float64) / (self.memory_bandwidth * self.efficiency)
        return self.launch_overhead + np.maximum(flops / rate, mem)

    def transfer_time(self, nbytes: np.ndarray | float, direction: str) -> np.ndarray | float:
        """Seconds to copy ``nbytes`` in ``direction`` ("d2h" or "h2d")."""
        if direction == "d2h":
            bw = self.d2h_bandwidth
        elif direction == "h2d":
            bw = self.h2d_bandwidth
        else:
            raise ValueError(f"direction must be 'd2h' or 'h2d', not {direction!r}")
        return self.transfer_latency + np.asarray(nbytes, dtype=np.float64) / bw

    def collective_time(self, wire_bytes: np.ndarray | float) -> np.ndarray | float:
        """Seconds of a collective that sends ``wire_bytes`` per rank (the ring algorithms' cost,
        ``latency + bytes / bandwidth``; the recorder computes the bytes per collective)."""
        return self.transfer_latency + np.asarray(wire_bytes, dtype=np.float64) / self.interconnect_bandwidth

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "DeviceProfile":
        fields = {f.name for f in dataclasses.fields(cls)}
        unknown = set(d) - fields
        if unknown:
            raise ValueError(f"unknown device-profile fields: {', '.join(sorted(unknown))}")
        return cls(**d)


# Datasheet figures (FP32 SIMT / tensor-core TF32 dense where the GPU has it).
PROFILES: dict[str, DeviceProfile] = {
    p.name: p
    for p in [
        DeviceProfile("gtx1080ti-pcie3", "GTX 1080 Ti, PCIe 3 x16 (the DQN paper's machine)",
                      matrix_flops=11.3 * TFLOP, vector_flops=11.3 * TFLOP, memory_bandwidth=484 * GB,
                      d2h_bandwidth=12 * GB, h2d_bandwidth=12 * GB, duplex=True,
                      memory_bytes=11 * 1024**3, interconnect_bandwidth=10 * GB),
        DeviceProfile("v100-pcie3", "V100 16 GB, PCIe 3 at ~12 GB/s (offloading paper, section 6)",
                      matrix_flops=15.7 * TFLOP, vector_flops=15.7 * TFLOP, memory_bandwidth=900 * GB,
                      d2h_bandwidth=12 * GB, h2d_bandwidth=12 * GB, duplex=True,
                      memory_bytes=16 * 1024**3, interconnect_bandwidth=10 * GB),
        DeviceProfile("v100-nvlink", "V100 16 GB, NVLink 2 at 2 x 50 GB/s (window paper's machine)",
                      matrix_flops=15.7 * TFLOP, vector_flops=15.7 * TFLOP, memory_bandwidth=900 * GB,
                      d2h_bandwidth=50 * GB, h2d_bandwidth=50 * GB, duplex=True,
                      memory_bytes=16 * 1024**3, interconnect_bandwidth=50 * GB),
        DeviceProfile("a100-pcie4", "A100 40 GB, PCIe 4 at ~25 GB/s",
                      matrix_flops=156 * TFLOP, vector_flops=19.5 * TFLOP, memory_bandwidth=1555 * GB,
                      d2h_bandwidth=25 * GB, h2d_bandwidth=25 * GB, duplex=True,
                      memory_bytes=40 * 1024**3, interconnect_bandwidth=20 * GB),
        DeviceProfile("h100-pcie5", "H100 80 GB, PCIe 5 at ~53 GB/s",
                      matrix_flops=378 * TFLOP, vector_flops=51 * TFLOP, memory_bandwidth=2000 * GB,
                      d2h_bandwidth=53 * GB, h2d_bandwidth=53 * GB, duplex=True,
                      memory_bytes=80 * 1024**3, interconnect_bandwidth=40 * GB),
    ]
}
DEFAULT_PROFILE = "v100-pcie3"


def get_profile(name: str) -> DeviceProfile:
    """The profile called ``name``; unknown names raise a one-line ``ValueError``."""
    try:
        return PROFILES[name]
    except KeyError:
        raise ValueError(f"unknown device profile {name!r}; choose one of: {', '.join(PROFILES)}"
                         " (or 'measured' on a GPU)") from None


def profile_of(trace: Any, profile: str | DeviceProfile | None = None) -> DeviceProfile:
    """The profile to plan ``trace`` with: ``profile`` if given, else the one it was recorded with.

    A trace recorded with a measured profile carries its figures
    (``meta["profile_params"]``), so it can be planned on any machine later.
    """
    if isinstance(profile, DeviceProfile):
        return profile
    params = trace.meta.get("profile_params")
    recorded = trace.meta.get("profile")
    if profile is None or (profile == recorded and profile not in PROFILES):
        if params:
            return DeviceProfile.from_dict(params)
        profile = recorded or DEFAULT_PROFILE
    return get_profile(profile)


def measure_transfer_bandwidth(nbytes: int = 256 * 1024**2, repeats: int = 5,
                               device: str = "cuda") -> dict[str, float]:
    """Pinned-memory copy bandwidth of ``device``: each direction alone and both at once.

    Returns bytes per second: ``d2h``, ``h2d`` and ``concurrent`` (per direction
    while the other runs on a second stream).  Medians over ``repeats``.
    """
    import torch

    if not torch.cuda.is_available():
        raise RuntimeError("measuring a device profile needs a CUDA GPU; none is available")
    dev = torch.empty(nbytes, dtype=torch.uint8, device=device)
    dev2 = torch.empty_like(dev)
    host = torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)
    host2 = torch.empty_like(host, pin_memory=True)
    s1, s2 = torch.cuda.Stream(), torch.cuda.Stream()

    def timed(fn) -> float:
        times = []
        for _ in range(repeats + 1):  # the first run warms up the copy engines
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            fn()
            torch.cuda.synchronize()  # copies are asynchronous: wait to read the clock
            times.append(time.perf_counter() - t0)
        return float(np.median(times[1:]))

    def both() -> None:
        with torch.cuda.stream(s1):
            host.copy_(dev, non_blocking=True)
        with torch.cuda.stream(s2):
            dev2.copy_(host2, non_blocking=True)

    d2h = nbytes / timed(lambda: host.copy_(dev, non_blocking=True))
    h2d = nbytes / timed(lambda: dev.copy_(host, non_blocking=True))
    concurrent = nbytes / timed(both)
    return {"d2h": d2h, "h2d": h2d, "concurrent": concurrent}


def measure_profile(device: str = "cuda", base: str | None = None) -> DeviceProfile:
    """A profile of the local GPU: measured copy bandwidths over a datasheet base.

    Op durations of a CUDA recording are measured directly (CUDA events), so
    only the transfer figures matter here.  ``duplex`` is true when copying both
    ways at once keeps at least 75% of the one-way rate.
    """
    import torch

    bw = measure_transfer_bandwidth(device=device)
    props = torch.cuda.get_device_properties(device)
    ref = get_profile(base or _closest_profile(props.name))
    duplex = bw["concurrent"] >= 0.75 * min(bw["d2h"], bw["h2d"])
    return dataclasses.replace(
        ref, name="measured", description=f"{props.name}, measured copy bandwidth",
        d2h_bandwidth=bw["concurrent"] if duplex else bw["d2h"],
        h2d_bandwidth=bw["concurrent"] if duplex else bw["h2d"],
        duplex=duplex, memory_bytes=int(props.total_memory))


def measure_collective_bandwidth(nbytes: int = 16 * 1024**2, repeats: int = 5, group: Any = None,
                                 device: str | None = None) -> float:
    """Bytes per second one rank sends in an all-gather of ``group`` (default: the default process
    group), for :attr:`DeviceProfile.interconnect_bandwidth`: ``nbytes (w - 1) / w`` over the median
    time of ``repeats`` all-gathers into an ``nbytes`` buffer (after one warm-up).  Every rank of the
    group must call it; ``device`` defaults to cuda under nccl, else the cpu."""
    import torch
    import torch.distributed as dist

    if not dist.is_available() or not dist.is_initialized():
        raise RuntimeError("measuring the collective bandwidth needs an initialised torch.distributed process group")
    world = dist.get_world_size(group)
    if world < 2:
        raise ValueError("measuring the collective bandwidth needs at least 2 ranks")
    if device is None:
        device = "cuda" if dist.get_backend(group) == "nccl" else "cpu"
    chunk = max(1, nbytes // world)
    out = torch.empty(chunk * world, dtype=torch.uint8, device=device)
    inp = torch.ones(chunk, dtype=torch.uint8, device=device)
    times = []
    for _ in range(repeats + 1):
        dist.barrier(group)
        if device.startswith("cuda"):
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        dist.all_gather_into_tensor(out, inp, group=group)
        if device.startswith("cuda"):
            torch.cuda.synchronize()  # the collective is asynchronous: wait to read the clock
        times.append(time.perf_counter() - t0)
    return chunk * (world - 1) / float(np.median(times[1:]))


def _closest_profile(gpu_name: str) -> str:
    name = gpu_name.lower()
    for key, profile in [("h100", "h100-pcie5"), ("h200", "h100-pcie5"), ("a100", "a100-pcie4"),
                         ("v100", "v100-pcie3"), ("1080", "gtx1080ti-pcie3")]:
        if key in name:
            return profile
    return "a100-pcie4"
