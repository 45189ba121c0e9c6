"""Compressed dataset files (``.jsonl.gz``, ``.jsonl.zst``, ``.json.gz``) and shard sets (a directory or glob).

Compressed files give the same prompts and ``file:N`` sources as their plain copies and are streamed
(peak memory stays far below the decompressed size); a directory or glob is read shard by shard in
sorted order, each row's source naming its shard file; a plain file's fingerprint is the one stored
runs were ingested under."""

from __future__ import annotations

import gzip
import hashlib
import json
import os
import tracemalloc

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import zstandard
from helpers import make_config

from engine.datasets import DatasetError, iter_prompts, jsonarray
from engine.datasets.readers import open_records
from engine.prompts import Reject
from engine.run.ingest import fingerprint, ingest_all
from engine.storage.store import Store


def row(text: str) -> dict:
    return {"messages": [{"role": "user", "content": text}, {"role": "assistant", "content": "answer"}]}


ROWS = [row(f"question {i}") for i in range(5)]
JSONL = b"".join(json.dumps(r).encode() + b"\n" for r in ROWS)


def load(path):
    items = list(iter_prompts(path))
    return [(p.source, p.messages[0]["content"], p.key) for p in items if not isinstance(p, Reject)], \
        [(r.source, r.reason) for r in items if isinstance(r, Reject)]


@pytest.mark.parametrize("name, pack", [
    ("d.jsonl.gz", gzip.compress),
    ("d.jsonl.zst", lambda b: zstandard.ZstdCompressor().compress(b)),
    ("d.ndjson.gz", gzip.compress),
    ("d.json.gz", lambda b: gzip.compress(json.dumps(ROWS, indent=1).encode())),  # a JSON array
    ("d.json.zst", lambda b: zstandard.ZstdCompressor().compress(b)),  # JSON lines in a .json
])
def test_compressed_files_give_the_plain_files_prompts_with_their_own_sources(tmp_path, name, pack):
    plain = tmp_path / "plain.jsonl"
    plain.write_bytes(JSONL)
    packed = tmp_path / name
    packed.write_bytes(pack(JSONL))
    (want, no) = load(plain)
    got, rejects = load(packed)
    assert no == rejects == []
    assert [(s.replace(str(packed), "F"), t, k) for s, t, k in got] == [(s.replace(str(plain), "F"), t, k) for s, t, k in want]
    assert got[0][0] == f"{packed}:1" and got[4][1] == "question 4"


