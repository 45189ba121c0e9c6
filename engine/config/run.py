"""``[run]``, ``[generation]`` and ``[classes.NAME]``: the run's bookkeeping and the shape of each request."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import Field

from engine.config.base import _Strict


class RunSection(_Strict):
    """``[run]``: identity and bookkeeping of one run. Each field's ``description`` says what it does
    (docs/configuration.md is generated from them: ``make docs``)."""

    name: str = Field("run", description="run name shown in status and the dashboard")
    dir: Path = Field(Path("runs/run"), description=(
        "run directory: `store.sqlite` (SQLite, WAL), `datagen.log`, the stream workers' journals; created "
        "owner-only (0700, its database files 0600)"))
    progress_interval_s: float = Field(5.0, gt=0, description="seconds between headless progress lines")
    commit_interval_s: float = Field(1.0, gt=0, le=10, description=(
        "max seconds between store commits (results are never lost to a crash older than this window)"))
    max_attempts: int = Field(6, ge=1, le=100, description="attempts per prompt (first try + retries) before it fails")
    drain_timeout_s: Annotated[float, Field(ge=0)] | Literal["auto"] = Field("auto", description=(
        'on Ctrl-C/SIGTERM/SIGHUP or "Drain, then quit", seconds to let in-flight requests finish before aborting '
        'the rest (a second signal aborts at once); `"auto"` = `provider.timeouts.total_s`, the requests\' own '
        "bound, so no stream that could still finish is cut"))
    metrics_port: int | None = Field(None, ge=0, le=65535, description=(
        "TCP port of the Prometheus endpoint (`GET /metrics`) of `datagen run` and `datagen extract` "
        "([metrics.md](metrics.md)); unset: none; 0: a free port, printed at start"))
    metrics_host: str = Field("127.0.0.1", min_length=1, description=(
        'address the endpoint listens on (this host only by default; `"0.0.0.0"` for every interface)'))
    stream_workers: int | None = Field(None, ge=1, le=256, json_schema_extra={
        "doc_default": "one per core beyond the first, at least 1"}, description=(
        "processes that hold the HTTP streams (connections, SSE parsing, stream assembly; `engine/stream/`), each "
        "with its own event loop, each on its own core; the first core keeps the control plane and the dashboard. "
        "Shown in the header (`workers N`) and `datagen status --json` (`stream_workers`: configured, alive, "
        "restarts, requests returned by a worker's death, completions recovered from its journal, requests held "
        "back unsent by a pause, skip or stop (`held_back`, `unsent_peak`), per-worker pid, in flight and unsent). "
        "The workers stream the chat-completions POST over aiohttp (`engine/client/aiostream.py`; about half the "
        "CPU per stream of httpx, [benchmarks](benchmarks.md#b1-cpu-per-request-issue-37)); the environment "
        "variable `DATAGEN_STREAM_HTTP=httpx` makes them use httpx (the same failure classes, SSE parser, "
        "accumulator and pause gate; also used with a SOCKS proxy in the environment); any other value than "
        "`aiohttp`/`httpx` stops the run at start with one `error:` line"))
    cross_dataset_duplicates: Literal["buy_once", "buy_each"] = Field("buy_once", description=(
        'a prompt found in several datasets (the same request: messages, tools and its class\'s `max_tokens`): '
        '`"buy_once"` buys it once, under the dataset that stored it first (config order at the first ingest; a '
        "copy already bought wins), and records the other copies as duplicates (`dup`: never sent, not counted in that dataset's "
        "prompts, exported once, under the dataset that bought it); `\"buy_each\"` buys it in each dataset on "
        "purpose (another sample of the same request per dataset). Ingest prints one line per pair of datasets "
        "that share prompts, either way; a restart or a dataset added later never buys a duplicate again "
        "([datasets.md](datasets.md#a-prompt-in-several-datasets))"))


class GenerationSection(_Strict):
    """``[generation]``: sampling fields sent with every request."""

    temperature: float | None = Field(1.0, ge=0, le=2, description="sampling temperature")
    top_p: float | None = Field(0.95, gt=0, le=1, description="nucleus sampling")
    seed: int | None = Field(None, description="sampling seed, sent when set")
    reasoning: dict[str, Any] | None = Field(None, description=(
        "OpenRouter's reasoning object, e.g. `{ effort = \"high\" }` or `{ max_tokens = 8000 }` (also `exclude`, "
        "`enabled`)"))
    extra_body: dict[str, Any] = Field(default_factory=dict, description="merged into every request body, last")


class ClassSection(_Strict):
    """``[classes.NAME]``: a request class with its own concurrency and completion cap.

    A prompt belongs to the class that lists its dataset in ``datasets``; otherwise to the class
    with the largest ``min_prompt_tokens`` not above the prompt's estimated tokens.
    """

    max_tokens: int = Field(ge=1, description="completion cap per request (tokens), always sent")
    concurrency: int = Field(ge=1, le=100_000, description=(
        "requests of this class in flight at once (changed live with `datagen ctl RUN_DIR concurrency CLASS N` or "
        "the dashboard's `+`/`-`)"))
    min_prompt_tokens: int = Field(0, ge=0, description=(
        "smallest estimated prompt length (tokens) of this class: a prompt goes to the class with the largest "
        "`min_prompt_tokens` not above its estimated length, characters / 4 + 4 per message"))
    datasets: list[str] = Field(default_factory=list, description="dataset names that always use this class")
