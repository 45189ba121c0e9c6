"""Several endpoints (`[provider] base_urls`): selection and health (pure), the retry rule for an
endpoint's faults, the config keys, and the fleet against real simulators on 127.0.0.1."""

from __future__ import annotations

import asyncio
import socket

import pytest
from helpers import make_config

from engine.client.endpoints import EndpointSet, EndpointState, HealthPolicy
from engine.client.retry import RetryPolicy, call_with_retries
from engine.client.types import ChatRequest, ErrorClass, RequestError
from engine.config import ConfigError


def _set(caps, **policy):
    return EndpointSet([(f"http://h{i}:8000/v1", c) for i, c in enumerate(caps)], HealthPolicy(**policy))


# ---- selection: least in flight, caps, ties ------------------------------------------------------

def test_pick_least_in_flight_with_caps_and_ties():
    s = _set([2, None, 1])
    a, b, c = s.endpoints
    order = []
    for _ in range(6):
        ep = s.pick()
        s.start(ep)
        order.append(ep.index)
    # ties go to the lowest index; a cap stops an endpoint (c after 1, a after 2); b has none
    assert order == [0, 1, 2, 0, 1, 1]
    assert (a.in_flight, b.in_flight, c.in_flight) == (2, 3, 1)
    s.finish(c)  # c has a free slot and the fewest in flight
    assert s.pick() is c
    s.finish(a)
    s.finish(a)  # a: 0 in flight, the fewest
    assert s.pick() is a


def test_pick_none_when_every_endpoint_is_at_its_cap():
    s = _set([1, 1])
    for _ in range(2):
        s.start(s.pick())
    assert s.pick() is None and s.any_healthy()  # full, not down: a request waits for a slot
    s.finish(s.endpoints[1])
    assert s.pick() is s.endpoints[1]


def test_pick_skips_draining_and_down_endpoints():
    s = _set([None, None, None])
    a, b, c = s.endpoints
    s.start(a)
    s.start(a)
    s.mark_down(b, 0.0, "connection refused")
    assert s.pick() is c
    for _ in range(5):
        s.on_error(c, 0.0, "server")
    assert c.state is EndpointState.DRAINING
    assert s.pick() is a  # the only one left, even with 2 in flight
    s.mark_down(a, 0.0, "gone")
    assert s.pick() is None and not s.any_healthy()


# ---- health -------------------------------------------------------------------------------------

def test_error_streak_drains_and_a_success_resets_it():
    s = _set([None], error_streak=3, probe_s=1.0)
    ep = s.endpoints[0]
    for cls in ("server", "timeout"):
        assert s.on_error(ep, 0.0, cls) is None
    s.on_success(ep, 0.0, 0.5, 10)  # the streak starts again
    assert s.on_error(ep, 1.0, "rate_limit") is None  # a 429 says nothing about health: counted only
    s.on_error(ep, 1.0, "server")
    s.on_error(ep, 1.0, "server")
    ch = s.on_error(ep, 2.0, "stall")
    assert ch is not None and (ch.old, ch.new) == (EndpointState.HEALTHY, EndpointState.DRAINING)
    assert ch.reason == "3 errors in a row (last: stall)"
    assert ep.errors == {"server": 3, "timeout": 1, "rate_limit": 1, "stall": 1}
    assert s.due(2.9) == [] and s.due(3.0) == [ep]  # probed after probe_s


def test_down_probe_backoff_doubles_to_the_cap_and_recovery():
    s = _set([None, None], probe_s=1.0, probe_max_s=4.0)
    ep = s.endpoints[0]
    ch = s.on_unreachable(ep, 10.0, "connect", "connection refused")
    assert ch.new is EndpointState.DOWN and ep.errors == {"connect": 1}
    assert s.next_due() == 11.0
    due_at = []
    now = 11.0
    for _ in range(4):  # every probe fails: 1, 2, 4, 4 (capped) seconds apart
        assert s.due(now) == [ep]
        assert s.on_probe(ep, now, False, "connection refused") is None
        due_at.append(ep.probe_at - now)
        now = ep.probe_at
    assert due_at == [2.0, 4.0, 4.0, 4.0]
    ch = s.on_probe(ep, now, True)
    assert ch.new is EndpointState.HEALTHY and ep.reason == "" and s.next_due() is None
    assert s.pick() is ep


