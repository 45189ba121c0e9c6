"""The cheap fidelity signals read from a real run store (engine.storage.cheapsignals): results written by the
store's writer, verdicts by the validations table's own upsert, read back per provider as CheapRecords."""

from __future__ import annotations

import asyncio
import json

from engine.client.types import Completion, ToolCall, Usage
from engine.fidelity.cheap import CheapRecord, judge_cheap
from engine.storage.cheapsignals import cheap_records
from engine.storage.handle import connect_ro
from engine.storage.store import Store
from engine.storage.validations import open_validations, pack_ids, upsert
from engine.storage.writer import StoreWriter

TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"],
    "additionalProperties": False}}}]


def _done(reasoning: str, content: str, provider: str, *, completion_tokens: int = 100, finish: str = "stop",
          calls: tuple[ToolCall, ...] = (), flags: tuple[str, ...] = ()) -> Completion:
    return Completion(reasoning=reasoning, content=content, tool_calls=calls, finish_reason=finish,
                      native_finish_reason=finish, usage=Usage(prompt_tokens=20, completion_tokens=completion_tokens,
                                                               reasoning_tokens=0, cost_usd=0.001),
                      provider=provider, model="m", generation_id="g", latency_s=0.1, ttft_s=0.01, flags=flags)


def _verdict(pid: int, key: str, provider: str, reasons: list[str], prompt_diff: int | None) -> tuple:
    return (pid, "d", key, provider, "stop", int(not reasons), json.dumps(reasons), "[]", 20, 100, 100, 0,
            prompt_diff, "tok", pack_ids([1, 2, 3]), 0.0)


async def _build(run_dir) -> dict[str, int]:
    store = await Store.open(run_dir)
    await store.register_dataset("d", 0, "d.jsonl", None)
    rows = [(f"k{i}", f"d.jsonl:{i}", "short" if i < 4 else "long", 10,
             json.dumps([{"role": "user", "content": f"q{i}"}]), json.dumps(TOOLS if i in (2, 3) else []))
            for i in range(6)]
    await store.ingest_batch("d", rows)
    await store.finish_ingest("d", "fp", 0)
    ids = {p.key: p.id for cls in ("short", "long") for p in await store.fetch_pending("d", cls, 0, 10)}
    w = StoreWriter(store)
    good = ToolCall("c1", "get_weather", '{"city": "Paris"}')
    extra = ToolCall("c2", "get_weather", '{"city": "Paris", "unit": "C"}')  # additionalProperties false
    w.add_result(ids["k0"], "d", "k0", _done("r" * 30, "c" * 10, "A", completion_tokens=80), 1)
    w.add_result(ids["k1"], "d", "k1", _done("", "c" * 10, "A", finish="length", flags=("usage_in_choice",)), 1)
    w.add_result(ids["k2"], "d", "k2", _done("r" * 10, "", "B", finish="tool_calls", calls=(good,)), 1)
    w.add_result(ids["k3"], "d", "k3", _done("", "", "B", finish="tool_calls", calls=(extra,),
                                             flags=("replacement_char",)), 1)
    w.add_result(ids["k4"], "d", "k4", _done("", "x", "B"), 1)
    w.add_result(ids["k5"], "d", "k5", _done("r", "x", "C"), 1)
    await w.flush()
    await store.close()
    h = open_validations(run_dir)
    upsert(h, [_verdict(ids["k0"], "k0", "A", [], 0), _verdict(ids["k1"], "k1", "A", ["truncated"], -3),
               _verdict(ids["k2"], "k2", "B", ["method_disagree"], None),
               _verdict(ids["k3"], "k3", "B", ["replacement_char"], 2)])
    h.close()
    return ids


def test_cheap_records_from_a_real_store(tmp_path):
    ids = asyncio.run(_build(tmp_path))
    with connect_ro(tmp_path) as h:
        recs = cheap_records(h)
        later = cheap_records(h, since_id=ids["k3"])
    assert sorted(recs) == ["A", "B", "C"]
    a0, a1 = recs["A"]
    # reasoning by the characters the model wrote: 30 of 40 characters of 80 tokens
    assert a0 == CheapRecord("A", 80, 60, "stop", False, False, None, 0, True, "d/short")
    # a note flag (usage_in_choice) is no drift; prompt_diff is billed minus ours (validations: ours minus billed)
    assert a1 == CheapRecord("A", 100, 0, "length", False, False, None, 3, True, "d/short")
    b2, b3, b4 = recs["B"]
    assert (b2.tool_calls_declared, b2.tool_call_valid, b2.reconstruct_ok, b2.prompt_diff) == (True, True, False, None)
    assert b2.reasoning_tokens == round(100 * 10 / (10 + len('{"city": "Paris"}')))
    assert (b3.tool_call_valid, b3.wire_flagged, b3.reconstruct_ok, b3.prompt_diff) == (False, True, True, -2)
    assert (b4.reconstruct_ok, b4.prompt_diff, b4.stratum, b4.tool_call_valid) == (None, None, "d/long", None)
    assert {p: [r.completion_tokens for r in rs] for p, rs in later.items()} == {"B": [100], "C": [100]}


def test_a_store_never_validated_reads_as_not_validated(tmp_path):
    async def build() -> None:
        store = await Store.open(tmp_path)
        await store.register_dataset("d", 0, "d.jsonl", None)
        await store.ingest_batch("d", [("k0", "d.jsonl:1", "short", 10, "[]", "[]")])
        (p,) = await store.fetch_pending("d", "short", 0, 10)
        w = StoreWriter(store)
        w.add_result(p.id, "d", "k0", _done("", "hi", "A"), 1)
        await w.flush()
        await store.close()
    asyncio.run(build())
    with connect_ro(tmp_path) as h:
        (r,) = cheap_records(h)["A"]
    assert (r.reconstruct_ok, r.prompt_diff) == (None, None)
    # a lone provider has nothing to be compared with
    assert judge_cheap({"A": [r]}, false_alarm=0.01, min_records=1, looks=1)["A"].reason == \
        "no other provider to compare with"
