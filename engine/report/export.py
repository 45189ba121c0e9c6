"""``datagen export``: write stored results as files, atomically and in a deterministic order.

Formats: ``raw`` (below, needs no tokenizer) and the training-ready ``specforge``, ``openai`` and
``tokens`` (validated records only; :mod:`engine.tokens.exports`), all through :func:`export`.

Format ``raw``: one JSONL per dataset (``RAW_DIR/<dataset>.jsonl``), one line per completed prompt
in prompt-id order: ``dataset``, ``key``, ``messages``, ``tools``, ``response`` (``reasoning``,
``content``, ``tool_calls``, ``finish_reason``), ``usage`` (``prompt_tokens``,
``completion_tokens``, ``reasoning_tokens``), ``usage_source`` (where those tokens and the cost come
from: ``reported`` | ``generation`` | ``counted`` | ``estimated``, see :mod:`engine.money.usage`),
``cost_usd``, ``provider``, ``model``, ``generation_id``, ``wire_flags`` (the response's
wire-conformance flags, :mod:`engine.client.conformance`, comma-separated, "" for none: one string so
every row infers the same schema; a record with a failing one is kept out of every training format). ``messages``, ``tools`` and
``response.tool_calls`` are the stored values as JSON text (``json.loads`` gives them back exactly):
they have no one shape across rows, and every row must infer the same schema for
``datasets.load_dataset("json")`` (:mod:`engine.tokens.jsonrows`). Each file is written to a
temporary name in the same directory and renamed.

When no record qualifies (no result stored, or every result invalid and ``include_invalid`` not
set) nothing is written and :class:`NothingToExport` says why (``datagen export`` exits 1).

A dataset with nothing to export while others have some gets NO file, in every format (a 0-row
Parquet file makes ``datasets.load_dataset("parquet", data_dir=...)`` fail for the whole
directory; JSONL follows the same rule), and an older export's file of that dataset in the output
directory is removed; ``on_empty(dataset, why)`` is told, and ``datagen export`` prints it.
"""

from __future__ import annotations

import json
from pathlib import Path

from engine.client.conformance import decode_flags, encode_flags
from engine.errors import NothingToExport
from engine.storage import read
from engine.storage.atomic import write_lines, write_unless_empty
from engine.storage.handle import connect_ro
from engine.tokens.jsonrows import json_text


def _text(stored: str) -> str:
    """A stored JSON column re-written as JSON text (non-ASCII kept), checked to be JSON."""
    return json_text(json.loads(stored))


def export_raw(run_dir: Path, out_dir: Path, on_empty=None) -> dict[str, int]:
    """Export every dataset's results as JSONL; returns ``{dataset: lines written}`` for the files
    written. A dataset without a result gets no file (an older one is removed) and
    ``on_empty(dataset, why)`` is called.

    Raises:
        engine.report.status.StatusError: no store in ``run_dir``.
        NothingToExport: the run stores no result yet (nothing is written).
    """
    conn = connect_ro(run_dir)
    try:
        if not read.result_count(conn):
            n_prompts = read.prompt_count(conn)
            raise NothingToExport(f"nothing to export: {run_dir} stores no completed result yet "
                                  f"({n_prompts} prompt(s) ingested); nothing written")
        names = read.dataset_names(conn)
        written = {}
        for name in names:
            rows = read.raw_rows(conn, name)  # a store older than usage_source / wire_flags: reported / none

            def lines(rows=rows):
                for (ds, key, msgs, tools, reasoning, content, tcs, fin, pt, ct, rt, cost, prov, model, gid, src, wf) in rows:
                    yield json.dumps({
                        "dataset": ds, "key": key, "messages": _text(msgs), "tools": _text(tools),
                        "response": {"reasoning": reasoning, "content": content, "tool_calls": _text(tcs),
                                     "finish_reason": fin},
                        "usage": {"prompt_tokens": pt, "completion_tokens": ct, "reasoning_tokens": rt},
                        "usage_source": src, "cost_usd": None if cost is None else float(cost), "provider": prov,
                        "model": model, "generation_id": gid,
                        "wire_flags": encode_flags(decode_flags(wf)),
                    }, ensure_ascii=False)

            n = write_unless_empty(Path(out_dir) / f"{name}.jsonl", lines(), write_lines)
            if n:
                written[name] = n
            elif on_empty is not None:
                counts = read.prompt_states(conn, name).get(name, {})
                on_empty(name, "no completed result (" + (", ".join(f"{v} {k}" for k, v in sorted(counts.items()))
                                                          or "no prompt") + ")")
        return written
    finally:
        conn.close()


#: Every ``--format`` of ``datagen export``.
FORMATS = ("raw", "specforge", "openai", "tokens", "tokens-jsonl")


def export(run_dir: Path, out_dir: Path, fmt: str = "raw", *, tokenizer=None, include_invalid: bool = False,
           validate: bool = True, on_left_out=None, on_empty=None, include_drifting: bool = False,
           check_specforge: bool = True) -> dict[Path, int]:
    """Export a run in ``fmt``; returns ``{output file: rows written}`` (files written only).

    Args:
        run_dir / out_dir: run directory and output directory.
        fmt: one of :data:`FORMATS`.
        tokenizer: ``[tokenizer]`` section (``engine.config.TokenizerSection``) used to validate
            results that have no validation row yet (default: the one stored with the run).
        include_invalid: also export records that failed validation (not for ``raw``: it has all).
        include_drifting: also export the records of providers judged drifting (not for ``raw``: it has all;
            docs/fidelity.md).
        validate: validate results without a validation row first (writes the store); False while
            another process holds the run directory (a live run validates them itself): they are left out.
        on_left_out: ``specforge`` only: called ``(row id, reason)`` per row left out because SpecForge's
            parser would drop or cut turns of it (see :func:`engine.tokens.exports.export_validated`).
        on_empty: called ``(dataset, why)`` per dataset with nothing to export: it gets no file.
        check_specforge: ``specforge`` only: leave out (or refuse) rows SpecForge's parser would mis-train
            (:mod:`engine.tokens.specforgeguard`); False (``--force``) exports them anyway.

    Raises:
        NothingToExport: no record qualifies (nothing is written).
        engine.report.status.StatusError: no store (``raw``); engine.tokens.vstore.NoStoreError,
        engine.tokens.exports.ExportError, engine.tokens.tokenizer.TokenizerError (others).
    """
    if fmt == "raw":
        return {Path(out_dir) / f"{n}.jsonl": c for n, c in export_raw(run_dir, out_dir, on_empty).items()}
    from engine.tokens.exports import export_validated

    written = export_validated(run_dir, out_dir, fmt, tokenizer=tokenizer, include_invalid=include_invalid,
                               validate=validate, on_left_out=on_left_out, on_empty=on_empty,
                               include_drifting=include_drifting, check_specforge=check_specforge)
    ext = ".parquet" if fmt == "tokens" else ".jsonl"
    return {Path(out_dir) / f"{n}{ext}": c for n, c in written.items()}
