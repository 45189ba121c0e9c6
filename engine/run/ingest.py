"""Ingest: turn each configured dataset file into prompt rows in the store, once.

A dataset is re-read only when its fingerprint (path, size, mtime, format, field mapping,
``max_prompts``; per shard for a directory or glob; for an ``hf://`` dataset the commit sha its
revision resolves to and the files picked) changed since the last ingest, so resuming a run with
80,000 stored prompts does not re-parse the files. A Hub dataset's sha is stored with the run
(``datasets.revision``); a revision that moved to another commit is reported and re-read like a
changed file, and a resume at the same commit costs one Hub API call and no download
(:mod:`engine.datasets.hub`). Rows keep their first key: re-ingesting never touches stored results.
Resolving, downloading, reading and parsing run in a worker thread (off the event loop).

With a ``[tokenizer]``, each prompt is also rendered and encoded there, through the code validation
uses (:mod:`engine.tokens.promptcheck`): an unrenderable prompt is rejected before any request, the
special-token texts typed in its messages are stored with it (``special_text_in_prompt``; rejected
under ``prompt_special_text = "reject"``), and its class is picked by its real token count.

A prompt stored in several datasets (the same request: :mod:`engine.datasets.overlap`) is bought once,
under the dataset that stored it first (config order at a first ingest), the other copies stored as
duplicates (``dup``), or in each dataset under ``[run] cross_dataset_duplicates = "buy_each"``; decided
after every dataset is ingested, at every start (so a restart, a dataset added later or a changed
setting applies it to what is stored), with one line per pair of datasets (:attr:`IngestReport.overlap`).

A dataset whose every row is rejected (a wrong ``format`` or ``fields``, most likely) stops the run
before any request: :func:`all_rejected` (``dataset NAME: all N rows rejected (first: FILE:LINE:
reason)``). Nothing of that read is stored, so every later run reads it again and says so again.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from engine.config import Config, DatasetSection
from engine.datasets import DatasetError, Reject, Shard, iter_prompts
from engine.datasets import hub as hubs
from engine.datasets.overlap import Copy, overlap_lines, plan
from engine.datasets.sources import local_shards
from engine.prompts import Became, Prompt
from engine.storage.store import Store

if TYPE_CHECKING:
    from engine.tokens.promptcheck import PromptChecker

log = logging.getLogger(__name__)

#: Characters per token for the prompt-length estimate used to pick a request class.
CHARS_PER_TOKEN = 4
#: Extra tokens per message for chat-template markers in the estimate.
TOKENS_PER_MESSAGE = 4
_BATCH = 2000


@dataclass
class IngestReport:
    """What ingest did for one dataset.

    Attributes:
        dataset: name; skipped_unchanged: True when the file was not re-read (fingerprint equal).
        prompts: valid unique prompts now in the store; inserted: new rows this time;
        rejected: rows rejected (bad rows + duplicates); examples: the first few rejects as text;
        normalised: prompts whose turns ingest brought into SpecForge's role order (merged or dropped
        turns, :mod:`engine.datasets.roles`); normalised_examples: the first few as ``"path:line: what"``.
        whole: prompts that are their row's whole conversation (it ended on a user or tool turn);
        cut: prompts cut before their row's final assistant turn; reasoning_moved: prompts with an
        earlier assistant turn whose inline reasoning moved to ``reasoning_content``
        (``docs/prompt-construction.md``). All three count this ingest's stored rows (0 when skipped).
        stale_deleted / stale_failed / stale_kept: stored prompts whose row is no longer in the
        re-read file (``Store.drop_stale``): pending and never sent (deleted), pending with billed
        attempts (marked failed, class ``removed``), done or failed (kept with their results).
        revision: an ``hf://`` dataset's commit sha (None for a local path); moved_from: the sha stored
        by the previous ingest when the revision now points elsewhere (the dataset was re-read);
        hub_files / hub_pattern: how many files were picked, and the glob that picked them.
        file_notes: problems of whole files met while reading, as ``"file...: reason"`` lines, shown
            before anything else (the reject that skipped the rest of a truncated compressed file or a
            broken JSON array, zstd frames without a checksum); empty when skipped.
        duplicates: its prompts stored as duplicates of another dataset's (``dup``: not bought here,
            not in ``prompts``), skipped or not; overlap: one line per other dataset it shares prompts
            with (:func:`engine.datasets.overlap.overlap_lines`), e.g. ``"ingest: 37 prompt(s) of 'a'
            also in 'b' (bought once, under 'b'; ...)"``.
    """

    dataset: str
    skipped_unchanged: bool
    prompts: int
    inserted: int = 0
    rejected: int = 0
    examples: list[str] = field(default_factory=list)
    normalised: int = 0
    normalised_examples: list[str] = field(default_factory=list)
    whole: int = 0
    cut: int = 0
    reasoning_moved: int = 0
    stale_deleted: int = 0
    stale_failed: int = 0
    stale_kept: int = 0
    revision: str | None = None
    moved_from: str | None = None
    hub_files: int = 0
    hub_pattern: str = ""
    file_notes: list[str] = field(default_factory=list)
    duplicates: int = 0
    overlap: list[str] = field(default_factory=list)

    def revision_summary(self, url: str, revision: str) -> str | None:
        """One line on an ``hf://`` dataset's commit (None for a local path): ``"hf://datasets/ORG/NAME
        revision main moved: OLD -> NEW (re-read ...)"``, or ``"... revision main is commit SHA (N files: GLOB)"``."""
        if self.revision is None:
            return None
        if self.moved_from is not None:
            return (f"{url} revision {revision} moved: {self.moved_from} -> {self.revision} (re-read like a changed "
                    f"file: rows no longer in it are handled as edited rows)")
        files = f" ({self.hub_files} file(s): {self.hub_pattern})" if self.hub_files else ""
        return f"{url} revision {revision} is commit {self.revision}{files}"

    def stale_summary(self) -> str | None:
        """One line on stored prompts whose row left the file, or None when there are none."""
        if not (self.stale_deleted or self.stale_failed or self.stale_kept):
            return None
        return (f"{self.stale_deleted + self.stale_failed + self.stale_kept} stored prompt(s) no longer in the file "
                f"(row edited, deleted or now rejected): {self.stale_deleted} pending removed (never sent), "
                f"{self.stale_failed} pending with billed attempts marked failed (removed), {self.stale_kept} "
                f"with stored results kept (still exported)")

    def became_summary(self) -> str:
        """One line: ``"N prompt(s) whole (ended on a user or tool turn), M cut before the final
        assistant turn, K with inline reasoning moved to reasoning_content (docs/prompt-construction.md)"``."""
        return (f"{self.whole} prompt(s) whole (ended on a user or tool turn), {self.cut} cut before the final "
                f"assistant turn, {self.reasoning_moved} with inline reasoning moved to reasoning_content "
                f"(docs/prompt-construction.md)")


