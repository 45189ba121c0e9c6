"""Judging a run's providers: phase-two scores and cheap signals to verdicts, and what a drift does.

:func:`judge_run` is synchronous (a thread of the live run, or ``datagen extract`` at its end): it reads
the scores phase two stored (:mod:`engine.storage.fidelity`) and the cheap signals of the stored
results (:mod:`engine.storage.cheapsignals`), judges every provider whose look is due
(:func:`engine.fidelity.looks.look_due`), saves the verdicts (:mod:`engine.storage.verdicts`) and
returns the drifts to act on (each once). :func:`write_evidence` writes a drift's evidence file,
``RUN_DIR/fidelity/<provider>-<source>.json``: the verdict with its tests and figures, the records it
judged, and the endpoint snapshot the run keeps. :class:`FidelityWatch` runs it in a live run every
:data:`WATCH_S` and acts: ``exclude`` stops buying from the provider (as the dashboard's ``x``),
``flag`` only flags its records ``provider_drift``; either way one event line says why.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import re
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Awaitable, Callable

from engine.config.fidelity import FidelitySection
from engine.fidelity.endpoints import parse_endpoints, quantization_by_provider
from engine.fidelity.looks import drift_action, look_due
from engine.fidelity.verdict import FidelitySettings, judge_providers
from engine.storage import verdicts
from engine.storage.atomic import write_lines
from engine.storage.endpoints import latest_snapshot, save_snapshot
from engine.storage.handle import Handle, connect_rw

log = logging.getLogger(__name__)

#: Seconds between two looks of a live run at the verdicts (each look is cheap: sums over stored rows).
WATCH_S = 10.0
#: Seconds between two reads of OpenRouter's endpoints listing of the model (declared precisions).
ENDPOINTS_S = 300.0


@dataclass(frozen=True)
class Drift:
    """A provider newly judged ``drifting`` from one source, and what to do (``exclude`` | ``flag`` | ``report``)."""

    provider: str
    source: str
    action: str
    records: int
    reason: str

    def line(self) -> str:
        """The one line the log and the screen show."""
        did = {"exclude": "excluded from buying, its records flagged provider_drift",
               "flag": "its records flagged provider_drift", "report": "reported only ([fidelity] on_drift)"}[self.action]
        src = "phase two" if self.source == "target" else "cheap signals"
        return f"provider {self.provider} is drifting ({src}, {self.records} records): {self.reason}; {did}"


def settings(cfg: FidelitySection) -> FidelitySettings:
    """The statistic's settings from ``[fidelity]``."""
    return FidelitySettings(false_alarm=cfg.false_alarm, min_records=cfg.min_records, min_tokens=cfg.min_tokens,
                            outside_tolerance=cfg.outside_tolerance, looks=cfg.looks)


def _target_verdicts(h: Handle, cfg: FidelitySection) -> tuple[dict[str, Any], dict[str, int]]:
    from engine.storage.fidelity import load_scores

    scores = load_scores(h)
    return dict(judge_providers(scores, settings(cfg))), {p: len(v) for p, v in scores.items()}


def _cheap_verdicts(h: Handle, cfg: FidelitySection) -> tuple[dict[str, Any], dict[str, int]]:
    from engine.fidelity.cheap import judge_cheap
    from engine.storage.cheapsignals import cheap_records

    recs = cheap_records(h)
    out = judge_cheap(recs, false_alarm=cfg.false_alarm, min_records=cfg.min_records, looks=cfg.looks)
    return dict(out), {p: len(v) for p, v in recs.items()}


#: Below this many records in all (one source), insufficient verdicts are refreshed at every look (the
#: dashboard's ``12/20``); above it the records are read only when some provider's look is due.
REFRESH_BELOW = 5000


def _counts(h: Handle, source: str) -> dict[str, int]:
    if source == "target":
        from engine.storage.fidelity import provider_score_counts

        return provider_score_counts(h)
    from engine.storage.cheapsignals import record_counts

    return record_counts(h)


def _worth_judging(counts: dict[str, int], rows: dict[tuple[str, str], dict[str, Any]], source: str,
                   cfg: FidelitySection, final: bool) -> bool:
    """Whether a look at ``source`` must read the records: a provider's look is due
    (:func:`engine.fidelity.looks.look_due`), or, while the records are few (< :data:`REFRESH_BELOW`), a
    provider's count changed since its row was written."""
    small = sum(counts.values()) < REFRESH_BELOW
    for prov, n in counts.items():
        r = rows.get((prov, source))
        if r is None:
            return True
        looks_used, last = int(r["looks"]), int(r["records"])
        # an insufficient row with enough records (too few tokens) is judged again once its records grew by half
        if look_due(n, last if (looks_used or last >= cfg.min_records) else 0, looks_used, looks=cfg.looks,
                    min_records=cfg.min_records, verdict=r["verdict"], final=final):
            return True
        if small and looks_used == 0 and int(r["records"]) != n:
            return True
    return False