def test_multi_member_gzip_and_multi_frame_zstd_read_through(tmp_path):
    gz = tmp_path / "cat.jsonl.gz"
    gz.write_bytes(gzip.compress(JSONL[:len(JSONL) // 2 + 3]) + gzip.compress(JSONL[len(JSONL) // 2 + 3:]))  # `cat a.gz b.gz`
    zs = tmp_path / "cat.jsonl.zst"
    c = zstandard.ZstdCompressor()
    zs.write_bytes(c.compress(JSONL[:40]) + c.compress(JSONL[40:]))
    for p in (gz, zs):
        got, rejects = load(p)
        assert rejects == [] and [t for _, t, _ in got] == [f"question {i}" for i in range(5)]


def test_a_truncated_compressed_file_keeps_only_the_rows_of_its_intact_members_and_frames(tmp_path):
    """Cut inside its last member/frame: the rows of the members/frames before it (whose checks passed)
    are kept, the rest is one reject; cut inside the first one, nothing was checked: the file is refused
    (tests/engine/datasets/test_compressed_integrity.py holds the rule's other cases)."""
    cut = tmp_path / "cut.jsonl.gz"
    split = JSONL.index(b"question 3")  # member 2 starts inside row 4
    first = gzip.compress(JSONL[:split])
    cut.write_bytes(first + gzip.compress(JSONL[split:])[:-12])  # member 2 ends before its CRC-32
    got, rejects = load(cut)
    assert [t for _, t, _ in got] == ["question 0", "question 1", "question 2"]
    assert rejects == [(f"{cut}:4", f"compressed data truncated (the file ends inside gzip member 2 (which starts at "
                                    f"byte {len(first)}), before the CRC-32 at its end; its rows cannot be verified); "
                                    f"rest of file skipped")]
    one = tmp_path / "one.jsonl.gz"
    one.write_bytes(gzip.compress(JSONL)[:-12])
    with pytest.raises(DatasetError, match=rf"^{one}: truncated gzip data: the file ends inside gzip member 1 \(which "
                                           rf"starts at byte 0\), before the CRC-32 at its end, so none of it can be verified"):
        iter_prompts(one)
    arr = tmp_path / "cut.json.zst"  # two checksummed frames of a 300 kB array, cut inside the second
    many = [row(f"question {i} " + "y" * 3000) for i in range(100)]
    text = json.dumps(many).encode()
    c = zstandard.ZstdCompressor(write_checksum=True)
    split = text.index(b"question 40 ")  # element 41 starts in frame 1 and ends in frame 2
    head = c.compress(text[:split])
    arr.write_bytes(head + c.compress(text[split:])[:-9])
    got, rejects = load(arr)
    assert [t[:12] for _, t, _ in got] == [f"question {i} y"[:12] for i in range(40)]
    assert rejects == [(f"{arr}:{len(got) + 1}", f"compressed data truncated (the file ends inside zstd frame 2 (which "
                                                f"starts at byte {len(head)}), before the content checksum at its end; its "
                                                f"rows cannot be verified); rest of file skipped")]
    tiny = tmp_path / "tiny.jsonl.zst"  # one frame, cut: nothing checked at all
    tiny.write_bytes(zstandard.ZstdCompressor().compress(JSONL)[:-5])
    with pytest.raises(DatasetError, match=rf"^{tiny}: truncated zstd data: the file ends inside zstd frame 1 "):
        iter_prompts(tiny)


def test_a_file_that_is_not_of_its_compression_suffix_and_compressed_parquet_are_whole_file_errors(tmp_path):
    fake = tmp_path / "fake.jsonl.gz"
    fake.write_bytes(JSONL)
    with pytest.raises(DatasetError, match=rf"^{fake}: not gzip data \("):
        iter_prompts(fake)
    fakez = tmp_path / "fake.jsonl.zst"
    fakez.write_bytes(JSONL)
    with pytest.raises(DatasetError, match=rf"^{fakez}: not zstd data \("):
        iter_prompts(fakez)
    pq.write_table(pa.Table.from_pylist(ROWS), tmp_path / "t.parquet")
    gzpq = tmp_path / "t.parquet.gz"
    gzpq.write_bytes(gzip.compress((tmp_path / "t.parquet").read_bytes()))
    with pytest.raises(DatasetError, match="gzip-compressed Parquet file; Parquet compresses its own pages"):
        iter_prompts(gzpq)


def _peak_bytes(fn) -> int:
    tracemalloc.start()
    try:
        fn()
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


@pytest.mark.parametrize("name", ["big.jsonl.gz", "big.json.gz", "big.json.zst"])
def test_compressed_files_are_streamed_not_decompressed_whole(tmp_path, name):
    """12 MB of JSON (a few hundred kB compressed): reading every row holds a small part of it at a time."""
    filler = "x" * 2000
    n = 6000
    p = tmp_path / name
    if name.endswith(".jsonl.gz"):
        with gzip.open(p, "wb", compresslevel=1) as fh:
            for i in range(n):
                fh.write(json.dumps({"prompt": f"{i} {filler}"}).encode() + b"\n")
    else:
        body = b"[" + b",\n".join(json.dumps({"prompt": f"{i} {filler}"}).encode() for i in range(n)) + b"]"
        p.write_bytes(gzip.compress(body, 1) if name.endswith(".gz") else zstandard.ZstdCompressor(level=1).compress(body))
        del body
    assert p.stat().st_size < 1_000_000
    count = [0]

    def read() -> None:
        for item in open_records(p):
            assert not isinstance(item, Reject)
            count[0] += 1

    peak = _peak_bytes(read)
    assert count[0] == n
    assert peak < 4_000_000, peak  # the decompressed text is 12 MB


@pytest.mark.parametrize("chunk", [1, 2, 3, 7, 64])
def test_the_streamed_array_decoder_gives_json_loads_elements_at_any_chunk_boundary(tmp_path, monkeypatch, chunk):
    monkeypatch.setattr(jsonarray, "_CHUNK", chunk)
    values = [{"a": 1}, 12, 12.5e3, -0.25, "s\u00e9\\\"", True, None, [1, [2, {"k": "]"}]], {"prompt": "caf\u00e9 \u4e2d"}, 1234567]
    p = tmp_path / "a.json"
    p.write_bytes(b"\xef\xbb\xbf \n[ " + b" ,\n ".join(json.dumps(v, ensure_ascii=False).encode() for v in values) + b" ]\n")
    assert [v for _, v in open_records(p)] == json.loads(p.read_bytes().decode("utf-8-sig"))
    assert [s for s, _ in open_records(p)] == [f"{p}:{i}" for i in range(1, len(values) + 1)]
    bad = tmp_path / "bad.json"
    bad.write_bytes(b'[{"a": 1}, {"a": 2} {"a": 3}]')
    *ok, brk = list(open_records(bad))
    assert [v for _, v in ok] == [{"a": 1}, {"a": 2}]
    assert brk == Reject(f"{bad}:3", "invalid JSON array at element 3: expected ',' or ']' after element 2, found '{' "
                                     "at char 20; rest of file skipped")
    cut = tmp_path / "cut.json"
    cut.write_bytes(b'[{"a": 1}, {"a": 2')
    *ok, brk = list(open_records(cut))
    assert [v for _, v in ok] == [{"a": 1}] and brk.source == f"{cut}:2"
    assert brk.reason.startswith("truncated JSON array at element 2: ")


def test_a_directory_of_shards_is_read_in_sorted_order_each_row_naming_its_shard(tmp_path):
    d = tmp_path / "shards"
    (d / "b").mkdir(parents=True)
    (d / ".cache").mkdir()
    pq.write_table(pa.Table.from_pylist(ROWS[:2]), d / "a-00001.parquet")
    (d / "a-00000.jsonl.gz").write_bytes(gzip.compress(JSONL[: JSONL.index(b"\n") + 1]))
    (d / "b" / "c.json").write_text(json.dumps(ROWS[3:]))
    (d / "README.md").write_text("# not data")
    (d / ".cache" / "x.jsonl").write_bytes(JSONL)  # hidden: skipped (huggingface_hub's local_dir keeps metadata there)
    (d / ".hidden.jsonl").write_bytes(JSONL)
    got, rejects = load(d)
    assert rejects == []
    assert [(s, t) for s, t, _ in got] == [
        (f"{d}/a-00000.jsonl.gz:1", "question 0"),
        (f"{d}/a-00001.parquet:1", "question 0"),  # the same prompt again: ingest rejects it as a duplicate
        (f"{d}/a-00001.parquet:2", "question 1"),
        (f"{d}/b/c.json:1", "question 3"),
        (f"{d}/b/c.json:2", "question 4"),
    ]
    globbed, _ = load(f"{d}/**/*.json*")
    assert [s for s, _, _ in globbed] == [f"{d}/a-00000.jsonl.gz:1", f"{d}/b/c.json:1", f"{d}/b/c.json:2"]
    with pytest.raises(DatasetError, match="the glob matches no file"):
        iter_prompts(f"{d}/*.nothing")


async def test_fingerprints_a_plain_file_as_before_and_a_shard_set_per_shard(tmp_path):
    plain = tmp_path / "d.jsonl"
    plain.write_bytes(JSONL)
    d = tmp_path / "shards"
    d.mkdir()
    (d / "0.jsonl").write_bytes(JSONL[: JSONL.index(b"\n") + 1])
    (d / "1.jsonl.zst").write_bytes(zstandard.ZstdCompressor().compress(JSONL))
    cfg = make_config(tmp_path, [{"name": "p", "path": str(plain)}, {"name": "s", "path": str(d)}],
                      run={"cross_dataset_duplicates": "buy_each"})  # the same prompts in both: each keeps its own
    st = plain.stat()
    before = json.dumps([str(plain), st.st_size, st.st_mtime_ns, "auto", {}, None], sort_keys=True)  # the stored formula
    assert fingerprint(cfg.datasets[0]) == hashlib.sha256(before.encode()).hexdigest()[:16]
    store = await Store.open(cfg.run.dir)
    try:
        reps = await ingest_all(cfg, store)
        assert [(r.prompts, r.rejected, r.revision) for r in reps] == [(5, 0, None), (5, 1, None)]
        assert reps[1].examples == [f"{d}/1.jsonl.zst:1: duplicate prompt (same key as {d}/0.jsonl:1)"]
        assert [r.skipped_unchanged for r in await ingest_all(cfg, store)] == [True, True]
        os.utime(d / "1.jsonl.zst", (1, 1))  # one shard changed: that dataset is read again
        assert [r.skipped_unchanged for r in await ingest_all(cfg, store)] == [True, False]
        sources = [s for (s,) in await (await store.conn.execute(
            "SELECT source FROM prompts WHERE dataset='s' ORDER BY id")).fetchall()]
        assert sources == [f"{d}/0.jsonl:1", *(f"{d}/1.jsonl.zst:{i}" for i in range(2, 6))]
    finally:
        await store.close()