def estimate_prompt_tokens(p: Prompt) -> int:
    """Estimated prompt tokens: characters / 4 + 4 per message (a class-routing heuristic, not billing)."""
    return p.char_count() // CHARS_PER_TOKEN + TOKENS_PER_MESSAGE * len(p.messages)


def fingerprint(d: DatasetSection, rev: hubs.HubRevision | None = None) -> str:
    """A hash of everything that changes which prompts a dataset yields.

    One local file: its path, size and mtime (the formula stored runs were fingerprinted with); a
    directory or glob: each shard's name, size and mtime; an ``hf://`` dataset: ``rev``'s commit sha and
    files. Plus ``format``, ``fields`` and ``max_prompts``.

    Raises:
        engine.datasets.DatasetError: a local file cannot be stat'ed (missing, no access), or a
            directory or glob names no data file.
    """
    if rev is not None:
        what: list = [str(d.path), rev.sha, list(rev.files)]
    else:
        assert isinstance(d.path, Path)  # no Hub revision: a local path
        shards = local_shards(d.path)
        try:
            if len(shards) == 1 and shards[0].shown == str(d.path):
                st = d.path.stat()
                what = [str(d.path), st.st_size, st.st_mtime_ns]
            else:
                what = [str(d.path), [[s.shown, (st := s.path.stat()).st_size, st.st_mtime_ns] for s in shards]]
        except OSError as e:
            raise DatasetError(f"{e.filename or d.path}: cannot read file ({e.strerror or e})") from e
    raw = json.dumps([*what, d.format, d.fields, d.max_prompts], sort_keys=True)
    return hashlib.sha256(raw.encode()).hexdigest()[:16]


def all_rejected(name: str, rows: int, rejects: list[tuple[str, str]]) -> DatasetError | None:
    """The error of a dataset read that yielded no prompt but rejected rows (None otherwise): it
    names how many and the first reject, ``dataset NAME: all N rows rejected (first: FILE:LINE: reason)``."""
    if rows or not rejects:
        return None
    src, why = rejects[0]
    return DatasetError(f"dataset {name}: all {len(rejects):,} rows rejected (first: {src}: {why}); "
                        f"check the dataset's format and fields")


