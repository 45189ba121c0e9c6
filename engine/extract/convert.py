"""Rewrite existing ``shards`` output into the ``speculators``, ``specforge`` or ``modelopt`` layout.

No forward pass: ``specforge`` and ``modelopt`` need nothing but the shards (``specforge``'s
vocabulary mapping also the target's ``vocab_size``, from ``job.json`` or the model's config);
``speculators`` also reads one tensor of the checkpoint, the final norm's weight (below), from the
model named in ``job.json`` (or ``--model``).

fp8 shards (``save_dtype = "fp8"``) are dequantized (:func:`engine.extract.shards.read_sample`):
into the model dtype of ``job.json`` for ``specforge`` and ``modelopt`` (their trainers read it;
float32 without a ``job.json``), into float32 for ``speculators``, whose output stays fp8 (quantized
again per token after the final state is rebuilt, below: a second fp8 rounding).

Aux layers: the source's ``job.json`` records them; the destination's ``job.json`` holds the same,
with ``eagle_aux_hidden_state_layer_ids`` in the target trainer's numbering
(:func:`engine.extract.job.trainer_layer_ids`). The shards' width must match them, a destination
already holding another job's samples is refused (:func:`engine.extract.job.check_same_output`),
and ``draft_config`` (``--draft-config FILE``, the drafter's config JSON) is refused before
anything is written unless its layer ids (:func:`draft_config_layer_ids`) are the output's.

``datagen extract --convert OUT --to speculators|specforge|modelopt`` calls :func:`convert`. It holds
``extract.lock`` (:mod:`engine.proc.runlock`) on the source AND on the destination for the whole
conversion: a live ``datagen extract`` writing either directory, or another convert, refuses it
(:class:`~engine.proc.runlock.DirectoryInUse`), and no extraction can start on them meanwhile. It
reports ``complete`` only when the source job is: every planned sample of ``status/plan.json`` is in
its manifest, or every worker of the job reported ``done`` (:func:`source_state`). It streams:
one source shard is open at a time, and its samples not yet in the destination are written through
the destination layout's own commit (temp file -> fsync -> rename under the job lock -> one
manifest append; :mod:`engine.extract.layouts.base`), so each file appears whole or not at all and a
second run after ``kill -9`` recovers the destination (removes temp and unlisted files) and converts
only what is missing: no sample is redone or listed twice. ``delete_source=True`` removes each
source shard once all its samples are committed in the destination (a 14 TB job need not fit twice).

The final state: shards hold it AFTER the final norm, ``y = w * x / sqrt(mean(x^2) + eps)``, which
is what SpecForge reads. speculators reads the state BEFORE the norm (``x``) and applies the
verifier's norm itself. Per token, ``u = y / w`` (``w``: the checkpoint's ``model.norm.weight``) and
``m = mean(u^2)`` give ``x = u * sqrt(eps / (1 - m))`` (``eps``: the config's ``rms_norm_eps``),
computed in float64. Where ``1 - m`` is at the rounding level (``mean(x^2) >> eps``) the scale is
not recoverable, but then it does not matter: RMSNorm is scale-invariant up to ``eps``, and the
norm's output is insensitive to the scale in proportion to ``1 - m``. Either way
``norm(z) == y`` and speculators' targets ``lm_head(norm(z))`` are the verifier's logits
(tests/engine/extract/test_extract_layouts.py checks it to 1e-5); the saved ``z`` may differ from the raw ``x`` in
scale, and it carries the rounding of the stored (normed) state, which the scale recovery amplifies
(``1 - m = eps / (mean(x^2) + eps)`` is small), so it is not the pre-norm state a fresh extraction
with ``layout = "speculators"`` saves (``x`` itself): on the tiny test model in fp32, ``max |z - x|``
is 2.0e-5 for states up to 0.17, the aux layers being bit-identical (docs/extraction.md).
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import threading
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from engine.extract.control import read_plan
from engine.extract.disk import fmt_bytes
from engine.extract.job import (
    DTYPE_BYTES,
    FP8_BYTES,
    ExtractError,
    ExtractJob,
    _draft_vocab,
    read_model_shape,
    trainer_layer_ids,
)
from engine.extract.layouts import make_layout
from engine.extract.plan import project
from engine.extract.shards import MANIFEST, OutDir, read_sample
from engine.extract.snapshot import WorkerState
from engine.extract.status import read_workers
from engine.proc import runlock

log = logging.getLogger(__name__)

TARGETS = ("speculators", "specforge", "modelopt")
#: The key every supported draft config names its aux layers with (top level, or in ``eagle_config``).
LAYER_IDS_KEY = "eagle_aux_hidden_state_layer_ids"


@dataclass
class ConvertReport:
    """What one :func:`convert` call did: samples ``converted`` now, ``already`` there before,
    ``bytes_written`` (destination files), ``shards_deleted`` (with ``delete_source``), ``complete``
    (the source job is complete, every one of its samples is in the destination and the layout's
    job-level files are written), ``source_complete`` / ``source_reason``: :func:`source_state`."""

    converted: int = 0
    already: int = 0
    bytes_written: int = 0
    shards_deleted: int = 0
    complete: bool = False
    source_complete: bool = False
    source_reason: str = ""
    #: the aux layers in the destination trainer's numbering (None: no job.json records them)
    layer_ids: list[int] | None = None


def final_norm_weight(model: str) -> tuple[Any, float]:
    """The final norm's weight ``[H]`` (float64) and epsilon of a local Hugging Face checkpoint
    directory: the one tensor named ``model.norm.weight`` (any prefix, e.g. Kimi-K2.5's
    ``language_model.``) and ``rms_norm_eps`` of ``config.json`` (or its ``text_config``).

    Raises:
        ExtractError: not a local directory, no or several candidates, zeros in the weight, no epsilon.
    """
    import torch
    from safetensors import safe_open

    d = Path(model).expanduser()
    if not d.is_dir():
        raise ExtractError(f"converting to speculators reads the final norm weight from the model; {model!r} is not a "
                           "local model directory (job.json's model; pass --model DIR)")
    index = d / "model.safetensors.index.json"
    if index.is_file():
        weight_map = json.loads(index.read_text())["weight_map"]
        files = {k: d / f for k, f in weight_map.items()}
    else:
        files = {}
        for f in sorted(d.glob("*.safetensors")):
            with safe_open(f, framework="pt") as st:
                files.update({k: f for k in st.keys()})
    keys = [k for k in files if k == "model.norm.weight" or k.endswith(".model.norm.weight")]
    if len(keys) != 1:
        raise ExtractError(f"{d}: expected one final norm weight named '*model.norm.weight', found {keys or 'none'}")
    with safe_open(files[keys[0]], framework="pt") as st:
        w = st.get_tensor(keys[0]).to(torch.float64)
    if bool((w.abs() < 1e-12).any()):
        raise ExtractError(f"{d}: {keys[0]} has zero entries; the normalized final state cannot be divided by it")
    try:
        cfg = json.loads((d / "config.json").read_text())
        eps = float((cfg.get("text_config") or cfg)["rms_norm_eps"])
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise ExtractError(f"{d / 'config.json'}: no rms_norm_eps ({e})") from None
    return w, eps


def unnormalize(y: Any, w: Any, eps: float) -> Any:
    """``[T, H]`` final states after an RMSNorm of weight ``w`` -> states ``z`` with ``norm(z) == y``
    (module doc), in ``y``'s dtype."""
    import torch

    u = y.to(torch.float64) / w
    m = (u * u).mean(-1, keepdim=True)
    scale = torch.sqrt(eps / torch.clamp(1.0 - m, min=1e-12))
    return (u * scale).to(y.dtype)