def judge_run(run_dir: Path, cfg: FidelitySection, *, now: float | None = None, final: bool = False) -> list[Drift]:
    """Judge the providers of ``run_dir`` whose look is due and save their verdicts.

    Returns the drifts to act on now (a provider's first ``drifting`` verdict from a source, not cleared),
    already recorded as acted (``acted`` = the action; the caller carries it out).

    Raises:
        engine.storage.handle.NoStoreError: no store in ``run_dir``.
    """
    now = time.time() if now is None else now
    drifts: list[Drift] = []
    with connect_rw(run_dir, any_thread=True) as h:
        verdicts.ensure(h)
        rows = {(r["provider"], r["source"]): r for r in verdicts.load(h)}
        judges: list[tuple[str, Callable[[Handle, FidelitySection], tuple[dict[str, Any], dict[str, int]]]]] = [
            ("target", _target_verdicts)]
        if cfg.cheap_signals:
            judges.append(("cheap", _cheap_verdicts))
        for source, judge in judges:
            if not _worth_judging(_counts(h, source), rows, source, cfg, final):
                continue  # nothing due: the records are not read (a look reads every stored record)
            found, counts = judge(h, cfg)
            for prov, v in found.items():
                r = rows.get((prov, source))
                looks_used = int(r["looks"]) if r else 0
                if v.verdict == "insufficient":  # no test ran: no look spent; a first row says why
                    if r is None or (looks_used == 0 and int(r["records"]) != v.records):
                        verdicts.save(h, prov, source, v.verdict, v.records, getattr(v, "tokens", 0), v.reason,
                                      v.to_json(), now, look=False)
                    continue
                if not look_due(counts.get(prov, 0), int(r["records"]) if r and looks_used else 0, looks_used,
                                looks=cfg.looks, min_records=cfg.min_records, verdict=r["verdict"] if r else None,
                                final=final):
                    continue
                verdicts.save(h, prov, source, v.verdict, v.records, getattr(v, "tokens", 0), v.reason, v.to_json(), now)
                act = drift_action(v.verdict, r["acted"] if r else None, bool(r and r["cleared_at"] is not None),
                                   cfg.on_drift)
                if act is not None:
                    d = Drift(prov, source, act, v.records, v.reason)
                    path = write_evidence(Path(run_dir), h, d, v.to_json())
                    verdicts.set_acted(h, prov, source, act, str(path))
                    drifts.append(d)
    return drifts


