"""Training-ready exports of validated records: ``specforge``, ``openai``, ``tokens``.

Only records with a validation row are exported; invalid ones (``ok = 0``) are left out unless
``include_invalid``. Results without a validation row are validated first when the tokenizer is
known (``--config`` or the run's stored ``[tokenizer]``), else the export stops and says so.
One file per dataset, datasets in config order, rows in prompt-id order; each file is written to a
temporary name in the same directory and renamed (atomic).

- ``specforge`` (``DIR/<dataset>.jsonl``): ``{"id": "<dataset>:<key>", "conversations": [prompt
  messages..., generated assistant turn], "tools"}``; tool calls of the generated turn in native form
  (``functions.NAME:IDX``), arguments verbatim. A row SpecForge's parser would not train on whole (a
  prompt stored before ingest normalised role order, ``engine.datasets.roles``) is left out and reported,
  and so is a row its parser would mis-train with the template a user of this tokenizer picks
  (``kimi-k2-thinking``: reasoning dropped, a system prompt inserted, tool arguments re-serialised;
  :mod:`engine.tokens.specforgeguard`); when that is every row (a thinking model's run) the export is
  refused and names ``tokens-jsonl`` + SpecForge's ``data.prompts_path``.
- ``openai`` (``DIR/<dataset>.jsonl``): ``{"id", "messages": [..., generated assistant turn], "tools"}``,
  the assistant turn in OpenAI shape (``content`` null when the turn is only tool calls).
- ``tokens`` (``DIR/<dataset>.parquet``): the :mod:`engine.tokens.records` format (``input_ids``
  int32, ``loss_mask`` int8 = 1 exactly on the completion ids, not shifted).
- ``tokens-jsonl`` (``DIR/<dataset>.jsonl``): the same records, one JSON object per line,
  ``{"input_ids": [...], "loss_mask": [...], "id"}`` (:func:`engine.tokens.records.write_jsonl`):
  what the pre-tokenized paths of SpecForge (``data.prompts_path``,
  ``specforge/data/prompt_builder.py`` ``prepare_prompt_tasks``) and speculators (``prepare-data``,
  ``data_generation/preprocessing.py`` ``_passthrough_pretokenized``) read; neither reads Parquet.

In ``specforge`` and ``openai`` every message has the keys of :data:`engine.tokens.jsonrows.MESSAGE_KEYS`, and ``tools`` and
each message's ``tool_calls`` are JSON text (``"[]"`` when none), so that every row has one schema
for ``datasets.load_dataset("json")`` (:mod:`engine.tokens.jsonrows`). SpecForge parses both strings
itself (``docs/export-loading.md``).

When no record qualifies, nothing is written and :class:`engine.errors.NothingToExport` names the
counts and the failed checks (``datagen export`` exits 1); a dataset with no qualifying record while
others have some gets NO file (a 0-row Parquet file makes ``datasets.load_dataset("parquet",
data_dir=...)`` fail for the whole directory; JSONL files follow the same rule), an older export's
file of that dataset is removed (it must not survive beside a new export), and ``on_empty`` says why.

Records of a provider judged ``drifting`` (its drift acted on with ``exclude`` or ``flag``, not cleared:
:func:`engine.storage.verdicts.drifting_providers`, docs/fidelity.md) carry the ``provider_drift`` flag
and are left out of every format unless ``include_drifting``; :func:`drift_left_out` counts them.
"""

from __future__ import annotations

import collections
import json
from pathlib import Path
from typing import Callable, Collection, Iterator

from engine.client.conformance import FAILING as WIRE_REASONS
from engine.client.conformance import decode_flags
from engine.config import TokenizerSection
from engine.datasets.roles import specforge_problem
from engine.errors import DatagenError, NothingToExport
from engine.storage import read, validations, verdicts
from engine.storage.handle import Handle
from engine.tokens import vstore
from engine.tokens.jsonrows import assistant_message, export_message, json_text
from engine.tokens.reconstruct import count_tool_calls, native_tool_calls
from engine.tokens.records import TokenRecord, write_jsonl, write_parquet
from engine.tokens.specforgeguard import SpecForgeGuard

FORMATS = ("specforge", "openai", "tokens", "tokens-jsonl")


class ExportError(DatagenError):
    """The export cannot run (records not validated and no tokenizer to validate them)."""


