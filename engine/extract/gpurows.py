"""NVML readings joined with the workers that use each GPU: :class:`~engine.extract.snapshot.GpuRow` tuples.

Pure (no I/O): the job's snapshot builder calls :func:`gpu_rows` with the poller's latest
:class:`~engine.extract.gpu.GpuReading` and its :class:`~engine.extract.snapshot.WorkerView` s.
"""

from __future__ import annotations

from collections.abc import Iterable

from engine.extract.gpu import GpuReading
from engine.extract.snapshot import GpuRow, WorkerView


def gpu_rows(reading: GpuReading, workers: Iterable[WorkerView]) -> tuple[tuple[GpuRow, ...], str]:
    """One :class:`GpuRow` per GPU of ``reading`` (by NVML index), with ``worker`` set to the rank of
    the worker whose ``gpus`` holds that index (the lowest rank when two claim it; None: unused).

    Returns:
        ``(rows, reason)``: ``reason`` is ``reading.reason`` when NVML gave no GPUs (``rows`` empty,
        e.g. ``"no NVIDIA GPU (NVML: Driver Not Loaded)"``), else ``""``; it is what
        :attr:`~engine.extract.snapshot.ExtractSnapshot.gpu_reason` holds.
    """
    if not reading.available:
        return (), reading.reason or "no NVIDIA GPU"
    owner: dict[int, int] = {}
    for w in sorted(workers, key=lambda w: w.rank):
        for i in w.gpus:
            owner.setdefault(i, w.rank)
    rows = tuple(
        GpuRow(index=g.index, name=g.name, util_pct=g.util_pct, mem_used_bytes=g.mem_used_bytes,
               mem_total_bytes=g.mem_total_bytes, temp_c=g.temp_c, power_w=g.power_w,
               power_limit_w=g.power_limit_w, worker=owner.get(g.index))
        for g in reading.gpus
    )
    return rows, ""


__all__ = ["gpu_rows"]
