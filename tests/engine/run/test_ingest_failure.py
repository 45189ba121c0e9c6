"""A run whose ingest fails is recorded as stopped, with the reason, in the store and in datagen.log.

The real CLI (``datagen run --headless``, ``status``, ``report``) on a fresh run directory: a corrupt
gzip file, one cut inside its only member, an unreachable Hub. Each exits 1
with one ``error:`` line and leaves a run that ``datagen status`` calls ``stopped`` (``ingest failed:
...``) with the dataset ``stopped``, not ``completed``/``done``; the next start, once the file is
fixed, ingests and completes. What config validation can see (a file whose first bytes are not of its
compression suffix's kind, a compressed Parquet file, a glob of non-data files) is refused before
anything is created; a glob skips non-data files as a directory does.
"""

from __future__ import annotations

import gzip
import json
import sqlite3
import subprocess

import pytest
from e2e import run_cmd
from helpers import make_config

from datagen import cli
from engine.report.status import collect_status
from engine.storage.store import Store

ROWS = b"".join(json.dumps({"prompt": f"question {i}"}).encode() + b"\n" for i in range(6))


def write_config(tmp_path, path: str) -> object:
    cfg = tmp_path / "config.toml"
    cfg.write_text(f"""[run]
name = "fails"
dir = "{tmp_path / 'run'}"
commit_interval_s = 0.05
[provider]
kind = "simulated"
[classes.short]
max_tokens = 32
concurrency = 4
[[datasets]]
name = "d"
path = "{path}"
""")
    return cfg