def ensure_validated(run_dir: Path, section: TokenizerSection | None, *, workers: int | None = None) -> int:
    """Validate results that have no validation row yet; returns how many were validated.

    Raises:
        ExportError: some are unvalidated and no tokenizer section is known.
        TokenizerError: the tokenizer's start-up check refused.
    """
    conn = vstore.connect(run_dir)
    try:
        missing = vstore.unvalidated_count(conn)
    finally:
        conn.close()
    if not missing:
        return 0
    if section is None:
        raise ExportError(f"{missing} result(s) of {run_dir} are not validated and the run stores no [tokenizer]: "
                          f"run `datagen validate {run_dir} --config CONFIG` (or pass --config) first")
    from engine.tokens.service import validate_run

    validate_run(run_dir, section, workers=workers, only_missing=True)
    return missing


def left_out(conn: Handle) -> tuple[int, int, collections.Counter]:
    """``(invalid records, results without a validation row, Counter of failed checks of the invalid
    ones)`` of an open store: what an export without ``include_invalid`` leaves out."""
    reasons: collections.Counter = collections.Counter()
    invalid = 0
    for _, rs in validations.invalid_reasons(conn):
        invalid += 1
        reasons.update(rs)
    return invalid, validations.unvalidated_count(conn), reasons


def served_instead(conn: Handle) -> dict[str, int]:
    """``{model the response named: records}`` of the records left out as ``model_mismatch``: which
    models were served instead of the one asked for, most first."""
    got = validations.failed_models(conn, "model_mismatch")
    return dict(sorted(got.items(), key=lambda kv: (-kv[1], kv[0])))


def empty_reason(conn: Handle, dataset: str, include_invalid: bool, role_left_out: int = 0) -> str:
    """Why ``dataset`` has no row in an export: its stored results, invalid ones (with the failed
    checks), unvalidated ones, and rows left out for SpecForge's role order."""
    stored = read.result_count(conn, dataset)
    if not stored:
        counts = read.prompt_states(conn, dataset).get(dataset, {})
        return "no completed result (" + (", ".join(f"{v} {k}" for k, v in sorted(counts.items())) or "no prompt") + ")"
    reasons: collections.Counter = collections.Counter()
    invalid = 0
    for _, rs in validations.invalid_reasons(conn, dataset):
        invalid += 1
        reasons.update(rs)
    unvalidated = validations.unvalidated_count(conn, dataset)
    parts = [f"{stored} result(s) stored"]
    if invalid and not include_invalid:
        parts.append(f"{invalid} invalid (" + ", ".join(f"{k} {v}" for k, v in reasons.most_common()) + ")")
    if unvalidated:
        parts.append(f"{unvalidated} not validated")
    if role_left_out:
        parts.append(f"{role_left_out} left out for SpecForge's parser (role order, or it would mis-train them)")
    return f"no {'' if include_invalid else 'valid '}record: " + ", ".join(parts)


def _check_something_qualifies(conn: Handle, run_dir: Path, include_invalid: bool) -> None:
    if validations.validated_count(conn, include_invalid=include_invalid):
        return
    stored = read.result_count(conn)
    if not stored:
        raise NothingToExport(f"nothing to export: {run_dir} stores no completed result yet; nothing written")
    invalid, unvalidated, reasons = left_out(conn)
    why = ", ".join(f"{k} {v}" for k, v in reasons.most_common())
    hint = ("the provider sent these: docs/wire-conformance.md" if reasons and set(reasons) <= set(WIRE_REASONS)
            else "re-run it after fixing the [tokenizer]")
    raise NothingToExport(
        f"nothing to export: none of the {stored} stored result(s) of {run_dir} is valid ({invalid} invalid"
        f"{': ' + why if why else ''}{f'; {unvalidated} not validated' if unvalidated else ''}); nothing written. "
        f"`datagen validate {run_dir}` shows the report ({hint}); "
        f"--include-invalid exports invalid records anyway")


#: The flag of a record whose provider was judged drifting (docs/fidelity.md).
PROVIDER_DRIFT = "provider_drift"


class _Drift:
    """The providers whose records are left out (``drifting``) unless ``include``; included ones are flagged."""

    def __init__(self, conn: Handle, include: bool) -> None:
        self.drifting = verdicts.drifting_providers(conn)
        self.include = include

    def keep(self, provider: str) -> bool:
        return self.include or provider not in self.drifting


def _rows(conn: Handle, dataset: str, include_invalid: bool, drift: _Drift | None = None) -> Iterator[tuple]:
    for row in validations.export_rows(conn, dataset, include_invalid):
        if drift is None or drift.keep(row[6]):
            yield row