def test_draining_endpoint_whose_probe_fails_goes_down():
    s = _set([None], error_streak=1)
    ep = s.endpoints[0]
    s.on_error(ep, 0.0, "server")
    ch = s.on_probe(ep, 1.0, False, "HTTP 503")
    assert (ch.old, ch.new, ep.reason) == (EndpointState.DRAINING, EndpointState.DOWN, "HTTP 503")


def test_backoff_resets_only_after_a_completed_request():
    s = _set([None], error_streak=1, probe_s=1.0)
    ep = s.endpoints[0]
    s.on_error(ep, 0.0, "server")  # drained: probe after 1 s
    assert ep.probe_at == 1.0
    s.on_probe(ep, 1.0, True)  # answers its probe ...
    s.on_error(ep, 1.0, "server")  # ... but fails again: drained for longer
    assert ep.probe_at == 3.0
    s.on_probe(ep, 3.0, True)
    s.on_success(ep, 3.5, 1.0, 100)
    s.on_error(ep, 4.0, "server")
    assert ep.probe_at == 5.0


def test_snapshot_figures():
    s = _set([4, None])
    a = s.endpoints[0]
    s.start(a)
    s.start(a)
    s.on_success(a, 10.0, 0.5, 300)
    s.finish(a)
    s.on_error(a, 11.0, "server")
    s.finish(a)
    snap_a, snap_b = s.snapshot(20.0, start=0.0)
    assert snap_a.url == "http://h0:8000/v1" and snap_a.state == "healthy" and snap_a.concurrency == 4
    assert (snap_a.requests, snap_a.in_flight, snap_a.errors, snap_a.error_rate) == (2, 0, {"server": 1}, 0.5)
    assert snap_a.latency_p50_s == 0.5 and snap_a.completion_tokens == 300
    assert snap_a.tok_per_s == pytest.approx(300 / 20.0)
    assert snap_b.requests == 0 and snap_b.latency_p50_s is None and snap_b.concurrency is None
    assert s.snapshot(100.0)[0].tok_per_s == 0.0  # the 60 s window has passed


def test_endpoint_set_refuses_bad_input():
    with pytest.raises(ValueError):
        EndpointSet([])
    with pytest.raises(ValueError):
        EndpointSet([("http://a/v1", None), ("http://a/v1", 2)])
    with pytest.raises(ValueError):
        EndpointSet([("http://a/v1", 0)])


# ---- retries: an endpoint's fault does not count against the prompt -----------------------------

async def test_endpoint_faults_are_retried_at_once_and_not_counted():
    errors = [RequestError(ErrorClass.CONNECT, "refused").at_endpoint("http://a/v1", True) for _ in range(4)]
    errors.insert(2, RequestError(ErrorClass.SERVER, "boom", status=502))
    seen, sleeps = [], []

    async def fn():
        if errors:
            raise errors.pop(0)
        return "ok"

    policy = RetryPolicy(max_attempts=2, base_s=1.0, endpoint_retries=4)
    out = await call_with_retries(fn, policy, lambda n, e, w: seen.append((n, e and e.error_class.value, w)),
                                  sleep=lambda s: sleeps.append(s) or asyncio.sleep(0))
    assert out == "ok"
    # 6 attempts with max_attempts 2: only the 502 counted; the endpoint faults waited 0 s
    assert [n for n, *_ in seen] == [1, 2, 3, 4, 5, 6]
    assert [w for *_, w in seen][:2] == [0.0, 0.0] and [w for *_, w in seen][3:5] == [0.0, 0.0]
    assert 0.0 <= seen[2][2] <= 1.0


async def test_endpoint_faults_past_the_allowance_count():
    async def fn():
        raise RequestError(ErrorClass.CONNECT, "refused").at_endpoint("http://a/v1", True)

    with pytest.raises(RequestError) as e:
        await call_with_retries(fn, RetryPolicy(max_attempts=2, endpoint_retries=3), sleep=lambda s: asyncio.sleep(0))
    assert e.value.attempts == 5  # 3 free + 2 counted
    assert str(e.value) == "connect: http://a/v1: refused" and e.value.endpoint == "http://a/v1"


