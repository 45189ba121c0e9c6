"""A fake ``pynvml`` (nvidia-ml-py) for tests on machines without a GPU.

:class:`FakePynvml` answers the NVML calls :mod:`engine.extract.gpu` makes, for ``n`` H200-like
devices (141 GB: 143,771 MiB as NVML reports it; 700 W enforced limit; NVML's units: bytes,
milliwatts, °C, percent), with readings that change on every call (a deterministic walk per
device). :func:`install` makes :func:`engine.extract.gpu._load_nvml` return it, so ``read_gpus()``
and ``GpuPoller()`` without an ``nvml`` argument read the fake, exactly as they would import the real module.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any

H200_MEM_BYTES = 143_771 * 2**20
"""Device memory of the fake H200 (bytes): what NVML reports for an H200 (the "141 GB" card)."""
H200_POWER_LIMIT_MW = 700_000
"""Enforced power limit of the fake H200 (milliwatts, NVML's unit)."""
NVML_TEMPERATURE_GPU = 0


class NVMLError(Exception):
    """Stands in for ``pynvml.NVMLError``."""


@dataclass(frozen=True)
class Memory:
    """``nvmlDeviceGetMemoryInfo``'s answer (bytes)."""

    total: int
    used: int
    free: int


@dataclass(frozen=True)
class Utilization:
    """``nvmlDeviceGetUtilizationRates``'s answer (percent)."""

    gpu: int
    memory: int


class FakePynvml:
    """Module-like fake of ``pynvml`` with ``n`` devices whose readings change per call.

    Device ``i``'s ``k``-th reading of a field: utilisation ``(37 * k + 11 * i) % 101`` percent,
    memory used ``(20 + (5 * k + 3 * i) % 100) / 141`` of the total, temperature ``40 + (k + i) % 45``
    °C, power ``(150 + (53 * k + 29 * i) % 550) * 1000`` mW. ``calls`` counts calls by name;
    ``inits``/``shutdowns`` count ``nvmlInit``/``nvmlShutdown``. Thread-safe (the poller reads in a
    thread).
    """

    NVML_TEMPERATURE_GPU = NVML_TEMPERATURE_GPU
    NVMLError = NVMLError

    def __init__(self, n: int = 8, name: str = "NVIDIA H200") -> None:
        self.n = n
        self.name = name
        self.calls: dict[str, int] = {}
        self.inits = 0
        self.shutdowns = 0
        self._k: dict[tuple[str, int], int] = {}
        self._lock = threading.Lock()

    def _next(self, field: str, i: int) -> int:
        with self._lock:
            self.calls[field] = self.calls.get(field, 0) + 1
            k = self._k.get((field, i), 0)
            self._k[(field, i)] = k + 1
            return k

    def _handle(self, h: Any) -> int:
        if not isinstance(h, int) or not 0 <= h < self.n:
            raise NVMLError("Invalid Argument")
        return h

    def nvmlInit(self) -> None:
        self.inits += 1

    def nvmlShutdown(self) -> None:
        self.shutdowns += 1

    def nvmlDeviceGetCount(self) -> int:
        return self.n

    def nvmlDeviceGetHandleByIndex(self, i: int) -> int:
        return self._handle(i)

    def nvmlDeviceGetName(self, h: int) -> str:
        self._next("name", self._handle(h))
        return self.name

    def nvmlDeviceGetMemoryInfo(self, h: int) -> Memory:
        i = self._handle(h)
        k = self._next("mem", i)
        used = H200_MEM_BYTES * (20 + (5 * k + 3 * i) % 100) // 141
        return Memory(total=H200_MEM_BYTES, used=used, free=H200_MEM_BYTES - used)

    def nvmlDeviceGetUtilizationRates(self, h: int) -> Utilization:
        i = self._handle(h)
        k = self._next("util", i)
        return Utilization(gpu=(37 * k + 11 * i) % 101, memory=(13 * k + i) % 101)

    def nvmlDeviceGetTemperature(self, h: int, sensor: int) -> int:
        i = self._handle(h)
        if sensor != NVML_TEMPERATURE_GPU:
            raise NVMLError("Not Supported")
        return 40 + (self._next("temp", i) + i) % 45

    def nvmlDeviceGetPowerUsage(self, h: int) -> int:
        i = self._handle(h)
        k = self._next("power", i)
        return (150 + (53 * k + 29 * i) % 550) * 1000

    def nvmlDeviceGetEnforcedPowerLimit(self, h: int) -> int:
        self._next("limit", self._handle(h))
        return H200_POWER_LIMIT_MW


def install(monkeypatch: Any, n: int = 8) -> FakePynvml:
    """Make :mod:`engine.extract.gpu` load a fresh :class:`FakePynvml` with ``n`` devices instead of
    ``pynvml`` (through its ``_load_nvml`` seam) for the rest of the test; returns the fake."""
    import engine.extract.gpu as gpu

    fake = FakePynvml(n)
    monkeypatch.setattr(gpu, "_load_nvml", lambda: fake)
    return fake


__all__ = ["FakePynvml", "H200_MEM_BYTES", "H200_POWER_LIMIT_MW", "Memory", "NVMLError", "Utilization", "install"]