def drift_left_out(conn: Handle, include_invalid: bool = False) -> dict[str, tuple[int, str]]:
    """``{provider: (records, reason)}`` a training export leaves out as ``provider_drift`` (of those it
    would export otherwise: valid ones, or every validated one with ``include_invalid``)."""
    drifting = verdicts.drifting_providers(conn)
    if not drifting:
        return {}
    counts = validations.provider_counts(conn, include_invalid)
    return {p: (counts.get(p, 0), why) for p, why in sorted(drifting.items()) if counts.get(p, 0)}


def _json_lines(conn: Handle, dataset: str, fmt: str, include_invalid: bool, id_format: str,
                on_left_out: Callable[[str, str], None] | None = None, drift: _Drift | None = None,
                guard: SpecForgeGuard | None = None) -> Iterator[str]:
    for _pid, key, _ok, pl, _cl, blob, _prov, _fin, msgs, tools, reasoning, content, tcs, *_ in _rows(
            conn, dataset, include_invalid, drift):
        msgs, tools = json.loads(msgs), json.loads(tools)
        calls, _ = native_tool_calls(json.loads(tcs), count_tool_calls(msgs), id_format)
        rid = f"{dataset}:{key}"
        if fmt == "specforge":
            problem = specforge_problem([*msgs, {"role": "assistant", "content": content}])
            if problem is not None:  # a prompt stored before ingest normalised role order: SpecForge would
                if on_left_out is not None:  # not train on the generated turn as it was generated
                    on_left_out(rid, problem)
                continue
            turn = assistant_message(content, reasoning, calls)
        else:
            turn = assistant_message(content if (content or not calls) else None, reasoning, calls)
        turns = [export_message(m) for m in msgs] + [turn]
        if guard is not None:  # SpecForge's own parser would not train it as bought (engine.tokens.specforgecheck)
            v = guard.verdict(turns, tools, vstore.unpack_ids(blob), pl)
            if v is not None:
                if on_left_out is not None:
                    on_left_out(rid, v.detail)
                continue
        doc = {"id": rid, "conversations" if fmt == "specforge" else "messages": turns, "tools": json_text(tools)}
        yield json.dumps(doc, ensure_ascii=False)


def _token_records(conn: Handle, dataset: str, include_invalid: bool, drift: _Drift | None = None) -> Iterator[TokenRecord]:
    for row in _rows(conn, dataset, include_invalid, drift):
        _pid, key, _ok, pl, cl, blob, prov, fin = row[:8]
        model, endpoint, fp, temperature, top_p, reasons, wire = row[13:20]
        ids = vstore.unpack_ids(blob)
        if len(ids) != pl + cl:
            raise ExportError(f"{dataset}:{key}: stored ids ({len(ids)}) != prompt_len + completion_len ({pl}+{cl})")
        yield TokenRecord(id=f"{dataset}:{key}", dataset=dataset, input_ids=ids, loss_mask=[0] * pl + [1] * cl,
                          prompt_len=pl, completion_len=cl, provider=prov, finish_reason=fin, model=model or "",
                          endpoint=endpoint or "", system_fingerprint=fp or "",
                          flags=record_flags(json.loads(reasons or "[]"), decode_flags(wire),
                                             drifted=drift is not None and prov in drift.drifting),
                          temperature=temperature, top_p=top_p)


def record_flags(reasons: list[str], wire_flags: Collection[str], drifted: bool = False) -> tuple[str, ...]:
    """A record's ``flags`` column: its failed checks (:data:`engine.tokens.validate.REASONS` order, as
    stored), ``provider_drift`` when its provider was judged drifting (``drifted``), then its wire flags
    not already among them (the notes: ``finish_alias``...), each once."""
    return tuple(dict.fromkeys([*reasons, *([PROVIDER_DRIFT] if drifted else []), *wire_flags]))


