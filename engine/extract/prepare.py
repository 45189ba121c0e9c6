"""Before an extraction starts: recover the output directory, project the bytes still to write,
check the disk."""

from __future__ import annotations

from typing import Any, Callable

from engine.extract.disk import check_job_fits, fmt_bytes
from engine.extract.job import ExtractJob
from engine.extract.plan import FP8_SCALE_BYTES, project
from engine.extract.shards import OutDir
from engine.extract.source import load_table


def prepare(job: ExtractJob, say: Callable[[str], None], check_disk: bool = True,
            skip: tuple[str, ...] = ()) -> dict[str, Any]:
    """Recover the output dir, project the bytes still to write (pending samples of ``skip``
    datasets left out), check the disk.

    Returns:
        ``{"samples", "tokens", "projected_bytes", "projected_hidden_bytes"}`` still to do, plus
        ``"plan"`` (``{dataset: {"samples", "tokens"}}`` of the whole input) and ``"done"`` (the same,
        already in the manifest).

    Raises:
        ExtractError: the input cannot be read, or the projection does not fit on the disk.
    """
    out = OutDir(job.out_dir)
    out.recover()
    table = load_table(job)
    done = out.done_ids()
    plan: dict[str, dict[str, int]] = {}
    already: dict[str, dict[str, int]] = {}
    left = []
    for i, sid in enumerate(table.ids):
        ds, n = table.datasets[i], int(table.lengths[i])
        p = plan.setdefault(ds, {"samples": 0, "tokens": 0})
        p["samples"] += 1
        p["tokens"] += n
        if sid in done:
            a = already.setdefault(ds, {"samples": 0, "tokens": 0})
            a["samples"] += 1
            a["tokens"] += n
        elif ds not in skip:
            left.append(i)
    proj = project(table.lengths[left], job.hidden_size, len(job.aux_layers), job.dtype_bytes, job.layout)
    n_done = sum(a["samples"] for a in already.values())
    say(f"input: {len(table)} samples ({int(table.lengths.sum())} tokens); already extracted: {n_done}; "
        f"to do: {proj.samples} samples, {proj.tokens} tokens"
        + (f"; skipped datasets: {', '.join(skip)}" if skip else "")
        + (f"; left out: {table.dropped}" if any(table.dropped.values()) else ""))
    say(f"model {job.model}: H={job.hidden_size}, L={job.num_layers}, aux layers {list(job.aux_layers)} "
        f"(0-based layer outputs), {job.dtype}"
        + (", states saved as fp8 (float8_e4m3fn)" if job.save_dtype == "fp8" else "")
        + f"; per token {(len(job.aux_layers) + 1)} x {job.hidden_size} x {job.dtype_bytes} B"
        + (f" + a {FP8_SCALE_BYTES} B scale" if job.save_dtype == "fp8" else "") + f"; engine {job.engine}"
        + (f" ({', '.join(f'{k}={v}' for k, v in job.vllm.items())})" if job.engine == "vllm" else ""))
    if check_disk:
        other = "ids/masks/scales/headers" if job.save_dtype == "fp8" else "ids/masks/headers"
        say(check_job_fits(job.out_dir, proj.total, job.disk_margin_bytes, job.free_bytes)
            + f" [hidden states {fmt_bytes(proj.hidden_bytes)} + {other} {fmt_bytes(proj.overhead_bytes)}]")
    return {"samples": proj.samples, "tokens": proj.tokens, "projected_bytes": proj.total,
            "projected_hidden_bytes": proj.hidden_bytes, "plan": plan, "done": already}


__all__ = ["prepare"]