def run(cfg) -> str:
    """``datagen run CONFIG --headless`` in its own process (its stdout is the one it was started with):
    the output, once it exited 0."""
    done = subprocess.run(run_cmd(cfg), capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return done.stdout


def status(tmp_path, capfd) -> dict:
    capfd.readouterr()
    assert cli.main(["status", str(tmp_path / "run"), "--json"]) == 0
    return json.loads(capfd.readouterr().out)


def corrupt_gz(tmp_path) -> tuple[str, str]:
    data = bytearray(gzip.compress(ROWS * 300))
    for i in range(len(data) // 2, len(data) // 2 + 20):
        data[i] ^= 0x5A
    p = tmp_path / "corrupt.jsonl.gz"
    p.write_bytes(bytes(data))
    return str(p), f"{p}: corrupt gzip data in member 1 (which starts at byte 0 of the file): "


def cut_gz(tmp_path) -> tuple[str, str]:
    p = tmp_path / "cut.jsonl.gz"
    p.write_bytes(gzip.compress(ROWS)[:-12])
    return str(p), f"{p}: truncated gzip data: the file ends inside gzip member 1 (which starts at byte 0), before the CRC-32"


def unreachable_hub(tmp_path, monkeypatch) -> tuple[str, str]:
    from huggingface_hub import constants

    for k in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_TOKEN", "HF_HUB_CACHE"):
        monkeypatch.delenv(k, raising=False)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")
    monkeypatch.setattr(constants, "ENDPOINT", "http://127.0.0.1:9")
    monkeypatch.setattr(constants, "HUGGINGFACE_CO_URL_TEMPLATE", "http://127.0.0.1:9/{repo_id}/resolve/{revision}/{filename}")
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    return "hf://datasets/org/chat", "hf://datasets/org/chat: cannot reach the Hub ("


@pytest.mark.parametrize("case", ["corrupt_gz", "cut_gz", "unreachable_hub"])
def test_a_run_whose_ingest_fails_is_stopped_with_the_reason_not_completed(tmp_path, capfd, monkeypatch, case):
    path, message = corrupt_gz(tmp_path) if case == "corrupt_gz" else cut_gz(tmp_path) if case == "cut_gz" \
        else unreachable_hub(tmp_path, monkeypatch)
    cfg = write_config(tmp_path, path)
    assert cli.main(["run", str(cfg), "--headless"]) == 1
    out = capfd.readouterr()
    error = out.err.strip().splitlines()
    assert len(error) == 1 and error[0].startswith(f"error: {message}"), out.err  # said once, not logged twice
    full = error[0].removeprefix("error: ")
    doc = status(tmp_path, capfd)
    assert (doc["run"]["state"], doc["run"]["state_reason"], doc["run"]["alive"]) == ("stopped", f"ingest failed: {full}", False)
    (d,) = doc["datasets"]
    assert (d["name"], d["state"], d["state_reason"], d["prompts"]) == ("d", "stopped", f"ingest failed: {full}", 0)
    assert cli.main(["status", str(tmp_path / "run")]) == 0
    assert capfd.readouterr().out.startswith(f"run fails: stopped (ingest failed: {full}), elapsed 0s\n")
    log = (tmp_path / "run" / "datagen.log").read_text()
    assert f"ERROR engine: ingest failed; the run stops before any request: {full}\n" in log
    assert cli.main(["report", str(tmp_path / "run"), "--out", str(tmp_path / "report")]) == 0
    page = (tmp_path / "report" / "report.html").read_text()
    assert "run stopped" in page and "run completed" not in page
    db = sqlite3.connect(tmp_path / "run" / "store.sqlite")
    assert db.execute("SELECT COUNT(*) FROM prompts").fetchone() == (0,)  # nothing stored, nothing sent
    assert db.execute("SELECT COUNT(*) FROM attempts").fetchone() == (0,)


def test_once_the_file_is_fixed_the_next_start_ingests_and_completes(tmp_path, capfd):
    path, _ = corrupt_gz(tmp_path)
    cfg = write_config(tmp_path, path)
    assert cli.main(["run", str(cfg), "--headless"]) == 1
    with gzip.open(path, "wb") as fh:
        fh.write(ROWS)
    assert "[d] ingested 6 prompts (6 new), 0 rejected rows" in run(cfg)
    doc = status(tmp_path, capfd)
    assert (doc["run"]["state"], doc["run"]["state_reason"]) == ("completed", "")
    assert [(d["state"], d["state_reason"], d["done"]) for d in doc["datasets"]] == [("done", "", 6)]


async def test_a_dataset_registered_but_not_yet_ingested_is_pending_not_done(tmp_path):
    """`datagen status` during a first ingest (datasets registered, nothing read yet): not completed."""
    cfg = make_config(tmp_path, [{"name": "a", "path": "a.jsonl"}])
    store = await Store.open(cfg.run.dir)
    try:
        await store.register_dataset("a", 0, "a.jsonl", None)
        doc = collect_status(cfg.run.dir)
        assert doc["run"]["state"] == "not started"
        assert [(d["name"], d["state"]) for d in doc["datasets"]] == [("a", "pending")]
        await store.fail_ingest("a", "a.jsonl: no such file")
        assert collect_status(cfg.run.dir)["datasets"][0]["state_reason"] == "ingest failed: a.jsonl: no such file"
        await store.register_dataset("a", 0, "a.jsonl", None)  # the next ingest starts: the failure is cleared
        assert collect_status(cfg.run.dir)["datasets"][0]["state"] == "pending"
    finally:
        await store.close()


def test_config_validation_refuses_compressed_parquet_and_globs_of_non_data_files(tmp_path, capfd):
    fake = tmp_path / "fake.jsonl.gz"  # plain text under a .gz name: its first bytes say so
    fake.write_bytes(ROWS)
    cfg = write_config(tmp_path, str(fake))
    assert cli.main(["run", str(cfg), "--headless"]) == 1
    assert capfd.readouterr().err == (f"error: {cfg}: invalid configuration:\n  datasets[0].path (d): {fake}: not gzip data "
                                      f"(it starts with b'{{\"prompt', not gzip's magic bytes 1f 8b); name a file that is not "
                                      f"compressed without the compression suffix\n")
    (tmp_path / "t.parquet.gz").write_bytes(gzip.compress(b"PAR1"))
    cfg = write_config(tmp_path, str(tmp_path / "t.parquet.gz"))
    assert cli.main(["run", str(cfg), "--headless"]) == 1
    assert capfd.readouterr().err == (f"error: {cfg}: invalid configuration:\n  datasets[0].path (d): {tmp_path}/t.parquet.gz: "
                                       f"a gzip-compressed Parquet file; Parquet compresses its own pages, so give the "
                                       f".parquet file itself\n")
    shards = tmp_path / "shards"
    shards.mkdir()
    (shards / "README.md").write_text("# card")
    (shards / "notes.txt").write_text("notes")
    cfg = write_config(tmp_path, f"{shards}/*")
    assert cli.main(["run", str(cfg), "--headless"]) == 1
    assert capfd.readouterr().err == (f"error: {cfg}: invalid configuration:\n  datasets[0].path (d): {shards}/*: the glob "
                                       f"matches no dataset file, only 2 other file(s) (README.md, notes.txt); expected one "
                                       f"or more .jsonl/.ndjson/.json/.traj/.parquet (optionally .gz/.zst) files\n")
    (shards / "z.jsonl.zst").write_bytes(b"")
    (shards / "y.parquet.zst").write_bytes(b"")
    assert cli.main(["run", str(cfg), "--headless"]) == 1
    assert capfd.readouterr().err.endswith(f"datasets[0].path (d): {shards}/y.parquet.zst: a zstd-compressed Parquet file; "
                                            f"Parquet compresses its own pages, so give the .parquet file itself (one of "
                                            f"the files of {shards}/*)\n")
    (shards / "y.parquet.zst").unlink()
    (shards / "x.jsonl.zst").write_bytes(gzip.compress(ROWS, mtime=0))  # a shard of the other kind
    assert cli.main(["run", str(cfg), "--headless"]) == 1
    assert capfd.readouterr().err.endswith(f"datasets[0].path (d): {shards}/x.jsonl.zst: not zstd data (it starts with "
                                           f"b'\\x1f\\x8b\\x08\\x00\\x00\\x00\\x00\\x00', not zstd's magic bytes 28 b5 2f fd); name a file "
                                           f"that is not compressed without the compression suffix\n")
    assert not (tmp_path / "run").exists()  # refused before anything was created


def test_a_glob_skips_non_data_files_as_a_directory_does(tmp_path, capfd):
    shards = tmp_path / "in" / "shards"
    shards.mkdir(parents=True)
    (shards / "README.md").write_text("# card")
    (shards / "0.jsonl.gz").write_bytes(gzip.compress(ROWS[:ROWS.index(b"\n") + 1]))
    (shards / "1.jsonl").write_bytes(ROWS[ROWS.index(b"\n") + 1:])
    cfg = write_config(tmp_path, f"{shards}/*")
    assert "[d] ingested 6 prompts (6 new), 0 rejected rows" in run(cfg)
    assert status(tmp_path, capfd)["run"]["state"] == "completed"


def test_whole_file_problems_come_first_in_the_ingest_output(tmp_path):
    """A truncated file keeps the rows of its checked members; why the rest was skipped is said before the
    counts, not left as the last of the rejects."""
    cut = ROWS.index(b'{"prompt": "question 4"') + 4
    m1 = gzip.compress(ROWS[:cut])
    p = tmp_path / "cut.jsonl.gz"
    p.write_bytes(m1 + gzip.compress(ROWS[cut:])[:-10])
    lines = run(write_config(tmp_path, str(p))).splitlines()
    reason = (f"compressed data truncated (the file ends inside gzip member 2 (which starts at byte {len(m1)}), before "
              f"the CRC-32 at its end; its rows cannot be verified); rest of file skipped")
    at = lines.index(f"[d] warning: {p}:5: {reason}")
    assert lines[at + 1] == "[d] ingested 4 prompts (4 new), 1 rejected rows"
    assert f"    rejected {p}:5: {reason}" in lines


async def test_ingest_all_records_a_failure_with_its_dataset_and_reads_no_later_dataset(tmp_path):
    """A file gone between config check and ingest is one DatasetError (not an OSError traceback)."""
    from engine.datasets import DatasetError
    from engine.run.ingest import ingest_all

    good = tmp_path / "good.jsonl"
    good.write_bytes(ROWS)
    cfg = make_config(tmp_path, [{"name": "gone", "path": str(tmp_path / "gone.jsonl")}, {"name": "good", "path": str(good)}])
    store = await Store.open(cfg.run.dir)
    try:
        with pytest.raises(DatasetError) as e:
            await ingest_all(cfg, store)
        assert str(e.value) == f"{tmp_path / 'gone.jsonl'}: cannot read file (No such file or directory)"
        rows = await store.datasets()
        assert [(n, r["ingest_error"], r["fingerprint"]) for n, r in rows.items()] == [("gone", str(e.value), None)]
    finally:
        await store.close()
