"""The ``datagen`` argument parser (argparse) and the installed version."""

from __future__ import annotations

import argparse

from datagen.commands import (
    EXIT_ERROR,
    cmd_ctl,
    cmd_export,
    cmd_extract,
    cmd_make_tokenizer,
    cmd_report,
    cmd_sim,
    cmd_status,
    cmd_validate,
)
from datagen.probecmd import cmd_probe
from datagen.runcmd import cmd_run
from datagen.salvagecmd import EXIT_ERROR as SALVAGE_ERROR
from datagen.salvagecmd import cmd_salvage


def version() -> str:
    """The installed eagle-datagen's version (``importlib.metadata``), or ``unknown`` when the code
    runs from a source tree that was never installed."""
    from importlib.metadata import PackageNotFoundError
    from importlib.metadata import version as dist_version

    try:
        return dist_version("eagle-datagen")
    except PackageNotFoundError:
        return "unknown (not installed: pip install -e .)"


def build_parser() -> argparse.ArgumentParser:
    """The argparse tree of ``datagen``."""
    p = argparse.ArgumentParser(prog="datagen", description="Buy a target model's completions and turn them into EAGLE-3 training data.")
    p.add_argument("--version", action="version", version=f"datagen {version()}")
    sub = p.add_subparsers(dest="cmd", required=True)

    r = sub.add_parser("run", help="run the generation job of CONFIG (resumes if the run directory exists)")
    r.add_argument("config", help="path of config.toml")
    r.add_argument("--headless", action="store_true", help="log lines instead of the dashboard (default without a TTY)")
    r.add_argument("--run-dir", help="override [run] dir")
    r.add_argument("--exit-on-pause", action="store_true", help="exit with code 3 when the whole run is paused by a guard")
    r.set_defaults(func=cmd_run)

    pb = sub.add_parser("probe", help="send the fidelity probes ([fidelity.probes]) pinned to each provider, compare "
                        "them with the reference provider and print a table (exit 0 ok, 1 a provider below the "
                        "thresholds)")
    pb.add_argument("config", help="path of config.toml")
    pb.add_argument("--run-dir", help="override [run] dir (the store that keeps the results)")
    pb.add_argument("--reference", help="override [fidelity.probes] reference")
    pb.set_defaults(func=cmd_probe)

    from engine.sim import add_sim_arguments

    s = sub.add_parser("sim", help="serve the OpenRouter-compatible simulator on 127.0.0.1")
    add_sim_arguments(s)
    s.set_defaults(func=cmd_sim)

    st = sub.add_parser("status", help="show a run's progress (works while it runs, from another shell)")
    st.add_argument("run_dir")
    st.add_argument("--json", action="store_true", help="machine-readable output")
    st.add_argument("--watch", action="store_true", help="refresh until the engine exits (or Ctrl-C)")
    st.add_argument("--interval", type=float, default=None, metavar="S", help="seconds between refreshes with --watch (default 2)")
    st.set_defaults(func=cmd_status)

    c = sub.add_parser("ctl", help="control a run from another shell: pause|resume|skip|abort [DATASET], "
                       "concurrency CLASS N, exclude-provider|include-provider|clear-verdict NAME, retry-failed [DATASET] "
                       "[--reason CLASS]; extraction: OUT_OR_RUN_DIR extract-pause|extract-resume|extract-skip DATASET; "
                       "exits 1 when not applied",
                       description="Exit status: 0 applied by the live engine, or saved for the next start "
                       "(pause/resume/skip DATASET, exclude/include-provider, clear-verdict, retry-failed); 1 refused or not applied "
                       "(no engine running for abort, concurrency and a run-wide pause/resume; not confirmed within "
                       "10 s).")
    c.add_argument("run_dir", help="the run directory (extract-*: the extraction output directory, or a run directory)")
    c.add_argument("verb", choices=["pause", "resume", "skip", "abort", "concurrency", "exclude-provider",
                                    "include-provider", "clear-verdict", "retry-failed", "extract-pause", "extract-resume",
                                    "extract-skip"])
    c.add_argument("dataset", nargs="?", help="dataset (or CLASS for concurrency, NAME for the provider verbs)")
    c.add_argument("value", nargs="?", help="N for concurrency")
    c.add_argument("--yes", action="store_true", help="confirm abort without asking")
    c.add_argument("--abort", action="store_true", help="with skip: cancel the dataset's in-flight requests too")
    c.add_argument("--force", action="store_true", help="with exclude-provider: a name this run has not seen yet")
    c.add_argument("--reason", metavar="CLASS", help="with retry-failed: only prompts that failed with this error "
                   "class (bad_request, forbidden, server, timeout, ...; `datagen status` lists them)")
    c.set_defaults(func=cmd_ctl)

    xt = sub.add_parser("extract", help="run the target model over the token records and save EAGLE-3 hidden states")
    xt.add_argument("config", nargs="?", help="path of config.toml (its [extract] section)")
    xt.add_argument("--headless", action="store_true", help="progress lines instead of the dashboard (default without a TTY)")
    xt.add_argument("--gpus", help="comma-separated GPU ids to use (default: all visible)")
    xt.add_argument("--workers", type=int, help="worker processes (default: GPUs // gpus_per_worker, 1 on CPU)")
    xt.add_argument("--data", help="a `tokens` Parquet export (dir or file) instead of the run directory")
    xt.add_argument("--free-bytes", type=int, help="assume this much free disk space (bytes) instead of asking the OS")
    xt.add_argument("--progress-s", type=float, default=5.0, help=argparse.SUPPRESS)
    xt.add_argument("--convert", metavar="OUT", help="rewrite the shards in OUT into another layout (no model run)")
    xt.add_argument("--to", choices=["speculators", "specforge", "modelopt"], help="with --convert: the layout to write")
    xt.add_argument("--convert-out", metavar="DIR", help="with --convert: destination (default OUT-<layout> beside OUT)")
    xt.add_argument("--model", help="with --convert --to speculators: model dir for the final norm (default: job.json's)")
    xt.add_argument("--delete-source", action="store_true", help="with --convert: delete each shard once converted")
    xt.add_argument("--draft-config", metavar="FILE", help="with --convert: the drafter's config JSON; refused unless its "
                    "eagle_aux_hidden_state_layer_ids are the output's aux layers")
    xt.set_defaults(func=cmd_extract)

    ex = sub.add_parser("export", help="export stored results (exit 0 exported, 1 nothing exported, 2 error)")
    ex.add_argument("run_dir")
    ex.add_argument("--format", choices=["raw", "specforge", "openai", "tokens", "tokens-jsonl"], default="raw",
                    help="raw JSONL (everything stored; the default), or validated records as specforge/openai JSONL, "
                    "tokens Parquet or tokens-jsonl (input_ids + loss_mask rows: SpecForge prompts_path, speculators "
                    "prepare-data)")
    ex.add_argument("--out", required=True, help="output directory")
    ex.add_argument("--config", help="config whose [tokenizer] validates results not validated yet (default: the run's)")
    ex.add_argument("--include-invalid", action="store_true", help="also export records that failed validation")
    ex.add_argument("--include-drifting", action="store_true", help="also export the records of providers judged "
                    "drifting (flagged provider_drift; docs/fidelity.md)")
    ex.add_argument("--force", action="store_true", help="specforge: also export rows SpecForge's own parser would "
                    "mis-train (reasoning dropped, a system prompt inserted, tool arguments re-serialised); without it "
                    "they are left out, or the export refused when that is every row (thinking models: use tokens-jsonl)")
    ex.set_defaults(func=cmd_export, error_exit=EXIT_ERROR)

    v = sub.add_parser("validate", help="rebuild token ids of every stored result and check them (re-run after a "
                       "tokenizer fix; exit 0 all valid, 1 some invalid, 2 error)")
    v.add_argument("run_dir")
    v.add_argument("--config", help="config with the [tokenizer] section (default: the one stored with the run)")
    v.add_argument("--json", action="store_true", help="machine-readable report")
    v.add_argument("--workers", type=int, default=None, help="worker processes (default [tokenizer] workers)")
    v.set_defaults(func=cmd_validate, error_exit=EXIT_ERROR)

    rp = sub.add_parser("report", help="write RUN_DIR's report, one self-contained HTML file with charts, to "
                        "DIR/report.html (exit 0 written, 2 error)")
    rp.add_argument("run_dir")
    rp.add_argument("--out", required=True, help="output directory")
    rp.add_argument("--config", help="config whose [spend] and classes the reservations are computed with "
                    "(default: the settings stored with the run)")
    rp.set_defaults(func=cmd_report, error_exit=EXIT_ERROR)

    sv = sub.add_parser("salvage", help="copy what SQLite can read of RUN_DIR's damaged store into a new store in "
                        "its place, keeping the damaged file (exit 0 salvaged, 1 nothing to salvage, 2 error)",
                        description="Rows SQLite cannot read are lost: results lost make their prompts pending "
                        "again (stored from RUN_DIR/journal when there, else bought again at the next run); lost "
                        "prompts are read again from the dataset files. Prints per table the rows saved and lost.")
    sv.add_argument("run_dir")
    sv.set_defaults(func=cmd_salvage, error_exit=SALVAGE_ERROR)

    mt = sub.add_parser("make-tokenizer", help="build the small Kimi-layout demo tokenizer into DIR, offline "
                        "(for the simulator: Kimi-K2.5's layout, not its vocabulary)")
    mt.add_argument("dir")
    mt.add_argument("--force", action="store_true", help="replace DIR when it exists")
    mt.set_defaults(func=cmd_make_tokenizer)
    return p