def _read(d: DatasetSection, cfg: Config, checker: "PromptChecker | None" = None, rev: hubs.HubRevision | None = None,
          notes: list[str] | None = None,
          ) -> tuple[list[tuple], list[tuple[str, str]], list[tuple[str, str]], list[tuple[str, Became]]]:
    rows: list[tuple] = []
    rejects: list[tuple[str, str]] = []
    normalised: list[tuple[str, str]] = []
    became: list[tuple[str, Became]] = []
    seen: dict[str, str] = {}
    source: Path | list[Shard]
    if rev is not None:
        source = hubs.download(rev)
    else:
        assert isinstance(d.path, Path), "a dataset without a Hub revision has a local path"
        source = d.path
    for item in iter_prompts(source, d.format, d.fields or None, notes):
        if isinstance(item, Reject):
            rejects.append((item.source, item.reason))
            continue
        if item.key in seen:
            rejects.append((item.source, f"duplicate prompt (same key as {seen[item.key]})"))
            continue
        if d.max_prompts is not None and len(rows) >= d.max_prompts:
            break
        est, special = estimate_prompt_tokens(item), None
        if checker is not None:
            verdict = checker.check(item.messages, item.tools)
            why = checker.reject_reason(verdict)
            if why is not None:
                rejects.append((item.source, why))
                continue
            est, special = verdict.tokens or est, verdict.special_summary()
        seen[item.key] = item.source
        if item.notes:
            normalised.append((item.source, "; ".join(item.notes)))
        if item.became is not None:
            became.append((item.source, item.became))
        rows.append(
            (item.key, item.source, cfg.class_for(d.name, est), est,
             json.dumps(item.messages, ensure_ascii=False), json.dumps(item.tools, ensure_ascii=False), special)
        )
    return rows, rejects, normalised, became


async def ingest_all(cfg: Config, store: Store, checker: "PromptChecker | None" = None) -> list[IngestReport]:
    """Register and (re)ingest every configured dataset; returns one report per dataset, in order.

    ``checker`` (given when ``[tokenizer]`` is configured) renders every prompt read: unrenderable
    ones (and, under ``prompt_special_text = "reject"``, ones with special-token text) are rejected.

    An ``hf://`` dataset's revision is resolved first (one Hub API call, or the cache offline); its
    files are downloaded only when the fingerprint changed.

    A dataset that fails (a :class:`~engine.datasets.DatasetError`) has nothing stored from this read
    (rows are inserted only once every file of it was read): the failure is recorded with it
    (``Store.fail_ingest``: ``datagen status`` shows it stopped, with the reason), then re-raised;
    later datasets are not read.

    Raises:
        engine.datasets.DatasetError: a whole file cannot be read or is corrupt, or a Hub dataset cannot
            be resolved or downloaded (named in the message).
    """
    reports = []
    rows = await store.datasets()
    for pos, d in enumerate(cfg.datasets):
        await store.register_dataset(d.name, pos, str(d.path), d.token_budget)
        try:
            reports.append(await _ingest_one(cfg, store, checker, d, rows.get(d.name)))
        except DatasetError as e:  # recorded with the dataset: `datagen status` shows it stopped, with the reason
            await store.fail_ingest(d.name, str(e))
            raise
    await mark_overlap(cfg, store, reports)
    return reports


async def mark_overlap(cfg: Config, store: Store, reports: list[IngestReport]) -> None:
    """Decide, over everything stored, which copy of a prompt stored in several datasets is bought
    (``[run] cross_dataset_duplicates``, :func:`engine.datasets.overlap.plan`), store the others as
    ``dup``, and fill each report's ``prompts`` (duplicates not counted), ``duplicates`` and ``overlap``
    lines (also logged)."""
    mode = cfg.run.cross_dataset_duplicates
    stored = await store.datasets()
    eligible = {d.name for d in cfg.datasets if (stored.get(d.name) or {}).get("state") != "skipped"}
    copies = [Copy(i, ds, key, cfg.classes[cls].max_tokens if cls in cfg.classes else cls, st, att, ec, of)
              for i, ds, key, cls, st, att, ec, of in await store.shared_copies()]
    p = plan(copies, mode, eligible)
    await store.mark_copies(p.to_dup, p.to_pending)
    lines = overlap_lines(p, mode)
    stored = await store.datasets()
    for rep in reports:
        rep.prompts = int(stored[rep.dataset]["prompts"])
        rep.duplicates = sum(n for (ds, _), n in p.pairs.items() if ds == rep.dataset) if mode == "buy_once" else 0
        rep.overlap = lines.get(rep.dataset, [])
        for line in rep.overlap:
            log.info("%s", line)


