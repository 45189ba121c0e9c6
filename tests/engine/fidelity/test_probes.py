"""Fidelity probes, the pure part: K2VV's tool-call trigger F1 and schema accuracy, the greedy first divergence,
the verdict against a reference provider, the probe set, the providers probed and the cost projection."""

from __future__ import annotations

import json

import pytest

from engine.fidelity.probes import (
    ProbeOutcome,
    ProbeThresholds,
    TriggerCounts,
    first_divergence,
    judge_probes,
    response_called,
    response_schema_ok,
    schema_accuracy,
    trigger_counts,
    trigger_f1,
)
from engine.fidelity.probeset import (
    CostProjection,
    Probe,
    ProbeTarget,
    listing_prices,
    parse_probes,
    probe_targets,
    project_cost,
    prompt_tokens_estimate,
    same_provider,
)
from engine.run.probes import BUNDLED, load_probe_set

WEATHER = {"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}, "unit": {"type": "string", "enum": ["c", "f"]}},
    "required": ["city"], "additionalProperties": False}}}


def call(name: str, args: object) -> dict:
    return {"id": "functions.x:0", "type": "function",
            "function": {"name": name, "arguments": args if isinstance(args, str) else json.dumps(args)}}


# -- the metrics --------------------------------------------------------------------------------------------

def test_trigger_f1_is_k2vvs_harmonic_mean_of_precision_and_recall():
    pairs = [(True, True)] * 3 + [(False, True)] + [(True, False)] * 2 + [(False, False)] * 4
    c = trigger_counts(pairs)
    assert c == TriggerCounts(tp=3, fp=1, fn=2, tn=4) and c.pairs == 10
    precision, recall = 3 / 4, 3 / 5
    assert trigger_f1(c) == pytest.approx(2 * precision * recall / (precision + recall))
    assert trigger_f1(c) == pytest.approx(2 / 3)
    assert trigger_f1(TriggerCounts(tp=5)) == 1.0
    assert trigger_f1(TriggerCounts(fp=2, fn=1)) == 0.0  # never agreed on a call
    assert trigger_f1(TriggerCounts(tn=7)) is None  # nobody called: nothing to compare


def test_called_and_schema_accuracy_follow_the_declared_tools():
    assert response_called("tool_calls", []) and response_called("stop", [call("get_weather", {"city": "X"})])
    assert not response_called("stop", []) and not response_called("length", [])
    good, tools = [call("get_weather", {"city": "Lisbon", "unit": "c"})], [WEATHER]
    assert response_schema_ok(good, tools, True) is True
    assert response_schema_ok([call("get_weather", {"unit": "c"})], tools, True) is False  # required city missing
    assert response_schema_ok([call("get_weather", {"city": "L", "unit": "k"})], tools, True) is False  # enum
    assert response_schema_ok([call("get_weather", {"city": 3})], tools, True) is False  # type
    assert response_schema_ok([call("get_weather", {"city": "L", "x": 1})], tools, True) is False  # extra key
    assert response_schema_ok([call("get_wether", {"city": "L"})], tools, True) is False  # undeclared tool
    assert response_schema_ok([call("get_weather", '{"city": "L"')], tools, True) is False  # not JSON
    assert response_schema_ok([], tools, True) is False  # finish tool_calls without a call
    assert response_schema_ok([], tools, False) is None
    assert schema_accuracy([True, True, None, False, True, None]) == (0.75, 4)
    assert schema_accuracy([None, None]) == (None, 0)


def test_first_divergence():
    assert first_divergence([1, 2, 3], [1, 2, 3]) is None
    assert first_divergence([1, 2, 3], [1, 9, 3]) == 1
    assert first_divergence([5], [6]) == 0
    assert first_divergence([1, 2], [1, 2, 3]) == 2  # a strict prefix diverges where the shorter ends
    assert first_divergence("the cat sat".split(), "the cat stood".split()) == 2
    assert first_divergence([], []) is None


# -- the verdict --------------------------------------------------------------------------------------------