# ---- config ---------------------------------------------------------------------------------------

def test_config_base_urls(tmp_path):
    cfg = make_config(tmp_path, provider={"kind": "openai", "endpoint_concurrency": 8, "base_urls": [
        "http://10.0.0.1:8000/v1/", {"url": "http://10.0.0.2:8000/v1", "concurrency": 2}]})
    assert cfg.provider.endpoints() == [("http://10.0.0.1:8000/v1", 8), ("http://10.0.0.2:8000/v1", 2)]
    assert cfg.provider.all_base_urls() == ["http://10.0.0.1:8000/v1", "http://10.0.0.2:8000/v1"]
    one = make_config(tmp_path, provider={"kind": "openai", "base_url": "http://10.0.0.1:8000/v1"})
    assert one.provider.endpoints() == [] and one.provider.all_base_urls() == ["http://10.0.0.1:8000/v1"]


@pytest.mark.parametrize("provider, expected", [
    ({"kind": "openai", "base_url": "http://a:1/v1", "base_urls": ["http://b:1/v1"]},
     "provider.base_urls: give either base_url (one server) or base_urls (several replicas), not both"),
    ({"kind": "openrouter", "base_urls": ["http://b:1/v1"]},
     "provider.base_urls: several endpoints need kind = \"openai\" (vLLM/SGLang replicas), not 'openrouter'"),
    ({"kind": "openai", "base_urls": ["http://b:1/v1", "http://b:1/v1/"]},
     "provider.base_urls: each endpoint once; repeated: http://b:1/v1"),
    ({"kind": "openai", "base_urls": ["http://b:1/v1", "b:2/v1"]},
     "provider.base_urls[1].url: expected an http(s) URL like https://openrouter.ai/api/v1, got 'b:2/v1'"),
    ({"kind": "openai", "base_urls": [{"url": "http://b:1/v1", "concurrency": 0}]},
     "provider.base_urls[0].concurrency: Input should be greater than or equal to 1 (got 0)"),
    ({"kind": "openai", "base_url": "http://a:1/v1", "endpoint_concurrency": 4},
     "provider: endpoint_concurrency: used only with several endpoints; set base_urls (or remove it)"),
])
def test_config_base_urls_errors(tmp_path, provider, expected):
    with pytest.raises(ConfigError) as e:
        make_config(tmp_path, provider=provider)
    assert str(e.value).splitlines()[1:] == [f"  {expected}"]


def test_plain_http_key_refused_for_any_remote_endpoint(tmp_path):
    from engine.run.apikey import resolve_api_key

    cfg = make_config(tmp_path, provider={"kind": "openai", "api_key_env": "EP_KEY", "base_urls": [
        "http://127.0.0.1:8000/v1", "http://10.1.2.3:8000/v1"]})
    with pytest.raises(ConfigError) as e:
        resolve_api_key(cfg.provider, {"EP_KEY": "k-123"})
    assert str(e.value) == ("provider.base_urls: refusing to send the API key over plain http to "
                            "http://10.1.2.3:8000/v1; use https")


# ---- the fleet against real simulators ----------------------------------------------------------

def _dead_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()  # nothing listens there: connection refused
    return port


async def test_fleet_spreads_requests_and_moves_off_a_refusing_endpoint():
    from engine.client.chat import ChatClient
    from engine.client.fleet import EndpointFleet
    from engine.sim import SimConfig, SimThread

    sims = [SimThread(SimConfig(seed=i, mean_completion_tokens=20, tokens_per_s=400, providers=(f"S{i}",)))
            for i in range(2)]
    urls = [s.start() for s in sims]
    dead = f"http://127.0.0.1:{_dead_port()}/api/v1"
    changes = []
    fleet = EndpointFleet([(urls[0], 3), (dead, None), (urls[1], 3)],
                          lambda u: ChatClient(u, "sim-key", connect_timeout_s=2, stall_timeout_s=10),
                          policy=HealthPolicy(probe_s=30.0), probe_timeout_s=2,
                          on_change=lambda level, msg: changes.append((level, msg)))
    try:
        probes = await fleet.start()
        assert [p.ok for _, p in probes] == [True, False, True]
        assert changes and changes[0][0] == "warning" and f"endpoint {dead} down" in changes[0][1]
        req = ChatRequest(messages=[{"role": "user", "content": "hi"}], max_tokens=64, body={"model": "m"})
        got = await asyncio.gather(*(fleet.complete(req) for _ in range(12)))
        snap = {e.url: e for e in fleet.snapshot()}
        # every request completed on a live endpoint, never more than 3 at once on either
        assert sorted({c.provider for c in got}) == ["S0", "S1"]
        assert snap[urls[0]].requests + snap[urls[1]].requests == 12 and snap[dead].requests == 0
        assert min(snap[urls[0]].requests, snap[urls[1]].requests) >= 3
        assert snap[dead].state == "down" and "ConnectError" in snap[dead].reason
        assert all(e.in_flight == 0 for e in snap.values())
        assert (await fleet.get_json("/models"))["data"]  # answered by a healthy endpoint
    finally:
        await fleet.aclose()
        for s in sims:
            s.stop()


