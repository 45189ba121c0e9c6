"""Reconstruction throughput on one core vs a bare tiktoken encode of the same text.

    .venv/bin/python -m bench.bench_reconstruct [--records 300] [--mean-completion 1500] [--repeat 3]

Builds the Kimi-layout fixture tokenizer (tests/fixtures_tokens.py: mistral-common's Tekken
vocabulary, Kimi's split regex and special-token layout, a Kimi-layout chat template), makes
``--records`` records from the ShareGPT sample prompts (multi-turn, real text) with simulator
completions (reasoning + content, some tool calls), pins the process to one core and times, best of
``--repeat``:

- bare: ``tiktoken.Encoding.encode_ordinary`` of the concatenated text of every record (prompt
  message contents + reasoning + content + tool-call arguments), tokens per second;
- reconstruction: :func:`engine.tokens.service.process` per record (render the prompt with the
  chat template, encode it, rebuild the completion (method A), round-trip every piece, render and
  encode the full conversation (method B), run the checks, pack the row), tokens per second of the
  rebuilt ids (prompt + completion).

Prints both rates and their ratio (reconstruction / bare); the last line is ``RESULT {json}``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))


def _records(n: int, mean: int, tok_dir: Path) -> list:
    from engine.datasets import iter_prompts
    from engine.prompts import Prompt
    from engine.sim.generator import TokenCounter, make_plan
    from engine.tokens.reconstruct import Record

    prompts = [p for p in iter_prompts(REPO / "engine" / "samples" / "b7_sharegpt.json", "sharegpt") if isinstance(p, Prompt)]
    tools = [{"type": "function", "function": {"name": "get_weather", "description": "Weather of a city", "parameters": {
        "type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}}}}}]
    counter = TokenCounter(str(tok_dir))
    out = []
    for i in range(n):
        p = prompts[i % len(prompts)]
        t = tools if i % 5 == 0 else []
        plan = make_plan(seed=i, key=f"{p.key}:{i}", messages=p.messages, tools=t, max_tokens=10 * mean,
                         mean_completion_tokens=mean, reasoning_fraction=0.6, counter=counter)
        calls = [plan.tool_call.to_openai()] if plan.tool_call else []
        out.append(Record(prompt_id=i, dataset="b7", key=p.key, messages=p.messages, tools=t, reasoning=plan.reasoning,
                          content=plan.content, tool_calls=calls, finish_reason=plan.finish_reason,
                          prompt_tokens=plan.prompt_tokens, completion_tokens=plan.completion_tokens,
                          reasoning_tokens=plan.reasoning_tokens))
    return out


def _text(r) -> str:
    parts = [m["content"] for m in r.messages if isinstance(m.get("content"), str)]
    parts += [r.reasoning, r.content] + [c["function"]["arguments"] for c in r.tool_calls]
    return "".join(parts)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--records", type=int, default=300)
    ap.add_argument("--mean-completion", type=int, default=1500)
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args(argv)
    cpu = sorted(os.sched_getaffinity(0))[-1]
    os.sched_setaffinity(0, {cpu})
    os.environ.setdefault("RAYON_NUM_THREADS", "1")

    from fixtures_tokens import kimi_dir

    from engine.config import TokenizerSection
    from engine.tokens.service import process
    from engine.tokens.tokenizer import load_tokenizer

    tok = load_tokenizer(TokenizerSection(path=str(kimi_dir())))
    records = _records(args.records, args.mean_completion, kimi_dir())
    texts = [_text(r) for r in records]
    enc = tok.backend.enc
    process(tok, records[0])  # warm caches (template compile, traits)

    bare_s = recon_s = float("inf")
    bare_tok = recon_tok = 0
    for _ in range(args.repeat):
        t0 = time.perf_counter()
        bare_tok = sum(len(enc.encode_ordinary(t)) for t in texts)
        bare_s = min(bare_s, time.perf_counter() - t0)
        t0 = time.perf_counter()
        rows = [process(tok, r) for r in records]
        recon_s = min(recon_s, time.perf_counter() - t0)
        recon_tok = sum(row[8] + row[9] for row in rows)
    bad = sum(1 for row in rows if not row[5])
    res = {
        "records": len(records), "cpu": cpu, "invalid": bad,
        "bare_tokens": bare_tok, "bare_s": round(bare_s, 4), "bare_tok_per_s": round(bare_tok / bare_s),
        "recon_tokens": recon_tok, "recon_s": round(recon_s, 4), "recon_tok_per_s": round(recon_tok / recon_s),
        "records_per_s": round(len(records) / recon_s, 1),
    }
    res["ratio"] = round(res["recon_tok_per_s"] / res["bare_tok_per_s"], 3)
    print(f"{len(records)} records, {recon_tok:,} rebuilt tokens ({bad} invalid), one core (cpu {cpu}), best of {args.repeat}")
    print(f"bare tiktoken encode_ordinary: {res['bare_tok_per_s']:>12,} tokens/s")
    print(f"reconstruction + checks:       {res['recon_tok_per_s']:>12,} tokens/s ({res['records_per_s']} records/s)")
    print(f"ratio reconstruction / bare:   {res['ratio']:.3f}")
    print("RESULT " + json.dumps(res))
    return 0


if __name__ == "__main__":
    sys.exit(main())