def out(provider: str, pid: str, called: bool, *, finish: str | None = None, schema: bool | None = None,
        greedy: bool = False, text: str = "", ids: tuple[int, ...] | None = None, pinned: bool = True,
        repeat: int = 0) -> ProbeOutcome:
    finish = finish or ("tool_calls" if called else "stop")
    return ProbeOutcome(pid, provider, repeat, greedy, finish, called=called,
                        schema_ok=(True if schema is None else schema) if called else None, text=text,
                        token_ids=ids, served=provider if pinned else "Other", pinned_ok=pinned)


def test_an_honest_provider_is_ok_and_one_that_misses_calls_is_below():
    ref = [out("R", f"p{i}", i < 5) for i in range(10)]
    honest = [out("A", f"p{i}", i < 5) for i in range(10)]
    # B calls on 2 of the reference's 5 and once where it did not: TP 2, FP 1, FN 3, TN 4 -> F1 4/8
    b = [out("B", f"p{i}", i in (0, 1, 7)) for i in range(10)]
    v = judge_probes(ref + honest + b, "R", ProbeThresholds(min_f1=0.73, min_schema=0.95, min_pairs=8))
    assert list(v) == ["R", "A", "B"]
    assert v["R"].verdict == "reference" and v["R"].reasons == ()
    assert (v["A"].verdict, v["A"].f1, v["A"].tp, v["A"].tn, v["A"].pairs) == ("ok", 1.0, 5, 5, 10)
    assert (v["B"].verdict, v["B"].tp, v["B"].fp, v["B"].fn, v["B"].tn) == ("below", 2, 1, 3, 4)
    assert v["B"].f1 == pytest.approx(0.5)
    assert v["B"].reasons == ("tool-call trigger F1 50.0% < 73%",)
    # the same F1 passes a lower threshold
    assert judge_probes(ref + b, "R", ProbeThresholds(min_f1=0.4))["B"].verdict == "ok"


def test_schema_accuracy_below_threshold_reads_below_even_with_a_perfect_trigger():
    ref = [out("R", f"p{i}", i < 4) for i in range(8)]
    bad = [out("B", f"p{i}", i < 4, schema=i != 0) for i in range(8)]  # 1 of 4 calls malformed
    v = judge_probes(ref + bad, "R", ProbeThresholds(min_pairs=8))["B"]
    assert v.f1 == 1.0 and v.schema_accuracy == 0.75 and v.tool_calls == 4
    assert v.verdict == "below" and v.reasons == ("schema accuracy 75.0% < 95% (4 tool calls)",)


def test_truncated_failed_and_misrouted_answers_leave_the_f1():
    ref = [out("R", f"p{i}", i < 5) for i in range(10)]
    a = [out("A", f"p{i}", i < 5) for i in range(7)]
    a.append(out("A", "p7", False, finish="length"))  # cut by max_tokens: not a decision
    a.append(ProbeOutcome("p8", "A", 0, False, None, error="server HTTP 502"))  # failed
    a.append(out("A", "p9", True, pinned=False))  # served by another provider despite the pin
    v = judge_probes(ref + a, "R", ProbeThresholds(min_pairs=5))["A"]
    assert (v.pairs, v.truncated, v.errors, v.misrouted, v.sent) == (7, 1, 1, 1, 10)
    assert v.verdict == "ok" and v.f1 == 1.0
    assert v.reasons == ("1 answers served by another provider than pinned",)
    few = judge_probes(ref + a, "R", ProbeThresholds(min_pairs=8))["A"]
    assert few.verdict == "insufficient" and few.reasons[0] == "7 comparable pairs (< 8)"


def test_failed_provider_no_calls_and_a_silent_reference():
    ref = [out("R", f"p{i}", False) for i in range(10)]
    quiet = [out("A", f"p{i}", False) for i in range(10)]
    dead = [ProbeOutcome(f"p{i}", "D", 0, False, None, error="route HTTP 404") for i in range(10)]
    v = judge_probes(ref + quiet + dead, "R")
    assert v["A"].verdict == "insufficient" and v["A"].reasons == ("no tool call on either side",)
    assert v["D"].verdict == "failed" and v["D"].reasons == ("all 10 requests failed",)
    gone = [ProbeOutcome(f"p{i}", "R", 0, False, None, error="x") for i in range(10)]
    v2 = judge_probes(gone + quiet, "R")
    assert v2["R"].reasons == ("reference answered none of 10 probes",)
    assert v2["A"].verdict == "insufficient" and v2["A"].reasons == ("the reference R answered no probe",)