async def test_fleet_drains_an_endpoint_after_a_5xx_streak_and_takes_it_back_after_a_probe():
    from engine.client.chat import ChatClient
    from engine.client.fleet import EndpointFleet
    from engine.sim import SimConfig, SimThread

    bad = SimThread(SimConfig(seed=1, mean_completion_tokens=10, faults={"503": 1.0}, providers=("Bad",)))
    good = SimThread(SimConfig(seed=2, mean_completion_tokens=10, providers=("Good",)))
    urls = [bad.start(), good.start()]
    changes = []
    fleet = EndpointFleet([(u, None) for u in urls], lambda u: ChatClient(u, "sim-key", connect_timeout_s=2),
                          policy=HealthPolicy(error_streak=2, probe_s=0.3), probe_timeout_s=2,
                          on_change=lambda level, msg: changes.append(msg))
    req = ChatRequest(messages=[{"role": "user", "content": "hi"}], max_tokens=32, body={"model": "m"})
    try:
        await fleet.start()
        outcomes = []
        for _ in range(5):  # one at a time: ties go to the first endpoint while it is healthy
            try:
                outcomes.append((await fleet.complete(req)).provider)
            except RequestError as e:
                assert e.message.startswith(urls[0] + ": ") and not e.endpoint_fault  # the request's error, counted
                outcomes.append(e.error_class.value)
        assert outcomes == ["server", "server", "Good", "Good", "Good"]
        first = {e.url: e for e in fleet.snapshot()}[urls[0]]
        assert (first.state, first.errors, first.reason) == ("draining", {"server": 2},
                                                              "2 errors in a row (last: server)")
        await asyncio.sleep(0.6)  # its probe (GET /models answers) puts it back into rotation
        assert fleet.snapshot()[0].state == "healthy"
        assert changes[0].startswith(f"endpoint {urls[0]} draining: 2 errors in a row") and \
            changes[1] == f"endpoint {urls[0]} healthy again (health probe answered); it takes new requests"
        with pytest.raises(RequestError):
            await fleet.complete(req)
        with pytest.raises(RequestError):
            await fleet.complete(req)
        again = fleet.snapshot()[0]
        assert again.state == "draining" and again.errors == {"server": 4}
        ep = fleet.set.endpoints[0]
        assert ep.probe_at - fleet.clock() > 0.3  # drained again before any success: a longer wait
    finally:
        await fleet.aclose()
        bad.stop()
        good.stop()


async def test_fleet_with_every_endpoint_down_raises_connect():
    from engine.client.chat import ChatClient
    from engine.client.fleet import EndpointFleet

    dead = [f"http://127.0.0.1:{_dead_port()}/v1" for _ in range(2)]
    fleet = EndpointFleet([(u, None) for u in dead], lambda u: ChatClient(u, None, connect_timeout_s=2),
                          policy=HealthPolicy(probe_s=30.0), probe_timeout_s=2)
    try:
        await fleet.start()
        req = ChatRequest(messages=[{"role": "user", "content": "hi"}], max_tokens=8)
        with pytest.raises(RequestError) as e:
            await fleet.complete(req)
        assert e.value.error_class is ErrorClass.CONNECT and not e.value.endpoint_fault
        assert e.value.message.startswith("no healthy endpoint: " + dead[0] + " down (")
    finally:
        await fleet.aclose()