def default_layer_ids(to: str, num_layers: int) -> list[int]:
    """The aux layers ``to``'s trainer uses when the draft config names none, in its numbering:
    speculators ``[2, L//2, L - 3]`` (``models/utils.py`` ``resolve_target_layer_ids``), SpecForge
    ``[1, L//2 - 1, L - 4]`` (``algorithms/model_providers.py`` ``resolve_eagle_capture_layers``),
    Model-Optimizer ``sorted({1, L//2 - 1, L - 4})`` (``hf_eagle.py`` ``default_eagle_aux_layer_ids``)."""
    if to == "speculators":
        return [2, num_layers // 2, num_layers - 3]
    if to == "modelopt":
        return sorted({1, max(0, num_layers // 2 - 1), max(0, num_layers - 4)})
    return [1, num_layers // 2 - 1, num_layers - 4]


def draft_config_layer_ids(path: str | Path, to: str, num_layers: int) -> tuple[list[int], str]:
    """The aux layer ids a drafter config JSON makes ``to``'s trainer use, and where they come from:
    ``eagle_config.eagle_aux_hidden_state_layer_ids`` (SpecForge / SGLang draft configs), else a
    top-level ``eagle_aux_hidden_state_layer_ids`` (speculators' and Model-Optimizer's configs),
    else the trainer's default (:func:`default_layer_ids`).

    Raises:
        ExtractError: unreadable file, not a JSON object, ids that are not a list of integers.
    """
    try:
        d = json.loads(Path(path).read_text())
    except (OSError, ValueError) as e:
        raise ExtractError(f"--draft-config {path}: cannot read it ({e})") from None
    if not isinstance(d, dict):
        raise ExtractError(f"--draft-config {path}: not a JSON object")
    nested = _obj if isinstance(_obj := d.get("eagle_config"), dict) else {}
    for where, ids in ((f"eagle_config.{LAYER_IDS_KEY}", nested.get(LAYER_IDS_KEY)),
                       (LAYER_IDS_KEY, d.get(LAYER_IDS_KEY))):
        if ids is not None:
            if not isinstance(ids, list) or not all(isinstance(i, int) and not isinstance(i, bool) for i in ids):
                raise ExtractError(f"--draft-config {path}: {where} = {ids!r} is not a list of integers")
            return list(ids), where
    return default_layer_ids(to, num_layers), f"{to}'s default (the config names no {LAYER_IDS_KEY})"


def check_draft_config(path: str | Path, to: str, job: ExtractJob | None) -> list[int]:
    """Refuse ``path`` unless the layer ids it makes ``to``'s trainer use are the output's aux layers
    (:func:`engine.extract.job.trainer_layer_ids`); returns them.

    Raises:
        ExtractError: no ``job.json`` records the aux layers, or the ids differ (both listed).
    """
    if job is None:
        raise ExtractError(f"--draft-config {path}: the source has no job.json recording its aux layers; "
                           "nothing to check the draft config against")
    want = trainer_layer_ids(to, job.aux_layers)
    ids, where = draft_config_layer_ids(path, to, job.num_layers)
    if ids != want:
        raise ExtractError(
            f"--draft-config {path}: {where} = {ids}, but these hidden states are of the 0-based layers "
            f"{list(job.aux_layers)} ({to} numbers them {want}): a drafter trained on them would be served "
            f"with other layers than it learned from. Set {LAYER_IDS_KEY} = {want} in the draft config, or "
            "extract again with the config's layers")
    return want


def source_state(src: Path, listed: int) -> tuple[bool, str]:
    """Whether the extraction job of ``src`` is complete, and why not: complete when the manifest
    lists (``listed`` distinct ids) every sample of ``status/plan.json`` (the whole input, written
    by ``datagen extract``), or when every worker ``0..world-1`` reported ``done`` (a job that
    finished, skipped datasets included). Read from the files only: the caller holds the lock."""
    plan = read_plan(src)
    planned = sum(d["samples"] for d in plan.values())
    if plan and listed >= planned:
        return True, ""
    ws = read_workers(src)
    world = int(ws[0].get("world") or 0) if ws else 0
    ranks = {w.get("worker") for w in ws}
    if ws and ranks == set(range(world)) and all(w.get("state") == WorkerState.DONE for w in ws):
        return True, ""
    states = ", ".join(f"worker {w.get('worker')} {w.get('state')}" for w in ws) or "no worker status"
    if plan:
        return False, f"the source extraction is not finished: {listed} of {planned} planned samples in its manifest ({states})"
    return False, (f"cannot tell that the source extraction finished: no status/plan.json and {states} in {src}")


def _source(src: Path) -> tuple[OutDir, list[dict[str, Any]], ExtractJob | None]:
    if not src.is_dir():
        raise ExtractError(f"{src}: no such directory (convert reads a `shards` extraction output directory)")
    job = None
    if (src / "job.json").is_file():
        try:
            job = ExtractJob.from_json((src / "job.json").read_text())
        except (ValueError, TypeError, KeyError) as e:
            raise ExtractError(f"{src / 'job.json'}: unreadable ({e})") from None
        if job.layout != "shards":
            raise ExtractError(f"{src}: job.json says layout {job.layout!r}; convert reads `shards` output "
                               f"(this directory is already a {job.layout} output)")
    out = OutDir(src)
    if not out.manifest.is_file():
        raise ExtractError(f"{src}: no {MANIFEST} (not an extraction output directory; convert reads a `shards` one)")
    listed = out.read_manifest()
    entries = [e for e in listed if "shard" in e]
    if not entries:
        files = [e["file"] for e in listed if "file" in e]
        if files:
            raise ExtractError(f"{src}: its manifest lists per-sample files ({files[0]}, ...), not shards: it is a "
                               "speculators or specforge output; convert reads a `shards` output directory")
        raise ExtractError(f"{src}: no shards listed in {out.manifest} (convert reads a `shards` output directory)")
    return out, entries, job


def _lock(directory: Path) -> runlock.DirLock | None:
    """``directory/extract.lock``, or None on a directory where no lock file can be made (read-only)
    when nobody holds one there either.

    Raises:
        DirectoryInUse: a live ``datagen extract`` (or convert) holds it.
    """
    try:
        return runlock.acquire(directory, runlock.EXTRACT_LOCK, "extract output directory")
    except runlock.DirectoryInUse:
        raise
    except OSError:
        h = runlock.holder(directory, runlock.EXTRACT_LOCK)
        if h is not None:
            raise runlock.DirectoryInUse(directory, h if h.pid else None, "extract output directory") from None
        return None


def convert(src: str | Path, dst: str | Path, to: str, *, model: str | None = None, delete_source: bool = False,
            margin_bytes: int = 0, stop: threading.Event | None = None,
            progress: Callable[[int, int], None] | None = None, draft_config: str | Path | None = None) -> ConvertReport:
    """Convert the ``shards`` output in ``src`` into layout ``to`` in ``dst`` (module doc).

    Args:
        to: ``speculators``, ``specforge`` or ``modelopt``.
        model: checkpoint directory for the final norm weight (speculators; default: job.json's model)
            and the vocabulary size (specforge, when job.json does not record it).
        draft_config: the drafter's config JSON: refused unless its aux layer ids are the output's
            (:func:`check_draft_config`).
        delete_source: remove each source shard once all its samples are committed in ``dst``.
        margin_bytes: bytes that must stay free on ``dst``'s file system (checked before starting).
        stop: set it to stop after the current shard; progress: called ``(done, total)`` samples.

    Raises:
        ExtractError: bad arguments, no such directory, not a ``shards`` output, a sample's tensors
            missing, not enough disk.
        engine.proc.runlock.DirectoryInUse: a live process (``datagen extract``, another convert)
            holds ``extract.lock`` of ``src`` or ``dst``; nothing was written or deleted.
    """
    if to not in TARGETS:
        raise ExtractError(f"--to {to!r}: expected one of {', '.join(TARGETS)}")
    src, dst = Path(src).resolve(), Path(dst).resolve()
    if src == dst:
        raise ExtractError("--convert: the destination must be another directory than the shards")
    if not src.is_dir():
        raise ExtractError(f"{src}: no such directory (convert reads a `shards` extraction output directory)")
    locks = [_lock(src)]
    try:
        s_out, entries, job = _source(src)
        dst.mkdir(parents=True, exist_ok=True)
        locks.append(_lock(dst))
        return _convert(src, dst, to, s_out, entries, job, model=model, delete_source=delete_source,
                        margin_bytes=margin_bytes, stop=stop, progress=progress, draft_config=draft_config)
    finally:
        for lk in reversed(locks):
            if lk is not None:
                lk.release()


def _convert(src: Path, dst: Path, to: str, s_out: OutDir, entries: list[dict[str, Any]], job: ExtractJob | None, *,
             model: str | None, delete_source: bool, margin_bytes: int, stop: threading.Event | None,
             progress: Callable[[int, int], None] | None, draft_config: str | Path | None = None) -> ConvertReport:
    import torch
    from safetensors import safe_open

    by_id: "OrderedDict[str, dict[str, Any]]" = OrderedDict()
    for e in entries:
        by_id[e["id"]] = e  # the last listing of an id wins (as ExtractedDataset reads it)
    present = set(s_out.shards().values())
    shards: "OrderedDict[str, list[dict[str, Any]]]" = OrderedDict()
    for e in by_id.values():
        shards.setdefault(e["shard"], []).append(e)
    # The shapes come from the first shard still present: with --delete-source, a rerun after a kill (or
    # after a completed conversion) finds the converted shards gone; the job file then says the shapes.
    probe = next((name for name in shards if name in present), None)
    if probe is not None:
        with safe_open(src / probe, framework="pt") as st:
            sid = shards[probe][0]["id"]
            fp8 = f"{sid}/hidden_states_scales" in st.keys()
            if fp8:
                shape = st.get_slice(f"{sid}/hidden_states").get_shape()
                hidden, n_aux = shape[-1], shape[1] - 1
            else:
                hidden = st.get_slice(f"{sid}/last_hidden_state").get_shape()[-1]
                n_aux = st.get_slice(f"{sid}/aux_hidden_states").get_shape()[-1] // hidden
                model_bytes = st.get_tensor(f"{sid}/last_hidden_state").element_size()
    elif job is not None:
        hidden, n_aux, fp8 = job.hidden_size, len(job.aux_layers), job.save_dtype == "fp8"
        model_bytes = DTYPE_BYTES[job.dtype]
    else:
        raise ExtractError(f"{src}: none of the shards its manifest lists is present, and no job.json gives the "
                           f"shapes; nothing to convert from")
    if job is not None and (n_aux != len(job.aux_layers) or hidden != job.hidden_size):
        raise ExtractError(f"{src}: the shards hold {n_aux} aux layers of width {hidden}, but job.json records aux "
                           f"layers {list(job.aux_layers)} and hidden size {job.hidden_size}: not this job's shards")
    layer_ids = check_draft_config(draft_config, to, job) if draft_config is not None else (
        trainer_layer_ids(to, job.aux_layers) if job is not None else None)
    # fp8 shards: dequantized; the speculators output stays fp8, the others get the model dtype
    out_fp8 = fp8 and to == "speculators"
    read_dtype = torch.float32 if (out_fp8 or job is None) else getattr(torch, job.dtype)
    if fp8:
        model_bytes = DTYPE_BYTES[job.dtype] if job is not None else 4
    dtype_bytes = FP8_BYTES if out_fp8 else model_bytes
    vocab = draft_vocab = None
    if to == "specforge":
        vocab = job.vocab_size if job is not None else None
        if vocab is None and (target := model or (job.model if job is not None else None)):
            try:
                vocab = read_model_shape(target, job.trust_remote_code if job else False).vocab_size
            except ExtractError as e:
                log.warning("convert: no vocab_size for SpecForge's vocab mapping: %s", e)
        draft_vocab = _draft_vocab(job.draft_vocab_size if job is not None else None, vocab)
    norm_w = None
    if to == "speculators":
        target = model or (job.model if job is not None else None)
        if not target:
            raise ExtractError(f"{src}: no job.json names the model; pass --model DIR (its final norm weight is needed)")
        norm_w = final_norm_weight(target)
        if norm_w[0].shape != (hidden,):
            raise ExtractError(f"final norm weight {tuple(norm_w[0].shape)} does not match hidden size {hidden}")
    layout = make_layout(to, hidden, n_aux, save_dtype="fp8" if out_fp8 else "model", vocab_size=vocab,
                         draft_vocab_size=draft_vocab)
    d_out = OutDir(dst, layout)
    rep0 = d_out.recover()
    if any(rep0.values()):
        log.warning("convert: recovered %s in %s", rep0, dst)
    if job is not None:
        job.with_(layout=to, out_dir=str(dst), save_dtype="fp8" if out_fp8 else "model", vocab_size=vocab,
                  draft_vocab_size=draft_vocab, compress=False).save(dst / "job.json")
    done = d_out.done_ids()
    report = ConvertReport(already=len(done & by_id.keys()), layer_ids=layer_ids)
    left = [e["length"] for e in by_id.values() if e["id"] not in done]
    need = project(left, hidden, n_aux, dtype_bytes, to).total
    free = shutil.disk_usage(dst).free
    if not delete_source and need > free - margin_bytes:
        raise ExtractError(f"converting {len(left)} samples needs about {fmt_bytes(need)} on {dst} but "
                           f"{fmt_bytes(free)} is free (margin {fmt_bytes(margin_bytes)}); free space or use --delete-source")
    total = len(by_id)
    for name, group in shards.items():
        todo = [e for e in group if e["id"] not in done]
        if todo:
            if stop is not None and stop.is_set():
                break
            if name not in present:
                raise ExtractError(f"{src / name}: listed in the manifest but missing; its samples cannot be converted")
            tensors: dict[str, Any] = {}
            with safe_open(src / name, framework="pt") as st:
                for entry in todo:
                    k = entry["id"]
                    tensors.update({f"{k}/{key}": t for key, t in read_sample(st, k, read_dtype).items()})
                    if norm_w is not None:
                        tensors[f"{k}/last_hidden_state"] = unnormalize(tensors[f"{k}/last_hidden_state"], *norm_w)
            clean = [{x: v for x, v in e.items() if x != "shard"} for e in todo]
            report.bytes_written += layout.write(d_out, tensors, clean)
            report.converted += len(todo)
            done.update(e["id"] for e in todo)
        if delete_source and all(e["id"] in done for e in group) and (src / name).exists():
            os.unlink(src / name)
            report.shards_deleted += 1
        if progress is not None and todo:
            progress(len(done & by_id.keys()), total)
    report.source_complete, report.source_reason = source_state(src, total)
    if report.source_complete:
        report.complete = layout.finish(d_out, list(by_id), None)  # the speculators dataset: of the whole job only
    return report
