"""The fake NVML (tests/support/fake_nvml.py) behind engine.extract.gpu's ``_load_nvml`` seam: 8 H200-like
GPUs with changing readings, joined with workers (engine.extract.gpurows) and shown by the
extraction view."""

from __future__ import annotations

import dataclasses
import time

from fake_nvml import H200_MEM_BYTES, install

from engine.extract.gpu import GpuPoller, read_gpus
from engine.extract.gpurows import gpu_rows
from engine.extract.snapshot import WorkerView
from tui.extract.app import ExtractApp
from tui.extract.demo import fixed_extract_snapshot
from tui.extract.host import StaticExtractHost
from tui.testing import screen_text


def test_read_gpus_finds_8_h200s_through_the_seam(monkeypatch):
    fake = install(monkeypatch)
    r = read_gpus()  # no nvml argument: engine.extract.gpu loads "pynvml", i.e. the fake
    assert r.available and len(r.gpus) == 8 and fake.inits == 1 and fake.shutdowns == 1
    assert {g.name for g in r.gpus} == {"NVIDIA H200"}
    assert {(g.mem_total_bytes, g.power_limit_w) for g in r.gpus} == {(H200_MEM_BYTES, 700.0)}
    g3 = r.gpus[3]
    assert (g3.index, g3.util_pct, g3.temp_c, g3.power_w) == (3, 33.0, 43.0, 237.0)
    assert g3.mem_used_bytes == H200_MEM_BYTES * 34 // 141  # the 2nd memory call of a read (k=1): 20 + 5 + 9


def test_readings_change_from_one_call_to_the_next(monkeypatch):
    install(monkeypatch)
    a, b = read_gpus(), read_gpus()
    for ga, gb in zip(a.gpus, b.gpus, strict=True):
        assert ga.util_pct != gb.util_pct and ga.mem_used_bytes != gb.mem_used_bytes
        assert ga.temp_c != gb.temp_c and ga.power_w != gb.power_w


def test_poller_reads_8_changing_gpus_in_its_thread(monkeypatch):
    fake = install(monkeypatch)
    p = GpuPoller(interval_s=0.01, slow_ttl_s=0.0).start()
    try:
        seen = set()
        deadline = time.monotonic() + 10
        while len(seen) < 5 and time.monotonic() < deadline:
            r = p.latest()
            if r.available:
                assert len(r.gpus) == 8
                seen.add(r.gpus[0].util_pct)
            time.sleep(0.01)
        assert len(seen) >= 5, seen
    finally:
        p.stop()
    assert fake.shutdowns == 1


def test_gpu_rows_join_workers_by_gpu_index(monkeypatch):
    install(monkeypatch)
    workers = [WorkerView(rank=1, state="running", gpus=(2, 3)), WorkerView(rank=0, state="running", gpus=(0, 1)),
               WorkerView(rank=2, state="running", gpus=(3,))]
    rows, reason = gpu_rows(read_gpus(), workers)
    assert reason == "" and [r.index for r in rows] == list(range(8))
    assert [r.worker for r in rows] == [0, 0, 1, 1, None, None, None, None]  # GPU 3: the lowest rank
    assert rows[5].mem_total_bytes == H200_MEM_BYTES and rows[5].power_limit_w == 700.0


def test_gpu_rows_without_nvml_give_the_reason():
    class NoDriver:
        def nvmlInit(self):
            raise RuntimeError("Driver Not Loaded")

    rows, reason = gpu_rows(read_gpus(NoDriver()), [WorkerView(rank=0, state="running", gpus=(0,))])
    assert rows == () and reason == "no NVIDIA GPU (NVML: Driver Not Loaded)"


async def test_the_view_shows_8_gpus_from_the_fake_nvml(monkeypatch):
    install(monkeypatch)
    poller = GpuPoller(interval_s=0.05, slow_ttl_s=0.0).start()
    base = fixed_extract_snapshot()

    def source():
        rows, reason = gpu_rows(poller.latest(), base.workers)
        return dataclasses.replace(base, gpus=rows, gpu_reason=reason)

    app = ExtractApp(StaticExtractHost(source, None), refresh_hz=20)
    try:
        async with app.run_test(size=(120, 40)) as pilot:
            utils = []
            for _ in range(40):
                await pilot.pause(0.1)
                lines = [ln for ln in screen_text(app).split("\n") if ln.startswith("│ ") and "/140.4" in ln]
                if len(lines) == 8:
                    utils.append(lines[0].split()[2])
                if len(set(utils)) >= 3:
                    break
            assert len(lines) == 8 and [ln.split()[1] for ln in lines] == [str(i) for i in range(8)]
            assert all(f"w{i}" in ln for i, ln in enumerate(lines))
            assert len(set(utils)) >= 3, utils  # the readings move on screen
    finally:
        poller.stop()


async def test_the_view_says_why_there_are_no_gpus():
    snap = dataclasses.replace(fixed_extract_snapshot(), gpus=(), gpu_reason="no NVIDIA GPU (NVML: Driver Not Loaded)")
    app = ExtractApp(StaticExtractHost(lambda: snap, None), refresh_hz=20)
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.pause(0.3)
        text = screen_text(app)
        assert "no NVIDIA GPU (NVML: Driver Not Loaded)" in text
        rows = [ln for ln in text.split("\n") if ln.startswith("│ --") or ln.startswith("│ 0 ") or " w5 " in ln]
        assert any("w5" in ln and "restarting" in ln for ln in rows)  # workers still listed, GPU fields "--"
