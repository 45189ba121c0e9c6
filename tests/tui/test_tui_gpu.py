"""engine.extract.gpu against a fake NVML module, and the GPU pane's text."""

from __future__ import annotations

import time

from engine.extract.gpu import GpuPoller, GpuReading, read_gpus
from tui.panes.gpus import gpus_text


class NVMLError(Exception):
    pass


class FakeNVML:
    """Just enough of pynvml: two devices; counts calls per function."""

    NVML_TEMPERATURE_GPU = 0

    def __init__(self, n: int = 2, fail_init: str | None = None, no_power: bool = False) -> None:
        self.n = n
        self.fail_init = fail_init
        self.no_power = no_power
        self.calls: dict[str, int] = {}
        self.util = 50
        self.shutdowns = 0

    def _c(self, name: str) -> None:
        self.calls[name] = self.calls.get(name, 0) + 1

    def nvmlInit(self):
        if self.fail_init:
            raise NVMLError(self.fail_init)

    def nvmlShutdown(self):
        self.shutdowns += 1

    def nvmlDeviceGetCount(self):
        return self.n

    def nvmlDeviceGetHandleByIndex(self, i):
        return i

    def nvmlDeviceGetName(self, h):
        self._c("name")
        return b"NVIDIA H200"

    def nvmlDeviceGetMemoryInfo(self, h):
        self._c("mem")
        return type("M", (), {"used": 10 * 1024**3 * (h + 1), "total": 141 * 1024**3})()

    def nvmlDeviceGetUtilizationRates(self, h):
        self._c("util")
        return type("U", (), {"gpu": self.util + h})()

    def nvmlDeviceGetTemperature(self, h, kind):
        self._c("temp")
        return 60 + h

    def nvmlDeviceGetPowerUsage(self, h):
        if self.no_power:
            raise NVMLError("Not Supported")
        return 300_000 + h * 1000

    def nvmlDeviceGetEnforcedPowerLimit(self, h):
        self._c("limit")
        return 700_000


def test_read_gpus_reads_every_field_in_units():
    r = read_gpus(FakeNVML())
    assert r.available and r.reason == "" and len(r.gpus) == 2
    g = r.gpus[1]
    assert (g.index, g.name, g.util_pct, g.temp_c, g.power_w, g.power_limit_w) == (1, "NVIDIA H200", 51.0, 61.0, 301.0, 700.0)
    assert g.mem_used_bytes == 20 * 1024**3 and g.mem_total_bytes == 141 * 1024**3 and g.worker == ""


def test_no_gpu_is_a_state_not_an_error():
    r = read_gpus(FakeNVML(fail_init="Driver Not Loaded"))
    assert r == GpuReading(False, "no NVIDIA GPU (NVML: Driver Not Loaded)")
    assert read_gpus(FakeNVML(n=0)).reason == "no NVIDIA GPU (NVML: 0 devices)"
    assert "no NVIDIA GPU" in gpus_text(r).plain


def test_real_nvml_never_raises():
    r = read_gpus()  # this machine may or may not have a GPU
    assert r.available or r.reason.startswith("no NVIDIA GPU")


def test_unsupported_field_is_none():
    g = read_gpus(FakeNVML(no_power=True)).gpus[0]
    assert g.power_w is None and g.util_pct == 50.0
    assert "--W" in gpus_text(GpuReading(True, "", (g,), 1.0)).plain


def test_poller_samples_in_background_and_caches_slow_fields():
    nv = FakeNVML(n=1)
    p = GpuPoller(interval_s=0.02, slow_ttl_s=60, nvml=nv).start()
    try:
        deadline = time.monotonic() + 5
        while p.samples < 10 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert p.samples >= 10
        assert nv.calls["util"] >= 10
        assert nv.calls["name"] == 1 and nv.calls["temp"] == 1 and nv.calls["limit"] == 1  # behind the TTL
        nv.util = 90
        time.sleep(0.1)
        assert p.latest().gpus[0].util_pct == 90.0
    finally:
        p.stop()
    assert nv.shutdowns == 1


def test_poller_without_gpu_reports_why_and_stops():
    p = GpuPoller(interval_s=0.01, nvml=FakeNVML(fail_init="NVML Shared Library Not Found")).start()
    p._thread.join(2)
    assert not p._thread.is_alive()
    assert p.latest() == GpuReading(False, "no NVIDIA GPU (NVML: NVML Shared Library Not Found)")
    p.stop()


def test_gpu_text_line():
    r = read_gpus(FakeNVML(n=1))
    line = gpus_text(r).plain
    assert line.startswith("0 NVIDIA H200") and "50%" in line and "10.0/141.0G" in line
    assert "60°C" in line and "300/700W" in line
