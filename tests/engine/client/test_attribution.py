"""Attribution (issue 35, item 1): who served a completion, and whether it is one generation of the model asked
for. Beyond the handed case ``../shared/cases/27_model_substituted``: other substituted names, dated and
case-changed ids accepted, spliced streams (id, model, provider changes) assembled by the real accumulator, and
the attribution fields carried through the fleet and the journal."""

from __future__ import annotations

import pytest
from casesrv import chunk
from helpers import acc_of

from engine.client.attribution import GenerationIdentity, attribute, model_mismatch, same_model, sampling_settings
from engine.client.conformance import FAILING, failing, finalize
from engine.client.types import ChatRequest, Completion, Usage
from engine.tokens.validate import NON_STRUCTURAL, REASONS

ASKED = "moonshotai/kimi-k2.5"


def completion(model: str = ASKED, **kw) -> Completion:
    base = dict(reasoning="", content="ok", tool_calls=(), finish_reason="stop", native_finish_reason=None,
                usage=Usage(3, 5, 0, None), provider="P", model=model, generation_id="g", latency_s=1.0, ttft_s=0.1)
    return Completion(**{**base, **kw})


def req(**body) -> ChatRequest:
    return ChatRequest(messages=[{"role": "user", "content": "hi"}], max_tokens=100, body={"model": ASKED, **body})


# -- the same-model rule ------------------------------------------------------------------------------------

@pytest.mark.parametrize("served", [
    ASKED,
    "moonshotai/kimi-k2.5-0127",  # OpenRouter's dated id of the slug (MMDD)
    "moonshotai/kimi-k2.5-20250127",  # YYYYMMDD
    "moonshotai/kimi-k2.5-250127",  # YYMMDD
    "moonshotai/kimi-k2.5-2025-01-27",  # ISO date
    "moonshotai/kimi-k2.5-001",  # a zero-padded version
    "MoonshotAI/Kimi-K2.5",  # letter case (Together, vLLM's served name)
    "moonshotai/Kimi-K2.5-0127",
    "kimi-k2.5",  # the server names it without its author
    "moonshotai/kimi-k2.5:nitro",  # an OpenRouter variant
    " moonshotai/kimi-k2.5 ",
])
def test_the_asked_model_under_its_other_spellings_is_the_same(served):
    assert same_model(ASKED, served) and not model_mismatch(ASKED, served)


@pytest.mark.parametrize("served", [
    "moonshotai/kimi-k2-thinking",  # same family and tokenizer, another model (case 27)
    "z-ai/glm-4.7",  # another vendor (case 27)
    "anthropic/claude-3.5",
    "moonshotai/kimi-k2-0905",  # a dated id of ANOTHER Kimi
    "openai/gpt-4o-mini",
    "moonshotai/kimi-k2.5-instruct",  # a suffix that is no date nor version
    "moonshotai/kimi-k2.5-01",  # two digits: no date
    "moonshotai/kimi-k2.51",  # a longer name, not a suffix
    "moonshotai/kimi-k2",  # the asked id is no prefix of it
    "other/kimi-k2.5",  # another author's model of that name
    "deepseek/deepseek-chat-v3-0324",
])
def test_another_model_is_a_mismatch(served):
    assert not same_model(ASKED, served) and model_mismatch(ASKED, served)


def test_dated_ids_follow_the_asked_id_both_ways_and_unknown_ids_are_no_mismatch():
    assert same_model("moonshotai/kimi-k2.5:free", "moonshotai/kimi-k2.5-0127")
    assert same_model("moonshotai/kimi-k2.5-0127", "moonshotai/kimi-k2.5-0127")
    assert not same_model("moonshotai/kimi-k2.5-0127", "moonshotai/kimi-k2.5")  # a pinned date is exact
    assert same_model("/models/Kimi-K2.5", "/models/kimi-k2.5")  # vLLM serving a local path
    assert not model_mismatch(ASKED, "") and not model_mismatch("", "z-ai/glm-4.7")  # nothing to compare


def test_attribute_flags_a_substitute_and_records_the_sampling_settings():
    c = attribute(req(temperature=0.6, top_p=0.9), completion("z-ai/glm-4.7"))
    assert c.flags == ("model_mismatch",) and (c.temperature, c.top_p) == (0.6, 0.9) and c.model == "z-ai/glm-4.7"
    same = attribute(req(temperature=1, top_p=0.95), completion("moonshotai/kimi-k2.5-0127"))
    assert same.flags == () and (same.temperature, same.top_p) == (1.0, 0.95)
    assert sampling_settings({"temperature": True, "top_p": "0.9"}) == (None, None)  # not numbers: not sent as such
    bare = completion()
    assert attribute(req(), bare) is bare  # nothing to add: the same object


