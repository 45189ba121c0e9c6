"""A provider that reports absurd usage, through the real command line (issue 34).

Field case: a provider reporting ``prompt_tokens`` 10^12 and a negative cost became ``run completed;
$1600000.0000 spent``, in ``status`` and in the caps. Now such figures are not believed: the results
are kept (the text is fine), accounted at our estimate priced from the price list (``usage_source``
``implausible``, the provider's figures in ``results.usage_claimed``), one warning per provider says
why, and a dollar cap is not tripped.
"""

from __future__ import annotations

import json
import sqlite3

from casesrv import CaseServer, case_config, chunk, prompts, run_case, states, status, stream, usage

N = 8
ANSWER = "Octopuses have three hearts and blue blood."


def absurd(req: dict, n: int):
    """Even prompts: 10^12 prompt tokens and $1.6M; odd ones: a negative cost (both from one provider)."""
    i = int(req["messages"][-1]["content"].split()[-1].rstrip("."))
    u = usage(10**12, 12, cost=1_600_000.0) if i % 2 == 0 else usage(15, 12, cost=-5.0)
    return stream(chunk({"role": "assistant", "content": ANSWER}), chunk({}, "stop", usage=u))


def test_absurd_usage_is_not_believed_and_the_cap_holds(tmp_path):
    with CaseServer(absurd) as srv:
        cfg = case_config(tmp_path, srv.base_url, prompts(N), max_tokens=256, dataset_extra="max_cost_usd = 1.0",
                          concurrency=1)  # prompt 0 (the $1.6M one) is the first the once-per-provider warning names
        r = run_case(cfg, "--exit-on-pause", timeout=90)
    out = r.stdout + r.stderr
    assert r.returncode == 0, out
    run_dir = tmp_path / "run"
    assert states(run_dir) == {"done": N}  # every completion kept
    doc = status(run_dir)
    t = doc["totals"]
    assert t["usage_sources"]["implausible"] == N and t["usage_sources"]["reported"] == 0
    # our estimate at the price list ($0.6/$2.5 per M): a prompt of ~11 tokens, 12 completion tokens each
    plausible_total = N * (0.6e-6 * 4096 + 2.5e-6 * 256)  # even the bounds' worst case stays cents
    assert 0 < t["cost_usd"] < plausible_total < 0.05, t["cost_usd"]
    assert "cap" not in (doc["datasets"][0].get("limit_reason") or "")
    assert "$1600000" not in out  # before: `run completed; $1600000.0000 spent`
    assert "cost $1,600,000.0000 > 10 x the price list's" in out  # the warning names the figure it did not believe
    with sqlite3.connect(run_dir / "store.sqlite") as c:
        rows = c.execute("SELECT prompt_tokens, completion_tokens, cost_usd, usage_source, usage_claimed, content "
                         "FROM results ORDER BY prompt_id").fetchall()
        events = c.execute("SELECT level, message FROM events WHERE kind = 'implausible_usage'").fetchall()
    for i, (pt, ct, cost, src, claimed, content) in enumerate(rows):
        assert src == "implausible" and content == ANSWER
        assert pt < 100 and ct == 12 and 0 < cost < 1e-4  # 43 chars / 4 + end of turn; priced
        raw = json.loads(claimed)
        if i % 2 == 0:
            assert (raw["prompt_tokens"], raw["cost"]) == (10**12, 1_600_000.0)
        else:
            assert raw["cost"] == -5.0  # the figure as sent, for the audit
    assert len(events) == 1, events  # once per provider
    level, msg = events[0]
    assert level == "warning" and msg.startswith("provider Scripted reported an implausible usage (")
