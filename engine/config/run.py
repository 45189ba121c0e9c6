"""``[run]``, ``[generation]`` and ``[classes.NAME]``: the run's bookkeeping and the shape of each request."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import Field

from engine.config.base import _Strict


class RunSection(_Strict):
    """``[run]``: identity and bookkeeping of one run.

    Attributes:
        name: run name shown in status and the dashboard.
        dir: run directory holding ``store.sqlite``, logs and exports (created owner-only).
        progress_interval_s: seconds between headless progress lines.
        commit_interval_s: upper bound on seconds between store commits (results are never lost
            to a crash older than this window).
        max_attempts: attempts per prompt (first try + retries) before it is failed.
        drain_timeout_s: on quit/SIGTERM/SIGINT/SIGHUP, seconds to let in-flight requests finish
            before aborting them; ``"auto"`` (default): ``provider.timeouts.total_s``, the requests'
            own bound, so a drain never cuts a stream that could still finish.
        metrics_port: TCP port of the Prometheus endpoint (``GET /metrics``, README "Metrics
            (Prometheus)") served by ``datagen run`` and ``datagen extract``; None (default): none;
            0: an ephemeral port (printed at start).
        metrics_host: address the endpoint listens on (default ``127.0.0.1``: this host only).
        stream_workers: processes that hold the HTTP streams (connections, SSE parsing, assembly;
            :mod:`engine.stream`), each on its own core; None (default): one per core beyond the
            first, at least 1 (:func:`engine.stream.pool.default_stream_workers`). The first core
            runs the control plane and the dashboard.
    """

    name: str = "run"
    dir: Path = Path("runs/run")
    progress_interval_s: float = Field(5.0, gt=0)
    commit_interval_s: float = Field(1.0, gt=0, le=10)
    max_attempts: int = Field(6, ge=1, le=100)
    drain_timeout_s: Annotated[float, Field(ge=0)] | Literal["auto"] = "auto"
    metrics_port: int | None = Field(None, ge=0, le=65535)
    metrics_host: str = Field("127.0.0.1", min_length=1)
    stream_workers: int | None = Field(None, ge=1, le=256)


class GenerationSection(_Strict):
    """``[generation]``: sampling fields sent with every request.

    ``reasoning`` is OpenRouter's reasoning object (``{effort = "high"}`` or ``{max_tokens = N}``,
    ``exclude``, ``enabled``); ``extra_body`` is merged into the request body last.
    """

    temperature: float | None = Field(1.0, ge=0, le=2)
    top_p: float | None = Field(0.95, gt=0, le=1)
    seed: int | None = None
    reasoning: dict[str, Any] | None = None
    extra_body: dict[str, Any] = Field(default_factory=dict)


class ClassSection(_Strict):
    """``[classes.NAME]``: a request class with its own concurrency and completion cap.

    A prompt belongs to the class that lists its dataset in ``datasets``; otherwise to the class
    with the largest ``min_prompt_tokens`` not above the prompt's estimated tokens.

    Attributes:
        max_tokens: completion cap per request (tokens), always sent.
        concurrency: requests of this class in flight at once.
        min_prompt_tokens: smallest estimated prompt length (tokens) of this class.
        datasets: dataset names that always belong to this class.
    """

    max_tokens: int = Field(ge=1)
    concurrency: int = Field(ge=1, le=100_000)
    min_prompt_tokens: int = Field(0, ge=0)
    datasets: list[str] = Field(default_factory=list)
