"""The resolved extraction job: config ``[extract]`` + command-line overrides + the model's shape.

:class:`ExtractJob` is what every worker runs; the launcher writes it to ``out_dir/job.json`` and each
worker process reads it back, so all workers of one job plan identically.

Layer convention (docs/eagle3-data.md): ``aux_layers`` are 0-based decoder-layer OUTPUT indices. With
Hugging Face ``output_hidden_states`` the output of layer ``i`` is ``hidden_states[i + 1]``
(``hidden_states[0]`` is the embedding output) and ``hidden_states[L]`` is the final hidden state
AFTER the final norm (what the LM head reads), saved as ``last_hidden_state``.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from engine.config.extract import hub_id_form, resolve_model
from engine.errors import DatagenError

DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}
#: ``[extract] save_dtype = "fp8"``: bytes per stored element (``float8_e4m3fn``; plus one float32 scale per token).
FP8_BYTES = 1
#: SpecForge's usual EAGLE-3 draft vocabulary (its configs' ``draft_vocab_size``), capped at the target's.
DEFAULT_DRAFT_VOCAB = 32_000


class ExtractError(DatagenError):
    """The job cannot run (bad settings, missing model or input, not enough disk); message says why."""


class StartupError(ExtractError):
    """A worker's model or engine could not start (loading the weights, the config, vLLM's
    initialisation), before its first batch. Such an error is deterministic: the worker exits with
    :data:`STARTUP_EXIT` and the launcher does not restart it (a restart of Kimi-K2.5 on vLLM would
    reload ~595 GB only to fail the same way); a worker killed (SIGKILL, OOM) is restarted."""


#: The worker's exit status for a :class:`StartupError` (1 is any other failure).
STARTUP_EXIT = 3


#: How to install what extraction imports (torch, safetensors, accelerate, datasets): docs/commands.md "Installing".
EXTRACT_EXTRA = "pip install 'eagle-datagen[extract]'"


def require_extract_packages(what: str = "datagen extract", layout: str = "shards") -> None:
    """Refuse an extraction, before anything starts, when the packages of the ``extract`` extra are
    missing (a generation-only install: ``pip install eagle-datagen``). Looks them up without importing
    them (``importlib.util.find_spec``: the launcher stays light; the workers import them).

    Args:
        what: what needs them, for the message (``datagen extract``, ``[extract] after_run``...).
        layout: ``[extract] layout``; ``speculators`` also needs ``datasets``.

    Raises:
        ExtractError: naming the missing packages and the extra that brings them.
    """
    import importlib.util

    need = ["torch", "safetensors"] + (["datasets"] if layout == "speculators" else [])
    missing = []
    for name in need:
        try:
            if importlib.util.find_spec(name) is None:
                missing.append(name)
        except (ImportError, ValueError):  # a broken or blocked install
            missing.append(name)
    if missing:
        raise ExtractError(f"{what} needs {', '.join(missing)}, not installed here: install the extraction extra, "
                           f"{EXTRACT_EXTRA} (on a GPU host, the CUDA build of torch first)")


def default_aux_layers(num_layers: int) -> list[int]:
    """EAGLE-3 default aux layers for ``num_layers`` decoder layers: ``[1, L//2 - 1, L - 4]``.

    Raises:
        ExtractError: fewer than 4 layers (set ``aux_layers`` yourself).
    """
    if num_layers < 4:
        raise ExtractError(f"the model has {num_layers} layers; the default aux layers need >= 4: set [extract] aux_layers")
    return [1, num_layers // 2 - 1, num_layers - 4]


def check_aux_layers(aux: list[int], num_layers: int) -> list[int]:
    """Validate 0-based aux layer indices against ``num_layers``; returns them.

    Raises:
        ExtractError: an index outside ``0 .. L-2`` (``L-1``'s output is the final state, saved
            after the final norm as ``last_hidden_state``; Hugging Face overwrites it in
            ``hidden_states[L]``, so it cannot also be an aux layer).
    """
    bad = [i for i in aux if not 0 <= i <= num_layers - 2]
    if bad:
        raise ExtractError(
            f"aux_layers {aux}: {bad} outside 0..{num_layers - 2} (0-based layer outputs of a {num_layers}-layer "
            "model; the last layer's output is saved as last_hidden_state)")
    return list(aux)


@dataclass(frozen=True)
class ModelShape:
    """What planning needs from the model config: hidden size H, decoder layers L and (when the
    config says) the vocabulary size (SpecForge's vocabulary mapping is sized by it)."""

    hidden_size: int
    num_layers: int
    vocab_size: int | None = None


#: How a name that is no model directory was looked up (the end of :func:`check_model`'s message).
MODEL_RULE = ("relative names are resolved against the config file's directory, then the working directory; "
              "a hub id is ORG/NAME, and only when no directory ORG exists there")


def check_model(model: str) -> Path | None:
    """Decide, before any network, whether ``model`` (``[extract] model`` as the config loader
    resolved it, :func:`engine.config.extract.resolve_model`) is a local directory or a hub id.

    Returns:
        the local directory, or None for a hub id (in the Hugging Face cache when ``HF_HUB_OFFLINE``
        is set).

    Raises:
        ExtractError: no such directory (``extract.model: no such model directory: PATH (...)``), a
            file instead of a directory, or (offline) a hub id the cache does not hold.
    """
    name = resolve_model(model, [Path.cwd()])
    if name != model or not hub_id_form(model):  # a local path (also a relative one: against the cwd)
        path = Path(name)
        if not path.exists():
            raise ExtractError(f"extract.model: no such model directory: {path} ({MODEL_RULE})")
        if not path.is_dir():
            raise ExtractError(f"extract.model: {path} is a file, not a model directory")
        return path
    from engine.datasets import hub

    if hub.offline():
        from huggingface_hub import try_to_load_from_cache

        try:
            hit = try_to_load_from_cache(model, "config.json", cache_dir=hub.cache_dir())
        except ValueError as e:  # an id the Hub would refuse
            raise ExtractError(f"extract.model: {model!r} is not a valid hub id: {e}") from None
        if not isinstance(hit, str):
            raise ExtractError(f"extract.model: {model!r} is a hub id, but HF_HUB_OFFLINE is set and the Hugging Face "
                               f"cache ({hub.cache_dir()}) does not hold it: download it first (or unset "
                               "HF_HUB_OFFLINE), or name a local model directory")
    return None


def read_model_shape(model: str, trust_remote_code: bool = False) -> ModelShape:
    """Read H and L from the model's config (no weights loaded; ``text_config`` for multimodal ones).
    Whether ``model`` is a local directory or a hub id is decided first, without the network
    (:func:`check_model`): a typo fails at once, not after the Hub's retries.

    Raises:
        ExtractError: no such model directory (:func:`check_model`), or the config cannot be loaded
            or lacks ``hidden_size``/``num_hidden_layers``.
    """
    local_dir = check_model(model)
    path = local_dir if local_dir is not None else Path(model)
    local = path / "config.json"
    if local_dir is not None and local.is_file():  # fast path: no transformers import in the launcher
        try:
            d = json.loads(local.read_text())
            text = d.get("text_config") or d
            if isinstance(text.get("hidden_size"), int) and isinstance(text.get("num_hidden_layers"), int):
                v = text.get("vocab_size")
                return ModelShape(text["hidden_size"], text["num_hidden_layers"], v if isinstance(v, int) else None)
        except (OSError, ValueError, AttributeError):
            pass
    from transformers import AutoConfig

    try:
        cfg = AutoConfig.from_pretrained(str(path), trust_remote_code=trust_remote_code)
    except Exception as e:  # OSError, ValueError, remote-code errors...
        raise ExtractError(f"cannot load the config of model {model!r}: {e}") from None
    text = getattr(cfg, "text_config", None) or cfg
    h, n = getattr(text, "hidden_size", None), getattr(text, "num_hidden_layers", None)
    if not isinstance(h, int) or not isinstance(n, int):
        raise ExtractError(f"model {model!r}: config has no hidden_size/num_hidden_layers")
    v = getattr(text, "vocab_size", None)
    return ModelShape(h, n, v if isinstance(v, int) else None)


@dataclass(frozen=True)
class ExtractJob:
    """One extraction job, fully resolved (JSON-serialisable).

    Attributes:
        model: local path or hub id; dtype: torch dtype name (``bfloat16``/``float16``/``float32``).
        hidden_size / num_layers: H and L of the model; aux_layers: 0-based layer outputs.
        source_kind / source_path: ``parquet`` (a ``tokens`` export dir or file) or ``run_dir``.
        out_dir: output directory; max_tokens_per_batch: padded-token cap of one forward batch.
        max_seq_len / over_length: longest sample and what to do with longer ones.
        device: ``cuda`` or ``cpu``; gpus: physical GPU ids of the job; gpus_per_worker: per replica.
        workers: number of worker processes (world size when not under torchrun).
        disk_margin_bytes: bytes always kept free; free_bytes: stated free space (tests) or None.
        trust_remote_code: passed to transformers.
        layout: output layout, ``shards`` | ``speculators`` | ``specforge`` | ``modelopt``
            (:mod:`engine.extract.layouts`).
        save_dtype: ``model`` (the states in ``dtype``) or ``fp8`` (``float8_e4m3fn`` + one float32
            scale per token, :mod:`engine.extract.layouts.base`); vocab_size: the target's vocabulary
            (from its config; None: unknown); draft_vocab_size / compress / compression_level: the
            ``specforge`` layout's vocabulary mapping and gzip (``[extract]``).
        datasets: only these datasets' samples are extracted (None: all); chained extraction
            (:mod:`engine.run.chain`) passes the datasets whose generation is done and validated.
        engine: ``transformers`` or ``vllm`` (:mod:`engine.extract.vllm`); vllm: the ``vllm.LLM``
            keyword arguments from ``[extract.vllm]``.
        fidelity: score each record's completion under the target (``[extract] fidelity``,
            :mod:`engine.extract.fidelity`); temperature / top_p: what records that do not say were
            bought with (the run's ``[generation]``, ``extra_body`` included; None: 1.0);
            skip_token_ids: token ids never scored (the ``[tokenizer]``'s special tokens and
            ``[extract] unscored_token_ids``; None: the model directory's, read by the worker);
            unscored_token_ids: ``[extract] unscored_token_ids`` (added to the model directory's too).
    """

    model: str
    dtype: str
    hidden_size: int
    num_layers: int
    aux_layers: tuple[int, ...]
    source_kind: str
    source_path: str
    out_dir: str
    max_tokens_per_batch: int = 16_384
    max_seq_len: int | None = None
    over_length: str = "skip"
    device: str = "cpu"
    gpus: tuple[int, ...] = ()
    gpus_per_worker: int = 1
    workers: int = 1
    disk_margin_bytes: int = 10 * 10**9
    free_bytes: int | None = None
    trust_remote_code: bool = False
    layout: str = "shards"
    datasets: tuple[str, ...] | None = None
    engine: str = "transformers"
    vllm: dict[str, Any] = field(default_factory=dict)
    save_dtype: str = "model"
    vocab_size: int | None = None
    draft_vocab_size: int | None = None
    compress: bool = False
    compression_level: int = 6
    fidelity: bool = True
    temperature: float | None = None
    top_p: float | None = None
    skip_token_ids: tuple[int, ...] | None = None
    unscored_token_ids: tuple[int, ...] = ()

    @property
    def dtype_bytes(self) -> int:
        """Bytes per saved hidden-state element (1 with ``save_dtype = "fp8"``, else the model dtype's)."""
        return FP8_BYTES if self.save_dtype == "fp8" else DTYPE_BYTES[self.dtype]

    @property
    def draft_layer_ids(self) -> list[int]:
        """The aux layers as the layout's trainer numbers them in a draft config's
        ``eagle_aux_hidden_state_layer_ids`` (:func:`trainer_layer_ids`)."""
        return trainer_layer_ids(self.layout, self.aux_layers)

    def layout_options(self) -> dict[str, Any]:
        """The keyword options of :func:`engine.extract.layouts.make_layout` for this job."""
        return {"save_dtype": self.save_dtype, "vocab_size": self.vocab_size, "draft_vocab_size": self.draft_vocab_size,
                "compress": self.compress, "compression_level": self.compression_level, "num_layers": self.num_layers}

    def gpu_group(self, local_rank: int) -> tuple[int, ...]:
        """Physical GPU ids of worker ``local_rank`` on this host (empty on CPU)."""
        if self.device != "cuda":
            return ()
        g = self.gpus_per_worker
        group = self.gpus[local_rank * g:(local_rank + 1) * g]
        if len(group) != g:
            raise ExtractError(f"worker {local_rank} needs {g} GPU(s) but only {list(self.gpus)} are available")
        return group

    def to_json(self) -> str:
        """The job as JSON (read back with :meth:`from_json`), with ``eagle_aux_hidden_state_layer_ids``:
        the aux layers as the layout's trainer numbers them (:attr:`draft_layer_ids`), the value a
        draft config must hold (``datagen extract --convert --draft-config`` checks it)."""
        return json.dumps({**asdict(self), "eagle_aux_hidden_state_layer_ids": self.draft_layer_ids}, indent=1)

    @classmethod
    def from_json(cls, text: str) -> "ExtractJob":
        d = json.loads(text)
        d.pop("eagle_aux_hidden_state_layer_ids", None)  # derived (to_json)
        d["aux_layers"] = tuple(d["aux_layers"])
        d["gpus"] = tuple(d["gpus"])
        if d.get("datasets") is not None:
            d["datasets"] = tuple(d["datasets"])
        if d.get("skip_token_ids") is not None:
            d["skip_token_ids"] = tuple(d["skip_token_ids"])
        if d.get("unscored_token_ids") is not None:
            d["unscored_token_ids"] = tuple(d["unscored_token_ids"])
        return cls(**d)

    def save(self, path: Path) -> None:
        """Write the job atomically to ``path``.

        Raises:
            ExtractError: ``path`` already holds the job of samples saved beside it (a non-empty
                manifest) with other aux layers, layout, hidden size or save dtype
                (:func:`check_same_output`): the two jobs' files would be mixed.
        """
        check_same_output(Path(path), self)
        tmp = Path(f"{path}.{os.getpid()}.tmp")
        tmp.write_text(self.to_json())
        os.replace(tmp, path)

    def with_(self, **kw: Any) -> "ExtractJob":
        return replace(self, **kw)


def trainer_layer_ids(layout: str, aux_layers: Any) -> list[int]:
    """``aux_layers`` (0-based layer OUTPUT indices) as ``layout``'s trainer numbers them in its draft
    config's ``eagle_aux_hidden_state_layer_ids``: speculators counts hidden states (id ``k`` = output
    of layer ``k - 1``: ``aux + 1``); SpecForge (``eagle_config.eagle_aux_hidden_state_layer_ids``),
    Model-Optimizer and this project's shards use the 0-based layer ids themselves."""
    return [int(i) + 1 for i in aux_layers] if layout == "speculators" else [int(i) for i in aux_layers]


#: What must agree between a ``job.json`` and a new job writing beside its samples.
SAME_OUTPUT_FIELDS = ("layout", "aux_layers", "hidden_size", "save_dtype")


def check_same_output(path: Path, job: "ExtractJob") -> None:
    """Refuse to replace the job file ``path`` (``OUT/job.json``) when the samples already listed in
    ``OUT/manifest.jsonl`` were saved by a job with other :data:`SAME_OUTPUT_FIELDS`.

    Raises:
        ExtractError: naming each field that differs.
    """
    try:
        old = json.loads(Path(path).read_text())
        listed = (Path(path).parent / "manifest.jsonl").stat().st_size > 0
    except (OSError, ValueError):
        return
    if not listed or not isinstance(old, dict):
        return
    new = asdict(job)
    diff = []
    for k in SAME_OUTPUT_FIELDS:
        a, b = old.get(k, {"save_dtype": "model", "layout": "shards"}.get(k)), new[k]  # defaults of older job files
        if k == "aux_layers":
            a, b = list(a or []), list(b)
        if a != b:
            diff.append(f"{k} {a!r} there, {b!r} now")
    if diff:
        raise ExtractError(f"{Path(path).parent}: its samples were saved with other settings ({'; '.join(diff)}): "
                           "the files would mix two jobs' hidden states; use another out_dir (or remove that output)")


def visible_gpus() -> list[int]:
    """Physical ids of the CUDA GPUs torch can use (``[]`` without CUDA)."""
    try:
        import torch

        if not torch.cuda.is_available():
            return []
        n = torch.cuda.device_count()
    except Exception:  # a broken CUDA install counts as no GPU
        return []
    env = os.environ.get("CUDA_VISIBLE_DEVICES")
    if env:
        ids = [x.strip() for x in env.split(",") if x.strip()]
        if all(x.isdigit() for x in ids):
            return [int(x) for x in ids[:n]]
    return list(range(n))


def resolve_job(cfg: Any, *, data: Path | None = None, gpus: list[int] | None = None, workers: int | None = None,
                free_bytes: int | None = None, device: str | None = None, shape: ModelShape | None = None,
                datasets: list[str] | tuple[str, ...] | None = None) -> ExtractJob:
    """Build the job from a loaded :class:`engine.config.Config` and command-line overrides.

    Args:
        cfg: the validated config (its ``extract`` and ``run`` sections are used).
        data: a ``tokens`` Parquet export (dir or file) instead of the run directory.
        gpus: physical GPU ids to use (default all visible); ``device="cpu"`` forces CPU.
        workers: number of workers (default: GPUs // gpus_per_worker, or 1 on CPU).
        free_bytes: state the free space in bytes instead of asking the file system (tests).
        shape: the model's H and L (default: read from the model config).
        datasets: extract only these datasets (None: all); each must be one of the config's.

    Raises:
        ExtractError: no model set, aux layers invalid, too few GPUs for one worker, bad input path,
            a dataset in ``datasets`` that the config does not name; torch (the ``extract`` extra)
            not installed (:func:`require_extract_packages`).
    """
    ex = cfg.extract
    require_extract_packages(layout=ex.layout)
    if datasets is not None:
        names = [d.name for d in cfg.datasets]
        unknown = [d for d in datasets if d not in names]
        if unknown:
            raise ExtractError(f"datasets {unknown} not in the config's [[datasets]] ({', '.join(names)})")
    if not ex.model:
        raise ExtractError("[extract] model is not set (a local model directory or a hub id)")
    shape = shape or read_model_shape(ex.model, ex.trust_remote_code)
    aux = check_aux_layers(ex.aux_layers if ex.aux_layers is not None else default_aux_layers(shape.num_layers),
                           shape.num_layers)
    if device is None:
        avail = visible_gpus()
        if gpus is not None:
            missing = [g for g in gpus if g not in avail]
            if missing:
                raise ExtractError(f"--gpus {gpus}: GPU(s) {missing} not visible (visible: {avail or 'none'})")
            avail = list(gpus)
        device = "cuda" if avail else "cpu"
    else:
        avail = list(gpus or []) if device == "cuda" else []
    if device == "cuda":
        groups = len(avail) // ex.gpus_per_worker
        if groups < 1:
            raise ExtractError(f"gpus_per_worker = {ex.gpus_per_worker} but only {len(avail)} GPU(s): {avail}")
        n = workers or ex.workers or groups
        if n > groups:
            raise ExtractError(f"{n} workers x {ex.gpus_per_worker} GPU(s) need {n * ex.gpus_per_worker} GPUs; have {avail}")
    else:
        n = workers or ex.workers or 1
    dtype = ex.dtype if ex.dtype != "auto" else ("bfloat16" if device == "cuda" else "float32")
    if data is not None:
        kind, src = "parquet", Path(data).resolve()
        if not src.exists():
            raise ExtractError(f"--data {data}: not found")
    else:
        kind, src = "run_dir", Path(cfg.run.dir)
    out = Path(ex.out_dir) if ex.out_dir is not None else Path(cfg.run.dir) / "extract"
    vllm_kw = ex.vllm.llm_kwargs() if ex.engine == "vllm" else {}
    if ex.engine == "vllm" and device == "cuda":
        per = vllm_kw.get("tensor_parallel_size", 1) * vllm_kw.get("pipeline_parallel_size", 1)
        if per != ex.gpus_per_worker:
            raise ExtractError(f"[extract.vllm] tensor_parallel_size x pipeline_parallel_size = {per} but [extract] "
                               f"gpus_per_worker = {ex.gpus_per_worker}: one vLLM replica runs on each worker's GPUs")
    return ExtractJob(
        model=ex.model, dtype=dtype, hidden_size=shape.hidden_size, num_layers=shape.num_layers,
        aux_layers=tuple(aux), source_kind=kind, source_path=str(src), out_dir=str(out.resolve()),
        max_tokens_per_batch=ex.max_tokens_per_batch, max_seq_len=ex.max_seq_len, over_length=ex.over_length,
        device=device, gpus=tuple(avail), gpus_per_worker=ex.gpus_per_worker, workers=n,
        disk_margin_bytes=int(ex.disk_margin_gb * 1e9), free_bytes=free_bytes, trust_remote_code=ex.trust_remote_code,
        layout=ex.layout, datasets=tuple(datasets) if datasets is not None else None,
        engine=ex.engine, vllm=vllm_kw, save_dtype=ex.save_dtype, vocab_size=shape.vocab_size,
        draft_vocab_size=_draft_vocab(ex.draft_vocab_size, shape.vocab_size) if ex.layout == "specforge" else None,
        compress=ex.compress, compression_level=ex.compression_level, **_fidelity_fields(cfg),
    )


def _fidelity_fields(cfg: Any) -> dict[str, Any]:
    """The job's fidelity fields from the config: ``[extract] fidelity``, the ``[generation]`` temperature
    and top_p requests were sent with (``extra_body`` wins, as in the request body) and the
    ``[tokenizer]``'s special-token ids (None without a loadable tokenizer: the worker reads the model's)."""
    if not getattr(cfg.extract, "fidelity", True):
        return {"fidelity": False}
    g = cfg.generation
    extra = g.extra_body or {}
    temp, top_p = extra.get("temperature", g.temperature), extra.get("top_p", g.top_p)
    from engine.extract.specials import tokenizer_special_ids

    ids = tokenizer_special_ids(getattr(cfg, "tokenizer", None))
    extra_ids = {int(i) for i in getattr(cfg.extract, "unscored_token_ids", None) or ()}
    return {"fidelity": True, "temperature": None if temp is None else float(temp),
            "top_p": None if top_p is None else float(top_p),
            "skip_token_ids": None if ids is None else tuple(sorted(set(ids) | extra_ids)),
            "unscored_token_ids": tuple(sorted(extra_ids))}


def _draft_vocab(configured: int | None, vocab: int | None) -> int | None:
    """``[extract] draft_vocab_size`` checked against the target's vocabulary, or the default
    ``min(DEFAULT_DRAFT_VOCAB, vocab)`` (None when the vocabulary is unknown).

    Raises:
        ExtractError: a draft vocabulary larger than the target's (SpecForge refuses it too).
    """
    if configured is None:
        return min(DEFAULT_DRAFT_VOCAB, vocab) if vocab else None
    if vocab is not None and configured > vocab:
        raise ExtractError(f"[extract] draft_vocab_size = {configured} exceeds the target's vocab_size {vocab}")
    return configured
