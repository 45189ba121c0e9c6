"""The engine's public face: everything the dashboard (``tui/``) takes from the engine, and nothing else.

``tui`` imports this module only (the ``tui-uses-api`` contract in ``pyproject.toml``); the engine never
imports it (it is the engine's top layer). Each name is a re-export of the engine object that defines it,
or a thin function over one; the engine's own modules keep the definitions and their documentation.

Snapshots (immutable; what the dashboard draws)
    :class:`RunSnapshot` and its parts (:class:`DatasetSnapshot`, :class:`ClassSnapshot`,
    :class:`SampleSnapshot`, :class:`EndpointSnapshot`, :class:`ProviderSnapshot`); the extraction's
    :class:`ExtractSnapshot` (:class:`DatasetExtractView`, :class:`WorkerView`, :class:`GpuRow`,
    :class:`JobState`, :class:`WorkerState`, :data:`FINAL_JOB_STATES`); the GPUs' :class:`GpuReading`
    (:class:`GpuSnapshot`, read by a :class:`GpuPoller` thread).

Commands (what the dashboard sends)
    :class:`RunCommand` values, applied to a :class:`Controller` (or any command target) by
    :func:`apply_command`, answered with a :class:`CommandResult`; the extraction's
    :class:`ExtractCommands` (its control file refuses with :class:`ControlError`).

Config
    :class:`Config`, :func:`load_config` (a TOML file), :func:`parse_config` (a parsed document).

Running the engine
    A generation run: :func:`prepare_job` then :func:`run_job` (a :class:`Job`: its controller, its
    store; its :class:`Scheduler` for tests of the engine itself). Chained extraction:
    :class:`ExtractChain` and :func:`combined_exit_code`; a standalone one: :class:`ExtractRun`. The
    Prometheus endpoint: :func:`open_metrics`, :func:`start_metrics` (a :class:`MetricsServer`).
    Signals: :func:`interrupt_action` (the one rule of the headless runner and the dashboard).

Formatting helpers (the headless lines and the dashboard say the same)
    :func:`fmt_count`, :func:`fmt_duration`, :func:`fmt_bytes`, :func:`fmt_limit`, :func:`range_text`,
    :func:`progress_percent`, :func:`final_report`, :data:`FAILING` (the record flags kept out of training);
    while paused or draining: :func:`ends_text`, :func:`abort_at_end_text`, :func:`abort_hint`.
"""

from __future__ import annotations

import sys

from engine.client.conformance import FAILING
from engine.client.endpoints import EndpointSnapshot
from engine.config import Config, load_config, parse_config
from engine.extract.control import ControlError
from engine.extract.disk import fmt_bytes
from engine.extract.gpu import GpuPoller, GpuReading, GpuSnapshot
from engine.extract.run import ExtractRun
from engine.extract.snapshot import (
    FINAL_JOB_STATES,
    DatasetExtractView,
    ExtractCommands,
    ExtractSnapshot,
    GpuRow,
    JobState,
    WorkerState,
    WorkerView,
)
from engine.metrics.rates import fmt_count, fmt_duration
from engine.metrics.stats import ProviderSnapshot
from engine.money.projection import range_text
from engine.report.metricsserver import MetricsServer, open_metrics, start_metrics
from engine.report.progress import abort_at_end_text, abort_hint, ends_text, final_report
from engine.report.snapshot import ClassSnapshot, DatasetSnapshot, RunSnapshot, SampleSnapshot, progress_percent
from engine.run import runner as _runner
from engine.run.chain import ExtractChain, combined_exit_code
from engine.run.commands import CommandResult, RunCommand
from engine.run.commands import apply as apply_command
from engine.run.controller import Controller
from engine.run.headless import fmt_limit, interrupt_action
from engine.run.runner import Job
from engine.run.scheduler import Scheduler
from engine.run.seams import TextOut


async def prepare_job(cfg: Config, out: TextOut = sys.stdout) -> Job:
    """Prepare ``cfg``'s generation run (:func:`engine.run.runner.prepare`): open the store, load the
    datasets and the tokenizer, build the scheduler; progress lines go to ``out``.

    Raises:
        What ``prepare`` raises (ConfigError, DatasetError, StoreError, DirectoryInUse...).
    """
    return await _runner.prepare(cfg, out)


async def run_job(job: Job, *, exit_on_pause: bool = False, out: TextOut = sys.stdout) -> int:
    """Run a prepared ``job`` to its end and close it (:func:`engine.run.runner.run_job`: writer,
    supervisor, scheduler); returns the exit code (docs/commands.md, "Every command").

    Args:
        exit_on_pause: end the run (drained) when a guard pauses it (exit 2 for a rejected key, else 3).
        out: where the run's own lines go (a guard's pause).
    """
    return await _runner.run_job(job, exit_on_pause=exit_on_pause, out=out)


__all__ = [
    # snapshots
    "ClassSnapshot", "DatasetExtractView", "DatasetSnapshot", "EndpointSnapshot", "ExtractSnapshot",
    "FINAL_JOB_STATES", "GpuPoller", "GpuReading", "GpuRow", "GpuSnapshot", "JobState", "ProviderSnapshot",
    "RunSnapshot", "SampleSnapshot", "WorkerState", "WorkerView",
    # commands
    "CommandResult", "ControlError", "Controller", "ExtractCommands", "RunCommand", "apply_command",
    # config
    "Config", "load_config", "parse_config",
    # running the engine
    "ExtractChain", "ExtractRun", "Job", "MetricsServer", "Scheduler", "combined_exit_code", "interrupt_action",
    "open_metrics", "prepare_job", "run_job", "start_metrics",
    # formatting helpers
    "FAILING", "abort_at_end_text", "abort_hint", "ends_text", "final_report", "fmt_bytes", "fmt_count",
    "fmt_duration", "fmt_limit", "progress_percent",
    "range_text",
]
