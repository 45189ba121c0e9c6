"""The model-backed simulator (engine.sim.backend) on the rehearsal kit (engine.sim.rehearsal): exact round trip
through the run's reconstruction and validation, honest draws from the target's sampling distribution, the
temperature drift, the quantized copy's KL, the mix share."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import httpx
import pytest

torch = pytest.importorskip("torch")

from engine.fidelity.dist import sampling_distribution  # noqa: E402
from engine.sim import SimConfig, SimServer  # noqa: E402
from engine.sim.backend import BackendError, ModelBackend  # noqa: E402
from engine.sim.behaviours import parse_behaviours  # noqa: E402
from engine.sim.quant import mean_kl  # noqa: E402
from engine.sim.rehearsal import build_kit  # noqa: E402
from engine.sim.wordtok import VOCAB_SIZE, WORD_BASE, WORDS, ids_to_text  # noqa: E402
from engine.tokens.reconstruct import Record, prompt_ids, reconstruct  # noqa: E402
from engine.tokens.startup import startup_check  # noqa: E402
from engine.tokens.tokenizer import load_tokenizer  # noqa: E402
from engine.tokens.validate import check  # noqa: E402

AUTH = {"Authorization": "Bearer sk-or-test"}
BEHAVIOURS = "SimA=honest,SimB=honest,SimQ=quant:0.03,SimT=temp:1.4,SimM=mix:0.3"
MESSAGES = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Explain the gradient update step."}]


@pytest.fixture(scope="module")
def kit(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("kit")
    build_kit(d, seed=0)
    return d


@pytest.fixture(scope="module")
def backend(kit: Path) -> Any:
    tok = load_tokenizer(str(kit / "tokenizer"))
    b = ModelBackend.load(str(kit / "target"), tok, parse_behaviours(BEHAVIOURS), seed=5, threads=1)
    yield b
    b.close()


def test_kit_is_peaked_and_passes_the_runs_start_up_check(kit: Path) -> None:
    info = json.loads((kit / "kit.json").read_text())
    assert info["vocab_size"] == VOCAB_SIZE == 768
    assert abs(info["entropy"] - 2.0) < 0.05  # nats at temperature 1 (uniform would be log 768 = 6.64)
    assert abs(info["end_rate"] - 0.025) < 0.003
    cfg = json.loads((kit / "target" / "config.json").read_text())
    assert cfg["vocab_size"] == 768 and cfg["model_type"] == "deepseek_v3"
    tok = load_tokenizer(str(kit / "tokenizer"))
    assert tok.vocab_size == 768 and not tok.unresolved
    startup_check(tok)  # the run refuses to start otherwise (its sample texts need the byte fallback)
    words = list(range(WORD_BASE, WORD_BASE + len(WORDS)))
    for ids in (words[:50], words[::-7], [words[3]] * 5):
        text = ids_to_text(ids)
        assert tok.encode(text) == ids and tok.decode(ids) == text and text.startswith(" ")
    for text in ("2 + 2 = 4. 二加二等于四。", '{"city":"Rome"}\n\n  x', " theof"):
        assert tok.decode(tok.encode(text)) == text


def record_of(resp: dict[str, Any], messages: list[dict[str, Any]]) -> Record:
    ch = resp["choices"][0]
    m = ch["message"]
    u = resp["usage"]
    return Record(prompt_id=0, dataset="d", key="k", messages=messages, tools=[], reasoning=m.get("reasoning") or "",
                  content=m.get("content") or "", tool_calls=[], finish_reason=ch["finish_reason"],
                  provider=resp["provider"], prompt_tokens=u["prompt_tokens"], completion_tokens=u["completion_tokens"],
                  reasoning_tokens=u["completion_tokens_details"]["reasoning_tokens"])


def stream_record(events: list[dict[str, Any]], messages: list[dict[str, Any]]) -> Record:
    reasoning = content = ""
    finish, usage, provider = "", None, ""
    for ev in events:
        provider = ev.get("provider", provider)
        usage = ev.get("usage") or usage
        for ch in ev.get("choices", []):
            d = ch.get("delta") or {}
            reasoning += d.get("reasoning") or ""
            content += d.get("content") or ""
            finish = ch.get("finish_reason") or finish
    assert usage is not None
    return Record(prompt_id=0, dataset="d", key="k", messages=messages, tools=[], reasoning=reasoning, content=content,
                  tool_calls=[], finish_reason=finish, provider=provider, prompt_tokens=usage["prompt_tokens"],
                  completion_tokens=usage["completion_tokens"],
                  reasoning_tokens=usage["completion_tokens_details"]["reasoning_tokens"])


async def test_served_text_round_trips_through_reconstruction_and_validation(kit: Path, tmp_path: Path) -> None:
    """Every provider's records, streamed or not, validate: billing_diff 0 and prompt_diff 0; the log says what
    served each."""
    cfg = SimConfig(target=str(kit / "target"), tokenizer=str(kit / "tokenizer"), seed=2, model_threads=2,
                    log_path=str(tmp_path / "sim.log"),
                    providers=("SimA", "SimB", "SimQ", "SimT", "SimM"),  # one quantized copy to tune: the mix drifts by temp
                    behaviours={"SimA": "honest", "SimQ": "quant:0.03", "SimT": "temp:1.4", "SimM": "mix:0.3/temp:1.4"})
    server = SimServer(cfg)
    await server.start()
    tok = load_tokenizer(str(kit / "tokenizer"))
    records: list[Record] = []
    try:
        async with httpx.AsyncClient(base_url=server.base_url, headers=AUTH, timeout=120) as c:
            async def plain(i: int) -> Record:
                body = {"model": "moonshotai/kimi-k2.5", "messages": MESSAGES, "max_tokens": 200,
                        "temperature": 0.9, "top_p": 0.95, "provider": {"order": [cfg.providers[i % 5]]}}
                r = await c.post("/chat/completions", json=body)
                assert r.status_code == 200, r.text
                return record_of(r.json(), MESSAGES)

            async def streamed(i: int) -> Record:
                body = {"model": "moonshotai/kimi-k2.5", "messages": MESSAGES, "max_tokens": 200, "stream": True,
                        "provider": {"order": [cfg.providers[i % 5]]}}
                events = []
                async with c.stream("POST", "/chat/completions", json=body) as r:
                    async for line in r.aiter_lines():
                        if line.startswith("data: {"):
                            events.append(json.loads(line[6:]))
                return stream_record(events, MESSAGES)

            records = list(await asyncio.gather(*[plain(i) for i in range(5)], *[streamed(i) for i in range(5)]))
            bad = await c.post("/chat/completions", json={"model": "m", "messages": MESSAGES, "top_p": 0})
            assert bad.status_code == 400 and "top_p" in bad.text
    finally:
        await server.stop()
    assert {r.provider for r in records} == set(cfg.providers)
    stops = 0
    for rec in records:
        v = check(reconstruct(tok, rec), rec, thinking=True, ids=tok.ids)
        assert v.prompt_diff == 0
        if rec.finish_reason == "stop":
            stops += 1
            assert v.billing_diff == 0, (rec, v)
            assert v.ok or v.reasons == ["empty"], v.reasons  # an answer may end at its first token
        else:
            assert v.reasons == ["truncated"]
    assert stops >= 7  # end tokens end reasoning and answer after ~40 tokens each: few reach 200
    served: dict[str, set[str]] = {}
    for line in (tmp_path / "sim.log").read_text().splitlines():
        rec = json.loads(line)
        if rec["outcome"] == "completed":
            served.setdefault(rec["provider"], set()).add(rec["served"])
    assert served["SimA"] == served["SimB"] == {"honest"}
    assert served["SimQ"] == {"quant:0.03"} and served["SimT"] == {"temp:1.4"}
    assert served["SimM"] <= {"honest", "temp:1.4"}


def test_rebuilt_ids_are_the_sampled_ids(backend: Any) -> None:
    """Method A of the run's reconstruction gives back exactly the ids the model was fed (stop records), and the
    same minus a trailing </think> for a cut one."""
    tok = backend.tok
    seen = set()
    for seq in range(12):
        plan = backend.plan(provider="SimA", seq=seq, messages=MESSAGES, tools=None, max_tokens=60 if seq % 3 else 8,
                            temperature=1.0, top_p=None)
        rec = Record(prompt_id=0, dataset="d", key="k", messages=MESSAGES, tools=[], reasoning=plan.reasoning,
                     content=plan.content, tool_calls=[], finish_reason=plan.finish_reason,
                     completion_tokens=plan.completion_tokens, prompt_tokens=plan.prompt_tokens)
        rc = reconstruct(tok, rec)
        fed = plan.extra["token_ids"]
        seen.add(plan.finish_reason)
        assert rc.prompt_ids == prompt_ids(tok, MESSAGES, None)[1]
        assert len(fed) == plan.completion_tokens
        if plan.finish_reason == "stop":
            assert rc.completion_ids == fed and fed[-1] == tok.ids["end_of_turn"]
            assert fed.count(tok.ids["think_end"]) == 1
        else:
            assert plan.completion_tokens == (60 if seq % 3 else 8)
            want = fed[:-1] if fed[-1] == tok.ids["think_end"] else fed
            assert rc.completion_ids == want
    assert seen == {"stop", "length"}


def first_tokens(backend: Any, provider: str, n: int, temperature: float, top_p: float) -> list[int]:
    return [backend.plan(provider=provider, seq=s, messages=MESSAGES, tools=None, max_tokens=1,
                         temperature=temperature, top_p=top_p).extra["token_ids"][0] for s in range(n)]


def chi2(counts: dict[int, int], probs: Any, ends: frozenset[int], think_end: int) -> tuple[float, int, float]:
    """(statistic, degrees of freedom, mass of draws outside the expected support) with every end token merged into
    one cell (a sampled end token shows as </think>) and cells expected below 5 merged."""
    n = sum(counts.values())
    p = probs.tolist()
    exp: dict[int, float] = {}
    for i, q in enumerate(p):
        key = think_end if i in ends else i
        exp[key] = exp.get(key, 0.0) + q
    outside = sum(c for k, c in counts.items() if exp.get(k, 0.0) == 0.0) / n
    cells: list[tuple[float, int]] = []
    rest_e, rest_o = 0.0, 0
    for k, q in exp.items():
        if q * n >= 5:
            cells.append((q * n, counts.get(k, 0)))
        else:
            rest_e += q * n
            rest_o += counts.get(k, 0)
    if rest_e > 0:
        cells.append((max(rest_e, 1e-9), rest_o))
    stat = sum((o - e) ** 2 / e for e, o in cells)
    return stat, len(cells) - 1, outside


def chi2_q999(dof: int) -> float:
    """The 0.999 quantile of chi-square with ``dof`` degrees of freedom (Wilson-Hilferty; z = 3.0902)."""
    k = float(dof)
    return k * (1 - 2 / (9 * k) + 3.0902 * (2 / (9 * k)) ** 0.5) ** 3


def test_honest_draws_follow_the_sampling_distribution_and_temp_drift_does_not(backend: Any) -> None:
    """First completion token over 300 seeded requests at temperature 0.8, top_p 0.9: the honest provider's
    frequencies fit sampling_distribution(target logits, 0.8, 0.9) (chi-square below its 0.999 quantile), the
    temp:1.4 provider's fit the distribution at 1.12 and are rejected against the honest one."""
    tok = backend.tok
    prompt = prompt_ids(tok, MESSAGES, None)[1]
    with torch.inference_mode():
        logits = backend.target(input_ids=torch.tensor([prompt])).logits[0, -1]
    honest_p = sampling_distribution(logits, 0.8, 0.9)
    drift_p = sampling_distribution(logits, 0.8 * 1.4, 0.9)
    te = tok.ids["think_end"]
    n = 300

    def counts(ids: list[int]) -> dict[int, int]:
        out: dict[int, int] = {}
        for i in ids:
            out[i] = out.get(i, 0) + 1
        return out

    honest = counts(first_tokens(backend, "SimA", n, 0.8, 0.9))
    stat, dof, outside = chi2(honest, honest_p, backend.end_ids, te)
    assert outside == 0.0  # nothing outside the nucleus
    assert dof >= 3 and stat < chi2_q999(dof), (stat, dof)
    drift = counts(first_tokens(backend, "SimT", n, 0.8, 0.9))
    stat_t, dof_t, _ = chi2(drift, drift_p, backend.end_ids, te)
    assert stat_t < chi2_q999(dof_t), (stat_t, dof_t)
    stat_h, dof_h, outside_h = chi2(drift, honest_p, backend.end_ids, te)
    assert outside_h > 0 or stat_h > chi2_q999(dof_h), (stat_h, dof_h)