def test_finalize_raises_model_mismatch_and_it_fails_validation_as_a_non_structural_wire_reason():
    c = finalize(req(temperature=1.0), completion("anthropic/claude-3.5"))
    assert "model_mismatch" in c.flags and c.temperature == 1.0 and c.top_p is None
    for name in ("model_mismatch", "spliced_generation"):
        assert name in FAILING and name in REASONS and name in NON_STRUCTURAL
    assert failing(("finish_alias", "spliced_generation", "model_mismatch")) == ["model_mismatch", "spliced_generation"]


# -- one stream, two generations ----------------------------------------------------------------------------

def _spliced_ids() -> list[dict]:
    return [chunk({"role": "assistant", "reasoning": "Let me see."}, gid="gen-A"), chunk({"content": "The"}, gid="gen-A"),
            chunk({"content": " answer"}, gid="gen-B"), chunk({"content": " is 4."}, gid="gen-B"),
            chunk({}, "stop", gid="gen-B")]


def test_a_chunk_id_change_mid_stream_is_a_spliced_generation():
    c = acc_of(*_spliced_ids()).completion()
    assert c.flags == ("spliced_generation",) and c.generation_id == "gen-A" and c.content == "The answer is 4."


@pytest.mark.parametrize("field,second", [("model", "openai/gpt-4o-mini"), ("provider", "Fallback Inc")])
def test_a_model_or_provider_change_mid_stream_is_a_spliced_generation(field, second):
    chunks = [chunk({"content": "The"}), chunk({"content": " rest"}), chunk({}, "stop")]
    chunks[1][field] = second
    acc = acc_of(*chunks)
    c = acc.completion()
    assert c.flags == ("spliced_generation",)
    assert (c.model, c.provider) == (ASKED, "Scripted")  # the first generation's identity is kept


def test_per_chunk_ids_empty_fields_and_a_late_fingerprint_are_no_splice():
    minted = [chunk({"content": w}, gid=f"chatcmpl-{i}") for i, w in enumerate(["a", "b", "c", "d"])]
    c = acc_of(*minted, chunk({}, "stop", gid="chatcmpl-9")).completion()
    assert c.flags == () and c.generation_id == "chatcmpl-0"  # a server minting an id per chunk (llama.cpp #5876)
    odd_close = [chunk({"content": "a"}, gid="g"), chunk({"content": "b"}, gid="g"), chunk({}, "stop", gid="gen-1")]
    assert acc_of(*odd_close).completion().flags == ()
    azure = [{"id": "", "model": "", "choices": [], "prompt_filter_results": []},
             chunk({"content": "x"}, system_fingerprint="fp_1"), chunk({}, "stop", system_fingerprint="fp_1"),
             {"id": "gen-1", "choices": [], "usage": {"prompt_tokens": 1, "completion_tokens": 1}}]
    c = acc_of(*azure).completion()
    assert c.flags == () and c.system_fingerprint == "fp_1" and c.model == ASKED and c.provider == "Scripted"


def test_generation_identity_reports_the_first_change_and_keeps_the_first_values():
    g = GenerationIdentity()
    assert not g.observe({"id": "x", "model": "m", "provider": "P", "system_fingerprint": "fp_a"})
    assert not g.observe({"id": "x"})
    assert not g.observe({"id": "y"})  # one odd chunk (a closing chunk under another id): not yet
    assert g.observe({"id": "y"})  # "y" carried twice too: a second generation
    assert (g.chunk_id, g.model, g.provider, g.system_fingerprint) == ("x", "m", "P", "fp_a")
    h = GenerationIdentity()
    for cid in ("a", "b", "c", "a"):  # ids minted per chunk
        assert not h.observe({"id": cid, "model": "m"})
    assert not h.observe({"id": "a"}) and h.observe({"model": "other"})  # one stable id; then a model change


# -- who served it: the endpoint and the journal ------------------------------------------------------------

async def test_the_fleet_names_the_base_urls_entry_that_served_each_completion():
    from engine.client.chat import ChatClient
    from engine.client.fleet import EndpointFleet

    urls = ["http://10.0.0.1:8000/v1", "http://10.0.0.2:8000/v1"]
    sent: list[int] = []

    async def send(i, r, progress):
        sent.append(i)
        return completion()

    fleet = EndpointFleet([(u, 1) for u in urls], lambda u: ChatClient(u, None), send=send)
    try:
        got = [await fleet.complete(req()) for _ in range(2)]
    finally:
        await fleet.aclose()
    assert [c.endpoint for c in got] == [urls[i] for i in sent] and got[0].endpoint


