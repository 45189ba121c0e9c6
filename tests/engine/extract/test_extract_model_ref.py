"""``[extract] model``: local directory or hub id, decided before any network (trial finding).

Before: a typo in a bare relative name (``tiny-modle``) or a ``DIR/NAME`` one (``runs/tinyy``) went to
the Hugging Face Hub, waited through its retries (~27 s) and failed with "We couldn't connect to
'https://huggingface.co'". Now a name is a hub id only if it is ``ORG/NAME`` and no directory ``ORG``
exists beside the config (or in the working directory); anything else that does not exist is refused
at once, and with ``HF_HUB_OFFLINE=1`` a hub id the cache lacks is refused at once too. The Hub here
is :mod:`fakehub` on loopback, which logs every request.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from fakehub import FakeHub

from engine.config import parse_config
from engine.config.extract import hub_id_form, resolve_model
from engine.extract.job import ExtractError, check_model

REPO = Path(__file__).resolve().parents[3]


def test_resolve_model_decides_local_or_hub_without_the_network(tmp_path: Path, monkeypatch) -> None:
    cfg_dir, cwd = tmp_path / "cfg", tmp_path / "cwd"
    for d in (cfg_dir / "runs" / "tiny", cfg_dir / "models", cwd / "here" / "m"):
        d.mkdir(parents=True)
    monkeypatch.chdir(cwd)
    bases = [cfg_dir, cwd]
    assert resolve_model("runs/tiny", bases) == str(cfg_dir / "runs" / "tiny")  # exists beside the config
    assert resolve_model("here/m", bases) == str(cwd / "here" / "m")  # exists only in the working directory
    assert resolve_model("Org/Name", bases) == "Org/Name"  # a hub id
    assert resolve_model("deepseek-ai/DeepSeek-V3.1", bases) == "deepseek-ai/DeepSeek-V3.1"
    # not hub ids: a bare name, ./ or ../, more than one slash, an ORG that is a local directory
    for name in ("tiny-modle", "./models/tiny", "../x/y", "a/b/c", "runs/tinyy", "models/tiny-modle", "here/nope"):
        got = Path(resolve_model(name, bases))
        assert got.is_absolute() and not got.exists(), name
    assert resolve_model("runs/tinyy", bases) == str(cfg_dir / "runs" / "tinyy")
    assert resolve_model("here/nope", bases) == str(cwd / "here" / "nope")  # where its `here` is
    assert resolve_model(str(tmp_path / "abs"), bases) == str(tmp_path / "abs")
    assert [hub_id_form(s) for s in ("a/b", "a-b_c.d/E.f-1", "/a/b", "./a", "a/b/c", "a", "a/..", "~/a")] == [
        True, True, False, False, False, False, False, False]
    # through the loader: the config's directory is the first base
    cfg = parse_config({"datasets": [{"name": "a", "path": "a.jsonl"}], "extract": {"model": "runs/tinyy"}},
                       cfg_dir / "config.toml", check_files=False)
    assert cfg.extract.model == str(cfg_dir / "runs" / "tinyy")
    with pytest.raises(ExtractError, match=r"^extract.model: no such model directory: .*/cfg/runs/tinyy \(.*a hub id is ORG/NAME"):
        check_model(cfg.extract.model)
    (cfg_dir / "file").write_text("x")
    with pytest.raises(ExtractError, match="is a file, not a model directory"):
        check_model(str(cfg_dir / "file"))
    assert check_model(str(cfg_dir / "runs" / "tiny")) == cfg_dir / "runs" / "tiny"


def _extract(cfg: Path, env: dict[str, str]) -> tuple[subprocess.CompletedProcess, float]:
    """``datagen extract CFG`` run from the directory above the config's (as ``datagen extract runs/busy.toml``)."""
    t0 = time.monotonic()
    env = {**env, "PYTHONPATH": os.pathsep.join([str(REPO), *filter(None, [env.get("PYTHONPATH")])])}
    p = subprocess.run([sys.executable, "-m", "datagen", "extract", str(cfg.relative_to(cfg.parent.parent)),
                        "--headless"], cwd=cfg.parent.parent, env=env, capture_output=True, text=True, timeout=120)
    return p, time.monotonic() - t0


def test_datagen_extract_refuses_a_typo_at_once_and_sends_nothing(tmp_path: Path) -> None:
    (tmp_path / "runs").mkdir()
    env = {k: v for k, v in os.environ.items() if k not in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")}
    env["HF_HUB_CACHE"] = str(tmp_path / "hub-cache")
    with FakeHub() as hub:
        env["HF_ENDPOINT"] = hub.endpoint
        for name in ("tiny-modle", "runs/tinyy", "./models/tiny-modle"):
            cfg = tmp_path / "runs" / "busy.toml"  # a config in a subdirectory: names resolve against it
            cfg.write_text(f'[run]\ndir = "r"\n[[datasets]]\nname = "a"\npath = "a.jsonl"\n'
                           f'[extract]\nmodel = {json.dumps(name)}\n')
            p, took = _extract(cfg, env)
            # beside the config, except `runs/...`: its `runs` is the working directory's
            where = tmp_path / name if name.startswith("runs/") else tmp_path / "runs" / name
            assert p.returncode == 1 and f"error: extract.model: no such model directory: {where} (" in p.stderr, p.stderr
            assert "huggingface" not in p.stderr.lower() and "Retrying" not in p.stderr and took < 20, (took, p.stderr)
        assert hub.requests == []  # nothing went to the Hub
        # a real hub id does go to the Hub (which does not have it here)
        cfg.write_text('[run]\ndir = "r"\n[[datasets]]\nname = "a"\npath = "a.jsonl"\n[extract]\nmodel = "Org/Name"\n')
        p, _ = _extract(cfg, env)
        assert p.returncode == 1 and "cannot load the config of model 'Org/Name'" in p.stderr, p.stderr
        assert any("Org/Name" in path for _m, path in hub.requests), hub.requests
        # offline: the hub id is not in the cache -> refused at once, still nothing sent
        n = len(hub.requests)
        p, took = _extract(cfg, {**env, "HF_HUB_OFFLINE": "1"})
        assert p.returncode == 1 and "'Org/Name' is a hub id, but HF_HUB_OFFLINE is set" in p.stderr, p.stderr
        assert str(tmp_path / "hub-cache") in p.stderr and took < 20 and len(hub.requests) == n
