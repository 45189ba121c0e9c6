"""A compressed dataset file is checked whole before any of its rows is read.

Every gzip member's CRC-32 and length, and every zstd frame's content checksum, are verified in a
streaming pre-pass (:func:`engine.datasets.compressed.check_integrity`): a failed check refuses the
file (a ``DatasetError`` naming the file, the member or frame and its byte offset, and the tool that
checks it), so no row of it is ever bought; a truncated file keeps only the rows of the members or
frames whose check passed; zstd frames without a checksum are read and noted. The real ``gzip`` and
``zstd`` tools agree with each verdict."""

from __future__ import annotations

import gzip
import json
import shutil
import struct
import subprocess

import pytest
import zstandard

from engine.datasets import DatasetError, iter_prompts
from engine.prompts import Reject


def rows(n: int, start: int = 0) -> bytes:
    return b"".join(json.dumps({"prompt": f"big row {i} " + "x" * 300 + f"{i % 10}x"}).encode() + b"\n"
                    for i in range(start, start + n))


def flip(data: bytes, at: int, n: int = 1) -> bytes:
    b = bytearray(data)
    for i in range(at, at + n):
        b[i] ^= 0x5A
    return bytes(b)


def read(path, notes=None):
    items = list(iter_prompts(path, notes=notes))
    return ([p.messages[0]["content"].split(" x")[0] for p in items if not isinstance(p, Reject)],
            [(r.source, r.reason) for r in items if isinstance(r, Reject)])


def integrity(path, kind: str) -> tuple[str, int, int, int, str | None]:
    """``check_integrity``'s verdict as (kind, units, unchecked, size, truncated)."""
    from engine.datasets.compressed import check_integrity

    i = check_integrity(path, kind, str(path))
    return i.kind, i.units, i.unchecked, i.size, i.truncated


def tool_accepts(tool: str, path) -> bool:
    return subprocess.run([tool, "-t", "-q", str(path)], capture_output=True).returncode == 0


needs_tools = pytest.mark.skipif(not (shutil.which("gzip") and shutil.which("zstd")), reason="gzip/zstd tools not installed")