def test_greedy_probes_report_the_first_divergence_in_tokens_or_words():
    ref = [out("R", "g1", False, greedy=True, text="a b c d", ids=(1, 2, 3, 4)),
           out("R", "g2", False, greedy=True, text="x y z"),
           out("R", "g3", False, greedy=True, text="p q r s", finish="length"),
           out("R", "s", False, text="sampled")]
    a = [out("A", "g1", False, greedy=True, text="a b c e", ids=(1, 2, 9, 4)),  # tokens: index 2
         out("A", "g2", False, greedy=True, text="x y w"),  # no ids from A: words, index 2
         out("A", "g3", False, greedy=True, text="p q"),  # the reference was cut: only the common length counts
         out("A", "s", False, text="other")]  # not greedy: never compared
    v = judge_probes(ref + a, "R")["A"]
    assert (v.greedy_pairs, v.greedy_identical, v.first_divergence) == (3, 1, (2, 2))
    assert v.divergence_unit == "words"  # the last pair compared had no token ids
    assert v.truncated == 1


def test_repeats_pair_with_the_same_repeat_of_the_reference():
    ref = [out("R", "p", True, repeat=0), out("R", "p", False, repeat=1)]
    a = [out("A", "p", True, repeat=0), out("A", "p", False, repeat=1)]
    swapped = [out("B", "p", False, repeat=0), out("B", "p", True, repeat=1)]
    v = judge_probes(ref + a + swapped, "R", ProbeThresholds(min_pairs=1))
    assert (v["A"].tp, v["A"].tn, v["A"].f1) == (1, 1, 1.0)
    assert (v["B"].fp, v["B"].fn, v["B"].f1, v["B"].verdict) == (1, 1, 0.0, "below")


def test_verdict_to_dict_is_json():
    v = judge_probes([out("R", "p", True), out("A", "p", True)], "R", ProbeThresholds(min_pairs=1))["A"]
    d = json.loads(json.dumps(v.to_dict()))
    assert d["pairs"] == 1 and d["verdict"] == "ok" and d["first_divergence"] == [] and d["f1"] == 1.0


# -- the probe set, the targets, the cost -------------------------------------------------------------------

def test_parse_probes_and_its_errors():
    lines = ['{"id": "a", "messages": [{"role": "user", "content": "hi"}], "temperature": 0}', "",
             '{"id": "b", "expect": "tool", "messages": [{"role": "user", "content": "w"}], "tools": [{"type": "function"}]}']
    a, b = parse_probes(lines)
    assert (a.id, a.greedy, a.tools, b.expect, b.greedy, b.temperature) == ("a", True, [], "tool", False, None)
    bad = {
        '{"id": "a", "messages": []}': "f:1: messages must be a non-empty list",
        '{"messages": [{"role": "user"}]}': "f:1: id must be a non-empty string",
        '{"id": "a", "messages": [{"role": "user"}], "temperature": 3}': "f:1: temperature must be a number in [0, 2]",
        '{"id": "a", "messages": [{"role": "user"}], "expect": "yes"}': 'f:1: expect must be "tool" or "none"',
        "[1]": "f:1: expected a JSON object",
        "{": "f:1: not JSON",
    }
    for line, msg in bad.items():
        with pytest.raises(ValueError, match=msg.replace("[", r"\[").replace("]", r"\]")):
            parse_probes([line], "f")
    with pytest.raises(ValueError, match="f:2: duplicate id 'a'"):
        parse_probes(['{"id": "a", "messages": [{"role": "user"}]}'] * 2, "f")
    with pytest.raises(ValueError, match="f: no probe"):
        parse_probes(["", " "], "f")


def test_the_bundled_probe_set():
    probes = load_probe_set(None)
    assert BUNDLED.name == "fidelity_probes.jsonl" and len(probes) == 24
    assert sum(p.expect == "tool" for p in probes) == 12 and all(p.tools for p in probes if p.expect == "tool")
    assert sum(bool(p.tools) for p in probes if p.expect == "none") == 4  # tools offered, no call needed
    assert sum(p.greedy for p in probes) == 5


