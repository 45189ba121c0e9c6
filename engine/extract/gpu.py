"""NVIDIA GPU readings through NVML (``pynvml`` from the ``nvidia-ml-py`` package).

Usable without any UI. :func:`read_gpus` takes one reading synchronously; :class:`GpuPoller`
samples in a background thread every ``interval_s`` (0.5 s) into a lock-protected slot, with the
slow-changing fields (name, memory total, temperature, power limit) behind a ``slow_ttl_s`` (5 s)
cache, so a reader (the dashboard) never waits on the driver.

A host without an NVIDIA GPU, driver or library is a normal state, not an error: the reading has
``available=False`` and a ``reason`` such as ``"no NVIDIA GPU (NVML: Driver Not Loaded)"``.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from typing import Any, Callable


@dataclass(frozen=True, slots=True)
class GpuSnapshot:
    """One GPU at one moment. Any field NVML cannot report (not supported) is None.

    Attributes:
        index: NVML device index.
        name: product name (e.g. ``"NVIDIA H200"``).
        util_pct: GPU utilisation over the driver's last sample period (percent, 0-100).
        mem_used_bytes / mem_total_bytes: device memory (bytes).
        temp_c: GPU core temperature (degrees Celsius).
        power_w / power_limit_w: power draw and enforced power limit (watts).
        worker: which extraction worker uses this GPU ("" until the extraction stage fills it).
    """

    index: int
    name: str
    util_pct: float | None
    mem_used_bytes: int | None
    mem_total_bytes: int | None
    temp_c: float | None
    power_w: float | None
    power_limit_w: float | None
    worker: str = ""


@dataclass(frozen=True, slots=True)
class GpuReading:
    """A reading of every GPU.

    Attributes:
        available: False when NVML is missing or finds no GPU (then ``gpus`` is empty).
        reason: why not available (``"no NVIDIA GPU (NVML: <msg>)"``), or "".
        gpus: one :class:`GpuSnapshot` per device, by index.
        taken_at: ``time.monotonic()`` of the reading (seconds); 0.0 before the first one.
    """

    available: bool
    reason: str = ""
    gpus: tuple[GpuSnapshot, ...] = ()
    taken_at: float = 0.0


NOT_READ_YET = GpuReading(False, "reading GPUs…")
"""What a poller returns before its first sample."""


def _load_nvml() -> Any:
    import pynvml  # from nvidia-ml-py

    return pynvml


def _try(fn: Callable[[], Any]) -> Any:
    try:
        return fn()
    except Exception:  # NVMLError_NotSupported and friends: field unknown
        return None


def _name(nvml: Any, h: Any) -> str:
    n = _try(lambda: nvml.nvmlDeviceGetName(h))
    if isinstance(n, bytes):
        n = n.decode("utf-8", "replace")
    return n or "?"


class _Device:
    """Per-device cache of slow fields (refreshed at most every ``ttl_s`` seconds)."""

    __slots__ = ("index", "handle", "slow", "slow_at")

    def __init__(self, index: int, handle: Any) -> None:
        self.index = index
        self.handle = handle
        self.slow: tuple[str, int | None, float | None, float | None] = ("?", None, None, None)
        self.slow_at = float("-inf")

    def read(self, nvml: Any, now: float, ttl_s: float) -> GpuSnapshot:
        h = self.handle
        if now - self.slow_at >= ttl_s:
            mem = _try(lambda: nvml.nvmlDeviceGetMemoryInfo(h))
            limit = _try(lambda: nvml.nvmlDeviceGetEnforcedPowerLimit(h))
            temp = _try(lambda: nvml.nvmlDeviceGetTemperature(h, nvml.NVML_TEMPERATURE_GPU))
            self.slow = (
                _name(nvml, h),
                int(mem.total) if mem is not None else None,
                float(temp) if temp is not None else None,
                limit / 1000.0 if limit is not None else None,
            )
            self.slow_at = now
        name, total, temp_c, limit_w = self.slow
        util = _try(lambda: nvml.nvmlDeviceGetUtilizationRates(h))
        mem = _try(lambda: nvml.nvmlDeviceGetMemoryInfo(h))
        power = _try(lambda: nvml.nvmlDeviceGetPowerUsage(h))
        return GpuSnapshot(
            index=self.index,
            name=name,
            util_pct=float(util.gpu) if util is not None else None,
            mem_used_bytes=int(mem.used) if mem is not None else None,
            mem_total_bytes=total if total is not None else (int(mem.total) if mem is not None else None),
            temp_c=temp_c,
            power_w=power / 1000.0 if power is not None else None,
            power_limit_w=limit_w,
        )


def _open(nvml: Any | None) -> tuple[Any, list[_Device]] | GpuReading:
    """Initialise NVML and list devices, or return the unavailable reading."""
    try:
        nvml = nvml if nvml is not None else _load_nvml()
    except Exception as e:  # ImportError, or a broken install
        return GpuReading(False, f"no NVIDIA GPU (NVML: {type(e).__name__}: {e})")
    try:
        nvml.nvmlInit()
    except Exception as e:  # NVMLError_LibraryNotFound, DriverNotLoaded...
        return GpuReading(False, f"no NVIDIA GPU (NVML: {e})")
    try:
        n = int(nvml.nvmlDeviceGetCount())
        devices = [_Device(i, nvml.nvmlDeviceGetHandleByIndex(i)) for i in range(n)]
    except Exception as e:
        _try(nvml.nvmlShutdown)
        return GpuReading(False, f"no NVIDIA GPU (NVML: {e})")
    if not devices:
        _try(nvml.nvmlShutdown)
        return GpuReading(False, "no NVIDIA GPU (NVML: 0 devices)")
    return nvml, devices


def read_gpus(nvml: Any | None = None) -> GpuReading:
    """Take one reading of every NVIDIA GPU (initialises and shuts NVML down; ~ms per GPU).

    Args:
        nvml: an NVML module to use instead of ``pynvml`` (tests pass a fake).

    Returns:
        A :class:`GpuReading`; ``available=False`` with a reason when there is no usable GPU.
        Never raises for a missing GPU, driver or library.
    """
    opened = _open(nvml)
    if isinstance(opened, GpuReading):
        return opened
    mod, devices = opened
    try:
        now = time.monotonic()
        return GpuReading(True, "", tuple(d.read(mod, now, 0.0) for d in devices), now)
    finally:
        _try(mod.nvmlShutdown)


class GpuPoller:
    """Samples every GPU in a daemon thread; :meth:`latest` returns the last reading at once.

    Args:
        interval_s: seconds between samples (default 0.5).
        slow_ttl_s: seconds the slow fields (name, memory total, temperature, power limit) are
            cached (default 5).
        nvml: an NVML module to use instead of ``pynvml`` (tests pass a fake).

    When NVML cannot start, the first reading says why and the thread ends (nothing to poll).
    Call :meth:`stop` to end the thread and shut NVML down (the thread is a daemon either way).
    """

    def __init__(self, interval_s: float = 0.5, slow_ttl_s: float = 5.0, nvml: Any | None = None) -> None:
        self.interval_s = interval_s
        self.slow_ttl_s = slow_ttl_s
        self._nvml = nvml
        self._lock = threading.Lock()
        self._latest: GpuReading = NOT_READ_YET
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.samples = 0

    def latest(self) -> GpuReading:
        """The most recent reading (never blocks on the driver)."""
        with self._lock:
            return self._latest

    def _set(self, r: GpuReading) -> None:
        with self._lock:
            self._latest = r
            self.samples += 1

    def start(self) -> "GpuPoller":
        """Start the sampling thread (idempotent); returns self."""
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="gpu-poller", daemon=True)
            self._thread.start()
        return self

    def stop(self, timeout_s: float = 2.0) -> None:
        """Stop the thread and wait up to ``timeout_s`` seconds for it."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout_s)

    def _run(self) -> None:
        opened = _open(self._nvml)
        if isinstance(opened, GpuReading):
            self._set(opened)
            return
        mod, devices = opened
        try:
            while not self._stop.is_set():
                now = time.monotonic()
                try:
                    gpus = tuple(d.read(mod, now, self.slow_ttl_s) for d in devices)
                    self._set(GpuReading(True, "", gpus, now))
                except Exception as e:  # keep polling; say what happened
                    self._set(GpuReading(False, f"NVML read failed: {e}", (), now))
                self._stop.wait(self.interval_s)
        finally:
            _try(mod.nvmlShutdown)


__all__ = ["GpuPoller", "GpuReading", "GpuSnapshot", "NOT_READ_YET", "read_gpus"]