def test_flipped_bytes_in_a_gzip_member_refuse_the_whole_file_before_any_row(tmp_path):
    """The new-user trial's file: 2,000 rows, 20 bytes flipped in the middle. Deflate decodes most of
    it to plausible garbage; only the CRC-32 at the member's end shows the damage."""
    p = tmp_path / "corrupt.jsonl.gz"
    data = gzip.compress(rows(2000))
    p.write_bytes(flip(data, len(data) // 2, 20))
    with pytest.raises(DatasetError) as e:
        iter_prompts(p)  # refused at the call: not one row is yielded
    msg = str(e.value)
    assert msg.startswith(f"{p}: corrupt gzip data in member 1 (which starts at byte 0 of the file): ")
    assert msg.endswith(f"the file is refused, nothing of it is read: check it with `gzip -t {p}`, then download or "
                        f"re-create it")
    crc = tmp_path / "crc.jsonl.gz"  # only the stored CRC-32 is wrong: every byte of data decodes
    crc.write_bytes(flip(data, len(data) - 8))
    with pytest.raises(DatasetError, match=r"member 1 \(which starts at byte 0 of the file\): its CRC-32 check failed"):
        iter_prompts(crc)
    size = tmp_path / "size.jsonl.gz"
    size.write_bytes(flip(data, len(data) - 2))
    with pytest.raises(DatasetError, match=r"member 1 .*: its length check failed"):
        iter_prompts(size)


def test_a_damaged_later_member_and_garbage_after_a_member_name_where_they_are(tmp_path):
    m1, m2 = gzip.compress(rows(50)), gzip.compress(rows(50, 50))
    p = tmp_path / "cat.jsonl.gz"
    p.write_bytes(m1 + flip(m2, len(m2) - 8))
    with pytest.raises(DatasetError, match=rf"^{p}: corrupt gzip data in member 2 \(which starts at byte {len(m1)} of "
                                           rf"the file\): its CRC-32 check failed"):
        iter_prompts(p)
    junk = tmp_path / "junk.jsonl.gz"
    junk.write_bytes(m1 + b"\x00\x00" + b"trailing text")
    with pytest.raises(DatasetError, match=rf"^{junk}: corrupt gzip data: the bytes at byte {len(m1) + 2}, after member 1, "
                                           rf"start no gzip member \(b'trailing'\)"):
        iter_prompts(junk)
    padded = tmp_path / "padded.jsonl.gz"  # zero padding between and after members is gzip's own
    padded.write_bytes(m1 + b"\x00" * 7 + m2 + b"\x00" * 3)
    got, rejects = read(padded)
    assert rejects == [] and got == [f"big row {i}" for i in range(100)]
    assert integrity(padded, "gzip") == ("gzip", 2, 0, len(rows(100)), None)


def test_a_zstd_frame_whose_checksum_fails_refuses_the_file(tmp_path):
    c = zstandard.ZstdCompressor(write_checksum=True)
    f1, f2 = c.compress(rows(40)), c.compress(rows(40, 40))
    p = tmp_path / "bad.jsonl.zst"
    p.write_bytes(f1 + flip(f2, len(f2) - 1))  # the last 4 bytes of a frame are its checksum
    with pytest.raises(DatasetError) as e:
        iter_prompts(p)
    assert str(e.value) == (f"{p}: corrupt zstd data in frame 2 (which starts at byte {len(f1)} of the file): its content "
                            f"checksum check failed (the data decompress, but not to what the checksum at the frame's end "
                            f"says); the file is refused, nothing of it is read: check it with `zstd -t {p}`, then "
                            f"download or re-create it")
    junk = tmp_path / "junk.jsonl.zst"
    junk.write_bytes(f1 + b"not a frame")
    with pytest.raises(DatasetError, match=rf"^{junk}: corrupt zstd data: the bytes at byte {len(f1)}, after frame 1, start "
                                           rf"no zstd frame"):
        iter_prompts(junk)


def test_zstd_frames_without_a_checksum_are_read_and_noted_and_skippable_frames_hold_nothing(tmp_path):
    plain = zstandard.ZstdCompressor().compress(rows(30))  # the zstandard package writes no checksum by default
    checked = zstandard.ZstdCompressor(write_checksum=True).compress(rows(30, 30))
    skippable = struct.pack("<II", 0x184D2A53, 5) + b"meta!"
    p = tmp_path / "mixed.jsonl.zst"
    p.write_bytes(skippable + plain + checked)
    notes: list[str] = []
    got, rejects = read(p, notes)
    assert rejects == [] and got == [f"big row {i}" for i in range(60)]
    assert notes == [f"{p}: 1 of 2 zstd frame(s) carry no content checksum, so damage inside them cannot be detected "
                     f"(read as decoded); zstd's command line writes one by default (`zstd --check`), the zstandard "
                     f"package with write_checksum=True"]
    assert integrity(p, "zstd") == ("zstd", 2, 1, len(rows(60)), None)


def test_a_truncated_json_lines_file_keeps_the_rows_of_the_members_before_the_cut_and_notes_the_rest(tmp_path):
    """bgzip-like: many members; the file is cut inside the last. Row 21 starts in member 2 and ends in
    member 3, so it is part of the unverified rest."""
    text = rows(30)
    a, b = text.index(b'{"prompt": "big row 10 ') + 5, text.index(b'{"prompt": "big row 20 ') + 5
    members = [gzip.compress(text[:a]), gzip.compress(text[a:b]), gzip.compress(text[b:])]
    p = tmp_path / "cut.jsonl.gz"
    p.write_bytes(members[0] + members[1] + members[2][:-30])
    notes: list[str] = []
    got, rejects = read(p, notes)
    assert got == [f"big row {i}" for i in range(20)]
    reason = (f"compressed data truncated (the file ends inside gzip member 3 (which starts at byte "
              f"{len(members[0]) + len(members[1])}), before the CRC-32 at its end; its rows cannot be verified); "
              f"rest of file skipped")
    assert rejects == [(f"{p}:21", reason)]
    assert notes == [f"{p}:21: {reason}"]
    assert integrity(p, "gzip")[3] == b


def test_a_truncated_array_keeps_every_element_of_the_frames_before_the_cut_whatever_the_chunking(tmp_path, monkeypatch):
    """The streamed array decoder reads past the checked bytes in one go: the elements before that point
    still come out, then the one reject."""
    from engine.datasets import jsonarray

    monkeypatch.setattr(jsonarray, "_CHUNK", 1 << 20)  # one read spans the end of the checked data
    items = [{"prompt": f"element {i} " + "z" * 500} for i in range(60)]
    text = json.dumps(items).encode()
    split = text.index(b'{"prompt": "element 37 ') + 3
    c = zstandard.ZstdCompressor(write_checksum=True)
    head = c.compress(text[:split])
    p = tmp_path / "cut.json.zst"
    p.write_bytes(head + c.compress(text[split:])[:-6])
    items_read = list(iter_prompts(p))
    assert [x.messages[0]["content"].split(" z")[0] for x in items_read[:-1]] == [f"element {i}" for i in range(37)]
    assert items_read[-1] == Reject(f"{p}:38", f"compressed data truncated (the file ends inside zstd frame 2 (which "
                                               f"starts at byte {len(head)}), before the content checksum at its end; "
                                               f"its rows cannot be verified); rest of file skipped")


def test_the_check_streams_in_bounded_memory(tmp_path):
    import tracemalloc

    p = tmp_path / "big.jsonl.gz"
    written = 0
    with gzip.open(p, "wb", compresslevel=1) as fh:
        for i in range(40):
            written += fh.write(rows(1000, i * 1000))  # 13 MB decompressed
    tracemalloc.start()
    try:
        verdict = integrity(p, "gzip")
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert verdict == ("gzip", 1, 0, written, None) and written > 13_000_000
    assert peak < 2_000_000, peak
    blank = tmp_path / "blank.jsonl.gz"  # 1,000:1: each step's output is cut at the chunk size, input left over
    blank.write_bytes(gzip.compress(b"\n" * 20_000_000))
    assert integrity(blank, "gzip") == ("gzip", 1, 0, 20_000_000, None)
    z = tmp_path / "blank.jsonl.zst"
    z.write_bytes(zstandard.ZstdCompressor(write_checksum=True).compress(b"\n" * 20_000_000))
    assert integrity(z, "zstd") == ("zstd", 1, 0, 20_000_000, None)


@needs_tools
def test_the_gzip_and_zstd_tools_agree_with_each_verdict(tmp_path):
    """What the refusal tells the user to run says the same; files the zstd tool writes carry checksums."""
    data = gzip.compress(rows(200))
    bad = tmp_path / "bad.jsonl.gz"
    bad.write_bytes(flip(data, len(data) // 2, 20))
    good = tmp_path / "good.jsonl.gz"
    good.write_bytes(data)
    assert not tool_accepts("gzip", bad) and tool_accepts("gzip", good)
    src = tmp_path / "r.jsonl"
    src.write_bytes(rows(200))
    subprocess.run(["zstd", "-q", str(src), "-o", str(tmp_path / "r.jsonl.zst")], check=True)
    z = tmp_path / "r.jsonl.zst"
    notes: list[str] = []
    got, rejects = read(z, notes)
    assert len(got) == 200 and rejects == [] and notes == []  # checked: no note
    zb = z.read_bytes()
    z.write_bytes(flip(zb, len(zb) - 2))
    assert not tool_accepts("zstd", z)
    with pytest.raises(DatasetError, match="corrupt zstd data in frame 1 .*content checksum check failed"):
        iter_prompts(z)


def test_a_file_that_changes_after_its_check_is_an_error_not_rows(tmp_path, monkeypatch):
    """The check and the read are two passes: damage that appears between them still refuses the file."""
    p = tmp_path / "d.jsonl.gz"
    data = gzip.compress(rows(300))
    p.write_bytes(data)
    from engine.datasets import compressed

    real = compressed.check_integrity

    def check_then_damage(path, kind, shown):
        result = real(path, kind, shown)
        p.write_bytes(flip(data, len(data) - 8))
        return result

    monkeypatch.setattr("engine.datasets.readers.check_integrity", check_then_damage)
    with pytest.raises(DatasetError, match="corrupt gzip data in member 1 .*CRC-32 check failed"):
        list(iter_prompts(p))