async def _ingest_one(cfg: Config, store: Store, checker: "PromptChecker | None", d: DatasetSection,
                      prev: dict | None) -> IngestReport:
    """Ingest dataset ``d`` (registered) unless its fingerprint equals ``prev``'s (its stored row)."""
    ref = d.hub()
    rev = await asyncio.to_thread(hubs.resolve, ref) if ref is not None else None
    fp = await asyncio.to_thread(fingerprint, d, rev)
    hub_info: dict = {} if rev is None else {"revision": rev.sha, "hub_files": len(rev.files), "hub_pattern": rev.pattern}
    if prev is not None and prev["fingerprint"] == fp and (
            prev["prompts"] or not prev["rejected"] or await store.duplicate_count(d.name)):
        # (a store whose dataset was stored with every row rejected, before that stopped the run, is re-read;
        # one whose every prompt is a duplicate of another dataset's is not)
        await store.reclassify(d.name, lambda est, _n=d.name: cfg.class_for(_n, est))
        return IngestReport(d.name, True, prev["prompts"], rejected=prev["rejected"], **hub_info)
    old_sha = prev.get("revision") if prev is not None else None
    if rev is not None and ref is not None and old_sha and old_sha != rev.sha:
        hub_info["moved_from"] = old_sha
        log.warning("[%s] %s revision %s moved: %s -> %s; re-reading", d.name, ref.url, ref.revision,
                    old_sha, rev.sha)
    notes: list[str] = []
    new_rows, rejects, normalised, became = await asyncio.to_thread(_read, d, cfg, checker, rev, notes)
    for note in notes:
        log.warning("[%s] %s", d.name, note)
    err = all_rejected(d.name, len(new_rows), rejects)
    if err is not None:  # no prompt stored, no fingerprint: the next run reads it again and stops again
        await store.replace_rejects(d.name, rejects)  # `datagen status` counts them (`rej`), with the reasons
        await store.finish_ingest(d.name, "", len(rejects), rev.sha if rev is not None else None)
        raise err
    inserted = 0
    for i in range(0, len(new_rows), _BATCH):
        inserted += await store.ingest_batch(d.name, new_rows[i : i + _BATCH])
    await store.replace_rejects(d.name, rejects)
    stale = await store.drop_stale(d.name, {r[0] for r in new_rows})
    n = await store.finish_ingest(d.name, fp, len(rejects), rev.sha if rev is not None else None)
    rep = IngestReport(d.name, False, n, inserted, len(rejects), [f"{s}: {r}" for s, r in rejects[:5]],
                       len(normalised), [f"{s}: {r}" for s, r in normalised[:5]],
                       whole=sum(not b.cut for _, b in became), cut=sum(b.cut for _, b in became),
                       reasoning_moved=sum(bool(b.reasoning) for _, b in became),
                       stale_deleted=stale[0], stale_failed=stale[1], stale_kept=stale[2], file_notes=notes, **hub_info)
    if rep.stale_summary():
        log.warning("[%s] %s", d.name, rep.stale_summary())
    for s, r in rejects[:20]:
        log.warning("[%s] rejected %s: %s", d.name, s, r)
    flagged = [(r[1], r[6]) for r in new_rows if r[6]]
    if flagged:  # special_text_in_prompt: kept (prompt_special_text = "keep"), sent as special ids
        log.warning("[%s] %d prompt(s) with special-token text in their messages (kept: it is sent as special "
                    "ids; [tokenizer] prompt_special_text = \"reject\" rejects them), e.g. %s: %s",
                    d.name, len(flagged), *flagged[0])
    if normalised:
        log.info("[%s] %d prompt(s) brought into SpecForge's role order at ingest (docs/specforge-roles.md)",
                 d.name, len(normalised))
    for s, r in normalised[:20]:
        log.debug("[%s] normalised %s: %s", d.name, s, r)
    log.info("[%s] %s", d.name, rep.became_summary())
    for s, b in became[:20]:
        log.debug("[%s] prompt %s: %s", d.name, s, b.describe())
    return rep