def _slug(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", name)[:80] or "provider"


def write_evidence(run_dir: Path, h: Handle, d: Drift, doc: dict[str, Any]) -> Path:
    """Write ``RUN_DIR/fidelity/<provider>-<source>.json`` (atomically): the drift, its verdict document
    (tests, figures), the records judged and the endpoint snapshot the store keeps. Returns its path."""
    records: list[dict[str, Any]] = []
    if d.source == "target":
        from engine.storage.fidelity import score_rows

        records = score_rows(h, d.provider)
    else:
        from dataclasses import asdict

        from engine.storage.cheapsignals import cheap_records

        records = [asdict(r) for r in cheap_records(h).get(d.provider, [])]
    endpoints = latest_snapshot(h)
    body = {"provider": d.provider, "source": d.source, "action": d.action, "line": d.line(), "verdict": doc,
            "records": records, "endpoints": endpoints, "written_at": time.time()}
    path = run_dir / "fidelity" / f"{_slug(d.provider)}-{d.source}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    write_lines(path, [json.dumps(body, indent=1, sort_keys=True, default=str)])
    return path


def judge_offline(run_dir: Path, cfg: FidelitySection, say: Callable[[str], None]) -> list[Drift]:
    """After ``datagen extract`` scored a run's records: the providers' last look, with no engine running.

    A drift to ``exclude`` is persisted as ``ctl exclude-provider`` would (the next ``datagen run`` honours
    it); every drift is one event. One line per provider judged goes to ``say``. With a live ``datagen
    run`` holding ``run_dir`` nothing is judged here: its own watch judges within :data:`WATCH_S`.
    Returns the drifts acted on.
    """
    from engine.proc.runlock import holder
    from engine.storage import offline, read
    from engine.storage.schema import db_path

    if not db_path(Path(run_dir)).is_file():
        return []
    live = holder(Path(run_dir))
    if live is not None and live.pid != os.getpid():
        say(f"fidelity: the live run (pid {live.pid}) judges the providers; `datagen status {run_dir}` shows them")
        return []
    drifts = judge_run(Path(run_dir), cfg, final=True)
    with connect_rw(Path(run_dir)) as h:
        for d in drifts:
            if d.action == "exclude":
                excluded = read.excluded_providers(h)
                if d.provider not in excluded:
                    offline.set_excluded_providers(h, [*excluded, d.provider])
            offline.add_event(h, time.time(), "warning", "fidelity", None, d.line())
        for name, f in sorted(verdicts.by_provider(h).items()):
            src = {"target": "phase two", "cheap": "cheap signals"}.get(f["source"] or "", "not decided")
            say(f"fidelity: {name} {f['verdict']} ({src}, {f['records']} records)"
                + (f": {f['reason']}" if f["verdict"] != "ok" and f["reason"] else ""))
    for d in drifts:
        say(f"fidelity: {d.line()}")
    return drifts


class FidelityWatch:
    """Judges a live run's providers every :data:`WATCH_S` and carries out what a drift does.

    Args:
        run_dir: the run directory; cfg: ``[fidelity]``.
        exclude: ``await exclude(provider)`` stops buying from a provider (the controller's, as ``x``).
        event: ``event(level, kind, dataset, message)`` of the run (the log and the screen).
        publish: ``publish({provider: fidelity object})`` after each look (the dashboard's snapshot reads it).
        read_endpoints: ``await read_endpoints()`` returns the model's endpoints listing (the client's GET of
            :func:`engine.fidelity.endpoints.endpoints_path`); None: not read. Read at start and every
            :data:`ENDPOINTS_S`; a server without it (any error) is asked again only at the next start.
    """

    def __init__(self, run_dir: Path, cfg: FidelitySection, exclude: Callable[[str], Awaitable[str]],
                 event: Callable[[str, str, str | None, str], None],
                 publish: Callable[[dict[str, dict[str, Any]]], None] | None = None,
                 read_endpoints: Callable[[], Awaitable[Any]] | None = None) -> None:
        self.run_dir = Path(run_dir)
        self._read_endpoints = read_endpoints
        self._endpoints_at: float | None = None
        self.cfg = cfg
        self._exclude = exclude
        self._event = event
        self._publish = publish
        #: the last fidelity objects read back, by provider (the snapshot shows them)
        self.current: dict[str, dict[str, Any]] = {}

    def _look(self, final: bool) -> tuple[list[Drift], dict[str, dict[str, Any]]]:
        drifts = judge_run(self.run_dir, self.cfg, final=final)
        with connect_rw(self.run_dir, any_thread=True) as h:
            return drifts, verdicts.by_provider(h)

    async def look(self, final: bool = False) -> list[Drift]:
        """One look (in a thread), then act on each new drift; returns them."""
        try:
            drifts, self.current = await asyncio.to_thread(self._look, final)
        except Exception as e:  # a look that fails is logged; buying goes on
            log.warning("fidelity: the providers could not be judged (%s: %s)", type(e).__name__, e)
            return []
        if self._publish is not None:
            self._publish(self.current)
        for d in drifts:
            if d.action == "exclude":
                try:
                    await self._exclude(d.provider)
                except ValueError as e:
                    log.warning("fidelity: could not exclude provider %s (%s)", d.provider, e)
            self._event("warning", "fidelity", None, d.line())
        return drifts

    async def endpoints(self, now: float) -> None:
        """Read and keep the endpoints listing when due (see ``read_endpoints``)."""
        if self._read_endpoints is None or (self._endpoints_at is not None and now - self._endpoints_at < ENDPOINTS_S):
            return
        self._endpoints_at = now
        try:
            eps = parse_endpoints(await self._read_endpoints())
        except Exception as e:  # no listing on this server: asked again at the next start
            log.info("fidelity: no endpoints listing (%s: %s); providers' declared precision unknown", type(e).__name__, e)
            self._read_endpoints = None
            return

        def keep_snapshot() -> bool:
            with connect_rw(self.run_dir, any_thread=True) as h:
                return save_snapshot(h, eps, time.time())

        kept: bool = bool(eps) and await asyncio.to_thread(keep_snapshot)
        if kept:
            q = quantization_by_provider(eps)
            log.info("endpoints of the model: %s", ", ".join(f"{p} ({v})" for p, v in sorted(q.items())) or "none declared")

    async def run(self) -> None:
        """Look every :data:`WATCH_S` until cancelled (and read the endpoints listing when due)."""
        while True:
            await self.endpoints(time.monotonic())
            await self.look()
            await asyncio.sleep(WATCH_S)