def test_the_journal_keeps_the_attribution_and_reads_older_lines():
    from engine.stream.journal import completion_from_dict, completion_to_dict

    c = completion("moonshotai/kimi-k2.5-0127", endpoint="http://10.0.0.2:8000/v1", system_fingerprint="fp_9",
                   temperature=0.6, top_p=0.95, flags=("model_mismatch",))
    assert completion_from_dict(completion_to_dict(c)) == c
    old = completion_to_dict(c)
    for k in ("endpoint", "system_fingerprint", "temperature", "top_p"):
        del old[k]
    back = completion_from_dict(old)
    assert (back.endpoint, back.system_fingerprint, back.temperature, back.top_p) == ("", "", None, None)


# -- end to end: the real client, a run, its exports --------------------------------------------------------

SUBSTITUTES = {"thinking": "moonshotai/kimi-k2-thinking", "glm": "z-ai/glm-4.7", "claude": "anthropic/claude-3.5",
               "k2old": "moonshotai/kimi-k2-0905", "dated": "moonshotai/kimi-k2.5-20250127",
               "caps": "MoonshotAI/Kimi-K2.5", "control": ASKED}


def _respond(body: dict, n: int):
    from casesrv import last_user, stream, usage
    from fixtures_tokens import true_count

    r, c = "A short thought.", "Amber."
    billed = usage(9, true_count(r, c), cost=0.0001)
    q = last_user(body).split(":")[0]
    if q == "spliced":  # a gateway's fallback continues the answer under another model, provider and id
        return stream(chunk({"reasoning": r}, gid="gen-A"), chunk({"content": "Am"}, gid="gen-A"),
                      chunk({"content": "ber."}, gid="gen-B", model="openai/gpt-4o-mini", provider="Fallback"),
                      chunk({}, "stop", gid="gen-B", model="openai/gpt-4o-mini", provider="Fallback", usage=billed))
    m = SUBSTITUTES[q]
    return stream(chunk({"reasoning": r}, model=m, system_fingerprint="fp_7"), chunk({"content": c}, model=m),
                  chunk({}, "stop", model=m, usage=billed))


def test_a_run_flags_substitutes_and_splices_and_every_export_leaves_them_out(tmp_path):
    import json
    import subprocess
    import sys

    import pyarrow.parquet as pq
    from casesrv import CaseServer, case_config, run_case
    from fixtures_tokens import kimi_dir

    names = [*SUBSTITUTES, "spliced"]
    with CaseServer(_respond) as srv:
        cfg = case_config(tmp_path, srv.base_url, [{"messages": [{"role": "user", "content": f"{q}: a colour?"}]}
                                                   for q in names], tokenizer=kimi_dir(), max_tokens=64)
        r = run_case(cfg)
    assert r.returncode == 0, r.stdout + r.stderr
    out = tmp_path / "tok"
    e = subprocess.run([sys.executable, "-m", "datagen", "export", str(tmp_path / "run"), "--format", "tokens",
                        "--out", str(out)], capture_output=True, text=True, timeout=120)
    assert e.returncode == 0, e.stdout + e.stderr
    rows = pq.read_table(out / "d.parquet").to_pylist()
    assert sorted(x["model"] for x in rows) == sorted([ASKED, "moonshotai/kimi-k2.5-20250127", "MoonshotAI/Kimi-K2.5"])
    assert {(x["temperature"], x["top_p"], x["system_fingerprint"]) for x in rows} == {(1.0, 0.95, "fp_7")}
    assert "left out: 5 invalid record(s) (model_mismatch 4, spliced_generation 1)" in e.stdout, e.stdout
    assert ("  model_mismatch: served anthropic/claude-3.5 1, moonshotai/kimi-k2-0905 1, moonshotai/kimi-k2-thinking 1, "
            "z-ai/glm-4.7 1 instead of the model asked for") in e.stdout
    st = json.loads(subprocess.run([sys.executable, "-m", "datagen", "status", str(tmp_path / "run"), "--json"],
                                   capture_output=True, text=True, timeout=60).stdout)
    assert {p["name"]: p["flags"] for p in st["providers"]} == {"Scripted": {"model_mismatch": 4,
                                                                             "spliced_generation": 1}}
