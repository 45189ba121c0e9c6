"""``datagen extract --convert`` against a live or unfinished extraction (issue 13/14 trial findings).

Before: while ``datagen extract`` was writing, ``--convert`` (rc 0) converted what was there,
``--delete-source`` removed shards under the extractor's feet, and both printed ``complete``; a
``specforge`` output and a missing directory both gave ``no shards listed in .../manifest.jsonl`` (the
missing one was even created). Now: the source's and the destination's ``extract.lock`` are taken
(a live holder refuses with ``in use by pid N since ...``), ``complete`` only when the source job is
complete, and each wrong source says what it is.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from extract_jobs import lines

from engine.extract.shards import OutDir
from engine.extract.tiny import synth_records
from engine.tokens.records import write_parquet

REPO = Path(__file__).resolve().parents[3]


def hold_lock(directory: Path) -> subprocess.Popen:
    """Another process holding ``directory/extract.lock`` the way ``datagen extract`` does."""
    code = ("import sys, time; from pathlib import Path; from engine.proc import runlock; "
            "runlock.acquire(Path(sys.argv[1]), runlock.EXTRACT_LOCK, 'extract output directory'); "
            "print('held', flush=True); time.sleep(300)")
    p = subprocess.Popen([sys.executable, "-c", code, str(directory)], cwd=REPO, stdout=subprocess.PIPE, text=True)
    assert p.stdout is not None and p.stdout.readline().strip() == "held"
    return p


@pytest.mark.slow  # issue 27: long e2e test (>9 s on 2 cores), run by `make slow`
def test_convert_refuses_a_live_extraction_and_an_unfinished_one_is_not_complete(tmp_path: Path, tiny: Path,
                                                                                 capsys) -> None:
    from datagen.cli import main

    n = 3000
    write_parquet(tmp_path / "data" / "a.parquet", synth_records(n, 8, 96, seed=5))
    (tmp_path / "busy.toml").write_text(
        f'[run]\ndir = "run"\n[[datasets]]\nname = "a"\npath = "a.jsonl"\n'
        f'[extract]\nmodel = "{tiny}"\naux_layers = [0, 1, 2]\nmax_tokens_per_batch = 256\n'
        f'disk_margin_gb = 0\nout_dir = "busy"\n')
    src, dst = tmp_path / "busy", tmp_path / "busy-specforge"
    p = subprocess.Popen([sys.executable, "-m", "datagen", "extract", str(tmp_path / "busy.toml"), "--data",
                          str(tmp_path / "data"), "--headless", "--progress-s", "0.5"], cwd=REPO,
                         env={**os.environ, "OMP_NUM_THREADS": "1"}, stdout=subprocess.PIPE,
                         stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 120
        while lines(src / "manifest.jsonl") < 2 and p.poll() is None and time.monotonic() < deadline:
            time.sleep(0.02)
        assert p.poll() is None and lines(src / "manifest.jsonl") >= 2, "the extraction did not start writing"
        shards = {e["shard"] for e in OutDir(src).read_manifest()}
        capsys.readouterr()
        assert main(["extract", "--convert", str(src), "--to", "specforge"]) == 1
        err = capsys.readouterr().err
        assert f"in use by pid {p.pid} since" in err and "datagen extract" in err, err
        assert not dst.exists()  # nothing written
        assert main(["extract", "--convert", str(src), "--to", "speculators", "--delete-source",
                     "--model", str(tiny)]) == 1
        assert f"in use by pid {p.pid} since" in capsys.readouterr().err
        assert shards <= {q.name for q in src.glob("shard-*.safetensors")}  # not one shard deleted
        assert p.poll() is None  # the refusals happened while it was writing
    finally:
        p.send_signal(signal.SIGINT)  # drain: the batch in hand is written, then exit 130 (interrupted)
        log = p.communicate(timeout=120)[0]
    assert p.returncode == 130 and "drained" in log, log
    done = len({e["id"] for e in OutDir(src).read_manifest()})
    assert 0 < done < n, log
    # unfinished (drained) source: converted, but never "complete"; exit 1
    assert main(["extract", "--convert", str(src), "--to", "specforge"]) == 1
    out = capsys.readouterr().out
    assert f"convert: {done} converted, 0 already there" in out, out
    assert f"NOT complete: the source extraction is not finished: {done} of {n} planned samples" in out, out
    assert "; complete" not in out
    # two converts into the same destination: the second is refused, and nothing of it is written
    holder = hold_lock(dst)
    try:
        before = sorted(q.name for q in dst.rglob("*"))
        assert main(["extract", "--convert", str(src), "--to", "specforge"]) == 1
        assert f"in use by pid {holder.pid} since" in capsys.readouterr().err
        assert sorted(q.name for q in dst.rglob("*")) == before
    finally:
        holder.kill()
        holder.wait()


def test_convert_says_what_a_wrong_source_is(tmp_path: Path, tiny: Path, capsys) -> None:
    """A missing directory (not created), a specforge output (its job.json's layout; without job.json,
    its manifest's per-sample files), a directory without a manifest."""
    from datagen.cli import main
    from engine.config import parse_config
    from engine.extract.job import resolve_job
    from engine.extract.worker import run_worker

    write_parquet(tmp_path / "data" / "a.parquet", synth_records(12, 5, 40, seed=3))
    cfg = parse_config({"run": {"dir": str(tmp_path / "run")}, "datasets": [{"name": "a", "path": "a.jsonl"}],
                        "extract": {"model": str(tiny), "aux_layers": [0, 1, 2], "disk_margin_gb": 0,
                                    "layout": "specforge", "out_dir": str(tmp_path / "sf")}},
                       tmp_path / "config.toml", check_files=False)
    job = resolve_job(cfg, data=tmp_path / "data", device="cpu")
    assert run_worker(job).state == "done"
    job.save(Path(job.out_dir) / "job.json")  # as `datagen extract` writes it
    capsys.readouterr()

    missing = tmp_path / "nothing"
    assert main(["extract", "--convert", str(missing), "--to", "speculators"]) == 1
    assert f"{missing}: no such directory" in capsys.readouterr().err
    assert not missing.exists() and not (tmp_path / "nothing-speculators").exists()

    sf = tmp_path / "sf"
    assert main(["extract", "--convert", str(sf), "--to", "speculators"]) == 1
    assert "job.json says layout 'specforge'; convert reads `shards` output" in capsys.readouterr().err
    (sf / "job.json").unlink()
    assert main(["extract", "--convert", str(sf), "--to", "speculators"]) == 1
    err = capsys.readouterr().err
    assert "its manifest lists per-sample files (rows_0-2000/data_" in err and "not shards" in err, err

    (tmp_path / "empty").mkdir()
    assert main(["extract", "--convert", str(tmp_path / "empty"), "--to", "specforge"]) == 1
    assert "no manifest.jsonl (not an extraction output directory" in capsys.readouterr().err