# ---- the dashboard's providers pane -------------------------------------------------------------

async def test_providers_pane_shows_each_endpoint():
    import dataclasses

    from engine.client.endpoints import EndpointSnapshot
    from tui.app import DashboardApp
    from tui.testing import FIXED_GPUS, FakeController, fixed_snapshot, screen_text

    def ep(port, state, reason, infl, cap, req, errors, p50, tps):
        n = sum(errors.values())
        return EndpointSnapshot(f"http://10.0.0.{port}:8000/v1", state, reason, infl, cap, req, errors,
                                n / req if req else 0.0, p50, p50, tps, 0, 1.0)

    snap = dataclasses.replace(fixed_snapshot(), endpoints=(
        ep(1, "healthy", "", 7, 8, 1234, {}, 2.5, 812.0),
        ep(2, "down", "connection refused", 0, 8, 310, {"connect": 1, "disconnect": 6}, 2.4, 0.0),
        ep(3, "draining", "5 errors in a row (last: server)", 3, None, 905, {"server": 5}, 3.1, 240.0)))
    app = DashboardApp(snapshot_source=lambda: snap, controller=FakeController(), gpu_source=lambda: FIXED_GPUS)
    async with app.run_test(size=(160, 48)) as pilot:
        await pilot.pause(0.3)
        text = screen_text(app)
    rows = [" ".join(line.split()) for line in text.splitlines()]
    assert any("endpoint state infl req err p50 tok/s" in r for r in rows)
    assert any("10.0.0.1:8000 healthy 7/8 1,234 0.0% 2.5s 812" in r for r in rows)
    assert any("10.0.0.2:8000 down 0/8 310 2.3% 2.4s 0" in r for r in rows)
    assert any("10.0.0.3:8000 draining 3 905 0.6% 3.1s 240" in r for r in rows)


async def test_credentials_in_an_endpoint_url_are_never_shown():
    from engine.client.chat import ChatClient
    from engine.client.fleet import EndpointFleet, shown_url

    assert shown_url("http://user:s3cret@10.0.0.1:8000/v1") == "http://***@10.0.0.1:8000/v1"
    assert shown_url("https://10.0.0.1/v1") == "https://10.0.0.1/v1"
    fleet = EndpointFleet([("https://u:s3cret@10.0.0.1/v1", None)], lambda u: ChatClient(u, None))
    assert [e.url for e in fleet.snapshot()] == ["https://***@10.0.0.1/v1"]
    assert "s3cret" not in repr(fleet)
    await fleet.aclose()


# ---- credits: every replica's /key, summed ----------------------------------------------------------

async def test_credits_and_drift_are_summed_over_every_endpoint(tmp_path, monkeypatch, caplog):
    """Three simulators, $5 of credits each: the run reads every replica's ``/key`` and sums them, so
    the drift (provider usage minus accounted spend) is 0, not minus the two replicas never read."""
    import io
    import logging

    from e2e import write_prompts

    from engine.report.status import collect_status
    from engine.run.headless import run_headless
    from engine.sim import SimConfig, SimThread

    sims = [SimThread(SimConfig(seed=i, mean_completion_tokens=30, credits_usd=5.0, providers=(f"S{i}",)))
            for i in range(3)]
    urls = [s.start() for s in sims]
    monkeypatch.setenv("FLEET_KEY", "sim-key")
    cfg = make_config(tmp_path, provider={"kind": "openai", "api_key_env": "FLEET_KEY", "base_urls": urls,
                                          "endpoint_concurrency": 2},
                      datasets=[{"name": "a", "path": str(write_prompts(tmp_path / "p.jsonl", 30)), "format": "text"}])
    jobs = []
    try:
        with caplog.at_level(logging.INFO, logger="engine"):
            rc = await run_headless(cfg, io.StringIO(), install_signals=False, on_ready=jobs.append, metrics=False)
    finally:
        for s in sims:
            s.stop()
    assert rc == 0
    billed = [s.ledger.billed_usd for s in sims]
    assert all(b > 0 for b in billed)  # every replica served (and billed) some
    spend = jobs[0].scheduler.spend
    cr = spend.credits
    assert (cr.endpoints, cr.missing, cr.partial) == (3, (), False)
    assert cr.usage_usd == pytest.approx(sum(billed), abs=1e-9)
    assert cr.remaining_usd == pytest.approx(15.0 - sum(billed), abs=1e-9)
    assert spend.drift_usd() == pytest.approx(0.0, abs=1e-6)
    assert any(m.startswith("spend reconciliation: provider usage minus accounted spend = $")
               and abs(float(m.rsplit("$", 1)[1])) < 1e-6 for m in caplog.messages), caplog.messages[-5:]
    doc = collect_status(cfg.run.dir)
    assert doc["credits_usd"] == pytest.approx(15.0 - sum(billed), abs=1e-9)
    assert doc["credits_drift_usd"] == pytest.approx(0.0, abs=1e-6)
    assert doc["credits_endpoints"] == {"read": 3, "of": 3, "missing": []}