def test_probe_targets():
    eps = [{"provider_name": "Moonshot AI", "tag": "moonshotai"}, {"provider_name": "DeepInfra", "tag": "deepinfra/fp4"},
           {"provider_name": "DeepInfra", "tag": "deepinfra/fp8"}, {"provider_name": "Together", "tag": None}]
    t = probe_targets("deepinfra", endpoints=eps)
    assert t == [ProbeTarget("DeepInfra", "deepinfra"), ProbeTarget("Moonshot AI", "moonshotai"),
                 ProbeTarget("Together", "together")]
    assert [x.name for x in probe_targets("moonshotai", endpoints=eps, ignore=["together"])] == ["Moonshot AI", "DeepInfra"]
    assert [x.name for x in probe_targets("moonshotai", endpoints=eps, only=["deepinfra"])] == ["moonshotai", "DeepInfra"]
    assert probe_targets("b", configured=["a", "b", "c"]) == [ProbeTarget("b", "b"), ProbeTarget("a", "a"), ProbeTarget("c", "c")]
    assert [x.slug for x in probe_targets("x", order=["y", "z"])] == ["x", "y", "z"]
    with pytest.raises(ValueError, match="no provider to compare with the reference 'x'"):
        probe_targets("x")
    assert same_provider("Moonshot AI", ProbeTarget("moonshotai", "moonshotai"))
    assert same_provider("", ProbeTarget("a", "a")) and not same_provider("SimB", ProbeTarget("SimA", "sima"))


def test_cost_projection_by_hand():
    p = Probe("p", [{"role": "user", "content": "abcd" * 10}])
    assert prompt_tokens_estimate(p) == 42 // 4 + 4  # '"abcd..."' is 42 characters with its quotes
    targets = [ProbeTarget("A", "a"), ProbeTarget("B", "b")]
    c = project_cost([p], targets, 1, 100, {"A": (1e-6, 2e-6), "B": (1e-6, 2e-6)})
    assert c.requests == 2 and c.est_usd == pytest.approx(2 * (14e-6 + 50 * 2e-6))
    assert c.max_usd == pytest.approx(2 * (14e-6 + 100 * 2e-6))
    c3 = project_cost([p, p], targets, 3, 100, {"A": (1e-6, 2e-6)})
    assert c3.requests == 12 and c3.unpriced == ("B",)
    assert c3.max_usd == pytest.approx(3 * 2 * (14e-6 + 100 * 2e-6))
    assert CostProjection(24, 4, 1, 0.41, 0.93).line() == \
        "probes: 24 x 4 providers = 96 requests, est. $0.41 (max $0.93 at max_tokens)"
    assert CostProjection(24, 4, 2, 0.82, 1.86, ("X",)).line() == (
        "probes: 24 x 4 providers x 2 repeats = 192 requests, est. $0.82 (max $1.86 at max_tokens); "
        "price unknown for X (counted $0)")


def test_listing_prices():
    doc = {"data": {"endpoints": [
        {"provider_name": "A", "pricing": {"prompt": "0.0000006", "completion": "0.0000025"}},
        {"provider_name": "A", "pricing": {"prompt": "1", "completion": "1"}},  # a second endpoint: the first wins
        {"provider_name": "B", "pricing": {"prompt": "-1", "completion": "0.1"}},  # variable pricing: unknown
        {"provider_name": "C", "pricing": {"prompt": "x"}}, {"pricing": {}}]}}
    assert listing_prices(doc) == {"A": (6e-7, 2.5e-6)}
    assert listing_prices(None) == {} and listing_prices({"data": []}) == {}


def test_probes_config(tmp_path):
    from helpers import make_config

    from engine.config import ConfigError

    cfg = make_config(tmp_path)
    assert (cfg.fidelity.probes.enabled, cfg.fidelity.probes.path, cfg.fidelity.probes.reference) == (False, None, None)
    cfg = make_config(tmp_path, fidelity={"probes": {"enabled": True, "reference": "moonshotai", "path": "p.jsonl"}})
    assert cfg.fidelity.probes.path == tmp_path / "p.jsonl"  # relative to the config file
    with pytest.raises(ConfigError, match=r"fidelity\.probes.*reference: required when enabled"):
        make_config(tmp_path, fidelity={"probes": {"enabled": True}})