def export_validated(run_dir: Path, out_dir: Path, fmt: str, *, tokenizer: TokenizerSection | None = None,
                     include_invalid: bool = False, workers: int | None = None, validate: bool = True,
                     on_left_out: Callable[[str, str], None] | None = None,
                     on_empty: Callable[[str, str], None] | None = None,
                     include_drifting: bool = False, check_specforge: bool = True) -> dict[str, int]:
    """Export every dataset in ``fmt`` (one of :data:`FORMATS`); returns ``{dataset: rows}`` for the
    files written.

    Args:
        run_dir / out_dir: the run directory and the output directory (created).
        fmt: ``specforge`` | ``openai`` | ``tokens`` | ``tokens-jsonl``.
        tokenizer: settings to validate unvalidated results with (default: the run's stored ones).
        include_invalid: export invalid records too.
        include_drifting: export the records of providers judged drifting too (flagged ``provider_drift``).
        validate: validate unvalidated results first (False: leave them out, write nothing to the store).
        on_left_out: called ``(row id, reason)`` for each ``specforge`` row left out because SpecForge's
            parser would drop or cut turns of it (a prompt stored before ingest normalised role order;
            docs/specforge-roles.md), or would not train it as bought (``check_specforge``; the reason
            starts with :data:`engine.tokens.specforgeguard.REASON_PREFIX`).
        check_specforge: ``specforge`` only: run SpecForge's parser (transcribed,
            :mod:`engine.tokens.specforgecheck`) over each row with the run's tokenizer and leave out the
            rows it would mis-train (reasoning dropped, a system prompt inserted, tool arguments
            re-serialised); when it would mis-train every row, nothing is written and NothingToExport
            names the path to train from (``tokens-jsonl``).
        on_empty: called ``(dataset, why)`` for each dataset with no row to export: no file is
            written for it (see the module docstring).

    Raises:
        engine.errors.NothingToExport: no record qualifies (nothing is written).
        ExportError, TokenizerError, engine.tokens.vstore.NoStoreError.
    """
    from engine.storage.atomic import write_lines, write_unless_empty
    from engine.tokens.service import section_for_run

    if fmt not in FORMATS:
        raise ValueError(f"unknown export format {fmt!r}")
    section = tokenizer or section_for_run(run_dir)
    if validate:
        ensure_validated(run_dir, section, workers=workers)
    id_format = section.tool_id_format if section is not None else TokenizerSection(path="-").tool_id_format
    conn = vstore.connect(run_dir)
    try:
        _check_something_qualifies(conn, run_dir, include_invalid)
        drift = _Drift(conn, include_drifting)
        guard = _guard(section) if fmt == "specforge" and check_specforge else None
        names = read.dataset_names(conn)
        out: dict[str, int] = {}
        empties: list[tuple[str, int]] = []
        for name in names:
            dropped: list[str] = []

            def left(rid: str, why: str, _d=dropped) -> None:
                _d.append(rid)
                if on_left_out is not None:
                    on_left_out(rid, why)

            if fmt == "tokens":
                n = write_unless_empty(Path(out_dir) / f"{name}.parquet", _token_records(conn, name, include_invalid, drift),
                                       write_parquet)
            elif fmt == "tokens-jsonl":
                n = write_unless_empty(Path(out_dir) / f"{name}.jsonl", _token_records(conn, name, include_invalid, drift),
                                       write_jsonl)
            else:
                n = write_unless_empty(Path(out_dir) / f"{name}.jsonl",
                                       _json_lines(conn, name, fmt, include_invalid, id_format, left, drift, guard),
                                       write_lines)
            if n:
                out[name] = n
            else:
                empties.append((name, len(dropped)))
        if guard is not None and guard.left and not guard.kept:
            raise NothingToExport(guard.refusal(run_dir))
        for name, n_dropped in empties:
            if on_empty is not None:
                on_empty(name, empty_reason(conn, name, include_invalid, n_dropped))
        return out
    finally:
        conn.close()


def _guard(section: TokenizerSection | None) -> SpecForgeGuard:
    """The ``specforge`` export's guard with the run's tokenizer (None: decided without one)."""
    if section is None:
        return SpecForgeGuard(None)
    from engine.tokens.tokenizer import load_tokenizer

    return SpecForgeGuard(load_tokenizer(section))


def iter_token_records(run_dir: Path, *, include_invalid: bool = False,
                       datasets: Collection[str] | None = None, include_drifting: bool = False) -> Iterator[TokenRecord]:
    """Validated token records straight from a run directory, dataset by dataset in config order.

    Results not validated yet are validated first with the run's stored ``[tokenizer]`` settings.
    With ``datasets``: only those datasets, and results not validated yet are left out instead (the
    caller waits for their validation: chained extraction while generation goes on).

    Raises:
        engine.tokens.vstore.NoStoreError: no store in ``run_dir``.
        ExportError: stored ids disagree with their recorded lengths.
    """
    from engine.tokens.service import section_for_run

    section = section_for_run(run_dir) if datasets is None else None
    if section is not None:
        ensure_validated(run_dir, section)
    conn = vstore.connect(run_dir)
    try:
        names = [n for n in read.dataset_names(conn) if datasets is None or n in datasets]
        drift = _Drift(conn, include_drifting)
        for name in names:
            yield from _token_records(conn, name, include_invalid, drift)
    finally:
        conn.close()
