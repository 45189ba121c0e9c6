"""Extraction jobs the extraction tests share: the chained generation + extraction config on the
simulator, a tiny-model job for the terminal tests, a job per output layout, and what they read back
(manifest, worker status, exit code, SpecForge's feature files through its own quoted reader)."""

from __future__ import annotations

import gzip
import io
import json
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fixtures_tokens import HF_MARKERS, hf_dir
from helpers import SAMPLES
from tmuxterm import Tmux
from waiting import wait_for

from engine.config import parse_config
from engine.extract.job import resolve_job
from engine.extract.shards import OutDir
from engine.extract.tiny import synth_records
from engine.tokens.records import write_parquet

if TYPE_CHECKING:
    import torch

REPO = Path(__file__).resolve().parents[2]
DATAGEN = Path(sys.executable).with_name("datagen")
AUX = [0, 2, 4]  # the aux layers of :func:`make_job` (0-based layer outputs of the 6-layer tiny model)


def chain_config(tmp: Path, tiny: Path, after_run: str, slow_prompts: int = 4, latency_ms: int = 0) -> Any:
    """b1 (5 prompts) in a wide class; b7 (``slow_prompts``) one request at a time, so b1 is done
    and validated long before b7."""
    tok = hf_dir()
    data = {
        "run": {"name": "x", "dir": str(tmp / "run"), "commit_interval_s": 0.1, "progress_interval_s": 1},
        "provider": {"kind": "simulated", "sim": {"tokenizer": str(tok), "mean_completion_tokens": 30,
                                                  "latency_ms": latency_ms, "tokens_per_s": 0}},
        "classes": {"fast": {"max_tokens": 300, "concurrency": 8, "datasets": ["b1"]},
                    "slow": {"max_tokens": 300, "concurrency": 1, "datasets": ["b7"]},
                    "rest": {"max_tokens": 300, "concurrency": 1}},
        "tokenizer": {"path": str(tok), "executor": "thread", **HF_MARKERS},
        "datasets": [{"name": "b1", "path": str(SAMPLES / "b1_glaive.jsonl"), "format": "glaive"},
                     {"name": "b7", "path": str(SAMPLES / "b7_sharegpt.json"), "format": "sharegpt",
                      "max_prompts": slow_prompts}],
        "extract": {"model": str(tiny), "aux_layers": [0, 1, 2], "max_tokens_per_batch": 4096, "disk_margin_gb": 0,
                    "workers": 1, "after_run": after_run},
    }
    return parse_config(data, tmp / "config.toml")


def manifest_ids(out: Path) -> list[str]:
    return [e["id"] for e in OutDir(out).read_manifest()]


def extract_config(tmp: Path, tiny: Path, n: int = 900) -> tuple[Path, Path, set[str]]:
    """A config whose [extract] reads ``tmp/data`` (a tokens export of ``n`` synthetic records)."""
    recs = synth_records(n, 8, 96, seed=5)
    write_parquet(tmp / "data" / "a.parquet", recs)
    out = tmp / "out"
    cfg = tmp / "config.toml"
    cfg.write_text(f"""
[run]
dir = "{tmp / 'run'}"

[[datasets]]
name = "a"
path = "a.jsonl"

[extract]
model = "{tiny}"
aux_layers = [0, 1, 2]
max_tokens_per_batch = 64
disk_margin_gb = 0
out_dir = "{out}"
""")
    return cfg, out, {r.id for r in recs}


def worker_state(out: Path) -> dict:
    try:
        return json.loads((out / "status" / "worker-0.json").read_text())
    except (OSError, ValueError):
        return {}


def exit_code(rc: Path, tmux: Tmux, timeout: float = 60) -> int:
    wait_for(lambda: rc.is_file() and rc.read_text().strip(), timeout, "the process to exit", tmux.screen)
    return int(rc.read_text())


def finish_headless(cfg: Path, tmp: Path, out: Path, ids: set[str]) -> None:
    """Rerun headless to the end: every sample in the manifest exactly once."""
    r = subprocess.run([str(DATAGEN), "extract", str(cfg), "--data", str(tmp / "data"), "--headless"],
                       capture_output=True, text=True, timeout=180, cwd=REPO,
                       env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert r.returncode == 0, r.stdout + r.stderr
    got = manifest_ids(out)
    assert Counter(got).most_common(1)[0][1] == 1
    assert set(got) == ids


def lines(path: Path) -> int:
    """Lines in ``path`` so far (0 before it exists): a status log or a manifest growing."""
    try:
        return path.read_bytes().count(b"\n")
    except FileNotFoundError:
        return 0


def make_job(tmp: Path, tiny: Path, layout: str, out: str, **extract: Any):
    """The resolved extraction job of the tiny model over ``tmp/data`` in ``layout``, written under ``tmp/<out>``
    (aux layers :data:`AUX`, batches of 400 tokens; ``extract`` overrides any ``[extract]`` key)."""
    data = {"run": {"dir": str(tmp / "run")}, "datasets": [{"name": "a", "path": "a.jsonl"}],
            "extract": {"model": str(tiny), "aux_layers": AUX, "max_tokens_per_batch": 400, "disk_margin_gb": 0,
                        "layout": layout, "out_dir": str(tmp / out), **extract}}
    return resolve_job(parse_config(data, tmp / "config.toml", check_files=False), data=tmp / "data")


# SpecForge's reading calls, quoted from sgl-project/SpecForge at commit a6b6b0230009d15ec2a97a57384e6f53f0f96946
# (SpecForge pins another torch and SGLang, so it is not installed).

_FEATURE_SUFFIXES = (".ckpt", ".ckpt.gz")


def sf_list_feature_files(path: str) -> list[str]:
    """SpecForge runtime/data_plane/offline_reader.py ``list_feature_files`` (verbatim)."""
    if os.path.isfile(path):
        return [os.path.abspath(path)]
    files: list[str] = []
    for root, _dirs, names in os.walk(path):
        for name in names:
            if name.endswith(_FEATURE_SUFFIXES):
                files.append(os.path.abspath(os.path.join(root, name)))
    files.sort()
    return files


def sf_load_feature_file(path: str) -> dict[str, torch.Tensor]:
    """SpecForge runtime/data_plane/feature_store.py ``load_feature_file`` (verbatim; torch imported here, so
    the modules that import this one without reading features do not load it)."""
    import torch

    if path.endswith(".gz"):
        with gzip.open(path, "rb") as f:
            return torch.load(io.BytesIO(f.read()), weights_only=False)
    return torch.load(path, weights_only=False, mmap=True)