def test_quantized_copy_is_in_its_kl_band(backend: Any) -> None:
    """quant:0.03 is tuned to 0.0285..0.0315 nats on the tuning contexts and stays about 0.03 on fresh ones (other
    prompts, other draws); the mix's copy (quant:0.1 by default) drifts more; the honest target not at all."""
    q = backend.quants[0.03]
    assert abs(q.kl - 0.03) <= 0.0015 and q.eps > 0
    assert abs(backend.quants[0.1].kl - 0.1) <= 0.005
    fresh = backend.contexts(per_prompt=8, length=48, seed=99, prompts=[
        "Write a haiku about autumn leaves.", "List three sorting algorithms.", "the value of a gradient update is"])
    assert 0.02 < mean_kl(backend.target, q.model, fresh) < 0.045
    assert 0.07 < mean_kl(backend.target, backend.quants[0.1].model, fresh) < 0.14
    assert mean_kl(backend.target, backend.target, fresh) == 0.0
    assert any(line.startswith("quant:0.03: ") and f"measured KL {q.kl:.4f} nats" in line for line in backend.describe())


def test_mix_serves_its_share_drifted() -> None:
    from engine.sim.behaviours import parse_behaviour, serve

    b = parse_behaviour("mix:0.3")
    labels = [serve(b, 7, s).label for s in range(2000)]
    share = labels.count("quant:0.1") / 2000
    assert abs(share - 0.3) < 0.035  # ~3.4 binomial standard deviations
    assert set(labels) == {"quant:0.1", "honest"}
    assert {serve(parse_behaviour("mix:0.5/temp:1.4"), 7, s).temp_factor for s in range(50)} == {1.0, 1.4}


def test_backend_refuses_a_tokenizer_that_does_not_round_trip(kit: Path, tmp_path: Path) -> None:
    """The demo (Tekken BPE) tokenizer: its ids do not match the target's vocabulary."""
    from engine.tokens.demo_tokenizer import write_kimi_dir
    from engine.tokens.hfimport import transformers_module

    pytest.importorskip("tiktoken")
    try:
        write_kimi_dir(tmp_path / "demo")
    except Exception as e:  # mistral-common missing
        pytest.skip(str(e))
    model = transformers_module().AutoModelForCausalLM.from_pretrained(str(kit / "target"))
    with pytest.raises(BackendError, match="vocabulary"):
        ModelBackend(model, load_tokenizer(str(tmp_path / "demo")), {})