async def test_credits_partial_when_an_endpoint_does_not_answer(tmp_path):
    """A replica that refuses connections, and one that accepts them but never answers: the reading
    is partial (the others' credits, no usage), so no drift is computed from it; the status says so."""
    import socket as socket_

    from engine.client.chat import ChatClient
    from engine.client.fleet import EndpointFleet
    from engine.money.credits import read_credits_each
    from engine.money.spend import CreditsReading
    from engine.report.status import format_status
    from engine.sim import SimConfig, SimThread

    sim = SimThread(SimConfig(seed=1, mean_completion_tokens=10, credits_usd=5.0, providers=("S",)))
    url = sim.start()
    dead = f"http://127.0.0.1:{_dead_port()}/v1"
    mute = socket_.socket()
    mute.bind(("127.0.0.1", 0))
    mute.listen(8)  # the kernel accepts connections; nothing ever answers
    silent = f"http://127.0.0.1:{mute.getsockname()[1]}/v1"
    fleet = EndpointFleet([(url, None), (dead, None), (silent, None)],
                          lambda u: ChatClient(u, "sim-key", connect_timeout_s=2, stall_timeout_s=30),
                          policy=HealthPolicy(probe_s=30.0), probe_timeout_s=0.5)
    try:
        req = ChatRequest(messages=[{"role": "user", "content": "hi"}], max_tokens=32, body={"model": "m"})
        await fleet.complete(req)
        t0 = asyncio.get_running_loop().time()
        cr = await read_credits_each(fleet.getters())
        assert asyncio.get_running_loop().time() - t0 < 3  # the silent one costs the probe timeout, no more
    finally:
        await fleet.aclose()
        sim.stop()
        mute.close()
    billed = sim.ledger.billed_usd
    assert billed > 0
    assert (cr.endpoints, cr.missing, cr.partial, cr.usage_usd) == (3, (dead, silent), True, None)
    assert cr.remaining_usd == pytest.approx(5.0 - billed, abs=1e-9)
    # no drift from a partial reading, even after a full one fixed the baseline
    from engine.money.spend import SpendControl
    spend = SpendControl(make_config(tmp_path))
    spend.on_credits(CreditsReading(15.0, 0.0, "key", 0.0, endpoints=3))
    assert spend.drift_usd() == 0.0
    spend.on_credits(cr)
    assert spend.drift_usd() is None
    # every endpoint silent about credits (a plain vLLM): nothing to track
    assert await read_credits_each([("u", _no_credits), ("v", _no_credits)]) is None
    doc = {"run": {"name": "r", "state": "running", "state_reason": "", "elapsed_s": 1.0, "alive": True},
           "totals": {"cost_usd": 0.0, "errors": {}, "usage_sources": {}, "prompts": 0, "done": 0, "failed": 0, "skipped": 0,
                      "pending": 0, "in_flight": 0, "rejected": 0, "completion_tokens": 0},
           "datasets": [], "credits_usd": 9.5,
           "credits_endpoints": {"read": 1, "of": 3, "missing": [dead, silent]}}
    assert "credits $9.50 (partial: 1 of 3 endpoints)" in format_status(doc)


async def _no_credits(path, params=None):
    raise RequestError(ErrorClass.OTHER, f"GET {path}: 404", status=404)
