"""GPUs: utilisation, memory, temperature and power per GPU from NVML, or why there are none."""

from __future__ import annotations

from rich.text import Text
from textual.widgets import Static

from engine.api import GpuReading, GpuSnapshot
from tui.fmt import GIB, bar


def level_style(fraction: float | None) -> str:
    """Green below 10 %, yellow below 80 %, red above (nvitop's thresholds); "" for None."""
    if fraction is None:
        return ""
    return "green" if fraction < 0.10 else "yellow" if fraction < 0.80 else "red"


def gpu_line(g: GpuSnapshot) -> Text:
    """``0 NVIDIA H200  util ███··· 45%  mem 12.3/139.8G  61°C  312/700W``."""
    t = Text(no_wrap=True, overflow="ellipsis")
    t.append(f"{g.index} ", style="bold")
    t.append(f"{g.name[:18]:<18} ")
    if g.util_pct is None:
        t.append("util   --  ")
    else:
        u = g.util_pct / 100
        t.append("util ")
        t.append(f"{bar(u, 6)} {g.util_pct:3.0f}%", style=level_style(u))
    t.append("  mem ")
    if g.mem_used_bytes is None or not g.mem_total_bytes:
        t.append("--")
    else:
        m = g.mem_used_bytes / g.mem_total_bytes
        t.append(f"{g.mem_used_bytes / GIB:.1f}/{g.mem_total_bytes / GIB:.1f}G", style=level_style(m))
    t.append("  ")
    if g.temp_c is None:
        t.append("--°C")
    else:
        t.append(f"{g.temp_c:.0f}°C", style="red" if g.temp_c >= 85 else "yellow" if g.temp_c >= 75 else "")
    t.append("  ")
    if g.power_w is None:
        t.append("--W")
    else:
        t.append(f"{g.power_w:.0f}")
        t.append(f"/{g.power_limit_w:.0f}W" if g.power_limit_w else "W")
    if g.worker:
        t.append(f"  {g.worker}", style="cyan")
    return t


def gpus_text(r: GpuReading) -> Text:
    """All GPUs, one line each; the reason (dim, not red: it is a normal state) when none."""
    if not r.available:
        return Text(r.reason or "no NVIDIA GPU", style="dim")
    return Text("\n").join(gpu_line(g) for g in r.gpus)


class GpusPane(Static):
    """Per-GPU figures; ``update_from`` takes a :class:`~engine.extract.gpu.GpuReading`."""

    def __init__(self, **kw) -> None:
        super().__init__("", **kw)
        self._last: tuple | None = None

    def update_from(self, reading: GpuReading) -> None:
        """Redraw when the figures changed (the sampling time alone does not count)."""
        key = (reading.available, reading.reason, reading.gpus)
        if key != self._last:
            lines_changed = self._last is None or len(self._last[2]) != len(reading.gpus)
            self._last = key
            self.update(gpus_text(reading), layout=lines_changed)  # height follows the GPU count
