"""Loading a ``config.toml``: TOML, validation, error messages naming the key, relative paths, file checks."""

from __future__ import annotations

import os
import tomllib
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from engine.config.base import ConfigError
from engine.config.datasets import DatasetSection, HubPath
from engine.config.extract import resolve_model
from engine.config.schema import Config


def _loc(loc: tuple[Any, ...], data: dict[str, Any]) -> str:
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        elif part in ("function-after", "function-before") or str(part).startswith(("function-", "literal[")):
            continue
        else:
            out += ("." if out else "") + str(part)
    return out or "(top level)"


def _format_errors(path: Path, err: ValidationError, data: dict[str, Any]) -> str:
    lines = [f"{path}: invalid configuration:"]
    for e in err.errors():
        key = _loc(e["loc"], data)
        kind = e["type"]
        if kind == "extra_forbidden":
            msg = "unknown key (check the spelling; see docs/configuration.md)"
        elif kind == "missing":
            msg = "required key is missing"
        else:
            msg = e["msg"].removeprefix("Value error, ")
            if "input" in e and kind not in ("value_error",) and not isinstance(e["input"], dict):
                msg += f" (got {e['input']!r})"
        lines.append(f"  {key}: {msg}")
    return "\n".join(lines)


def _resolve_paths(cfg: Config, base: Path) -> Config:
    def rel(p: Path | None) -> Path | None:
        if p is None:
            return None
        p = p.expanduser()
        return p if p.is_absolute() else (base / p)

    datasets = [d if isinstance(d.path, HubPath) else d.model_copy(update={"path": rel(d.path)}) for d in cfg.datasets]
    sim = cfg.provider.sim.model_copy(update={"tokenizer": rel(cfg.provider.sim.tokenizer), "log": rel(cfg.provider.sim.log)})
    provider = cfg.provider.model_copy(update={"sim": sim, "api_key_file": rel(cfg.provider.api_key_file)})
    run = cfg.run.model_copy(update={"dir": rel(cfg.run.dir)})
    ex = cfg.extract
    model = ex.model if ex.model is None else resolve_model(ex.model, [base, Path.cwd()])
    extract = ex.model_copy(update={"out_dir": rel(ex.out_dir), "model": model})
    probes = cfg.fidelity.probes.model_copy(update={"path": rel(cfg.fidelity.probes.path)})
    fidelity = cfg.fidelity.model_copy(update={"probes": probes})
    return cfg.model_copy(update={"datasets": datasets, "provider": provider, "run": run, "extract": extract,
                                  "fidelity": fidelity})


def _resolve_tokenizer(cfg: Config, base: Path) -> Config:
    """Resolve ``[tokenizer]`` paths: ``path`` when it exists next to the config or the kind is
    ``tiktoken`` (else a hub id), ``chat_template`` always."""
    t = cfg.tokenizer
    if t is None:
        return cfg
    p = Path(t.path).expanduser()
    local = (base / p).exists() or t.kind == "tiktoken"  # a tiktoken tokenizer is always a local directory
    path = str(p) if p.is_absolute() else (str(base / p) if local else t.path)
    tmpl = t.chat_template.expanduser() if t.chat_template else None
    if tmpl is not None and not tmpl.is_absolute():
        tmpl = base / tmpl
    return cfg.model_copy(update={"tokenizer": t.model_copy(update={"path": path, "chat_template": tmpl})})


def _dataset_problem(d: DatasetSection) -> str | None:
    """Why ``d.path`` names nothing to read (None when it does), without touching the network: a
    missing, non-regular or unreadable file; a compressed Parquet file, or a compressed file whose
    first bytes are not of its suffix's kind (also among a directory's or a glob's files); a
    directory without data files; a glob matching no data file; for ``hf://``, nothing unless
    ``HF_HUB_OFFLINE`` is set, then the cache must hold the revision. (Whether a compressed file's
    checks pass is known only once it is decompressed whole: at ingest, before any request.)"""
    hub = d.hub()
    if hub is not None:
        from engine.datasets import hub as hubs

        return hubs.check_cached(hub) if hubs.offline() else None
    from engine.datasets.compressed import start_problem
    from engine.datasets.sources import DatasetError, compressed_parquet, is_glob, local_shards

    p = d.path
    assert isinstance(p, Path)  # d.hub() is None: a local path
    try:
        if is_glob(p) and not p.exists() or p.is_dir():
            try:
                shards = local_shards(p)
            except DatasetError as e:
                return str(e)
        elif not p.exists():
            return f"file not found: {p}"
        elif not p.is_file():
            return f"not a file: {p}"
        elif not os.access(p, os.R_OK):
            return f"not readable: {p}"
        elif (why := compressed_parquet(str(p))) is not None:
            return why
        else:
            shards = local_shards(p)
        return next((why for s in shards if (why := start_problem(s.path, s.shown)) is not None), None)
    except OSError as e:  # e.g. a directory we may not search
        return f"cannot access {p}: {e.strerror}"


def parse_config(data: dict[str, Any], path: Path = Path("config.toml"), *, check_files: bool = True) -> Config:
    """Validate an already-parsed TOML mapping.

    Args:
        data: the TOML document as a dict.
        path: the file it came from (for messages and resolving relative paths).
        check_files: verify that every dataset ``path`` names something to read (a readable file, a
            directory with data files, a glob that matches); ``hf://`` paths are not checked (no network
            at validation) unless ``HF_HUB_OFFLINE`` is set, then the Hugging Face cache must hold them.

    Raises:
        ConfigError: naming ``path``, the key and what was expected.
    """
    try:
        cfg = Config.model_validate(data)
    except ValidationError as e:
        raise ConfigError(_format_errors(path, e, data)) from None
    cfg = _resolve_paths(cfg, path.parent)
    cfg = _resolve_tokenizer(cfg, path.parent)
    if check_files:
        problems = [f"  datasets[{i}].path ({d.name}): {why}" for i, d in enumerate(cfg.datasets)
                    if (why := _dataset_problem(d)) is not None]
        tok = cfg.provider.sim.tokenizer
        hint = "`datagen make-tokenizer DIR` builds the small demo tokenizer, as `make demo` does"
        if cfg.provider.kind == "simulated" and tok is not None and not tok.exists():
            problems.append(f"  provider.sim.tokenizer: not found: {tok} ({hint})")
        t = cfg.tokenizer
        if t is not None and t.kind == "tiktoken" and not Path(t.path).is_dir():
            problems.append(f"  tokenizer.path: not a directory: {t.path} (kind \"tiktoken\" needs a local directory; {hint})")
        if problems:
            raise ConfigError(f"{path}: invalid configuration:\n" + "\n".join(problems))
    return cfg


def load_config(path: str | Path, *, check_files: bool = True) -> Config:
    """Read and validate a ``config.toml``.

    Raises:
        ConfigError: file missing/unreadable, TOML syntax error (with line), or invalid values.
    """
    path = Path(path)
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        raise ConfigError(f"{path}: config file not found") from None
    except OSError as e:
        raise ConfigError(f"{path}: cannot read config file: {e.strerror}") from None
    try:
        data = tomllib.loads(raw.decode("utf-8"))
    except UnicodeDecodeError as e:
        raise ConfigError(f"{path}: config is not UTF-8 (byte {e.start})") from None
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"{path}: TOML syntax error: {e}") from None
    return parse_config(data, path.resolve(), check_files=check_files)
