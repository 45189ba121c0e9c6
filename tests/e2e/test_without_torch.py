"""The base install buys completions without torch: the generation path runs with the ``extract``
extra's packages made unimportable, and an extraction asked for without them is refused at start,
naming the extra.

Every Python process of these commands (reconstruction workers included) starts with a
``sitecustomize`` that puts ``None`` in ``sys.modules`` for torch, safetensors, accelerate, datasets
and matplotlib: ``import torch`` then raises ImportError and ``importlib.util.find_spec("torch")`` is
None, as on a machine where they were never installed (transformers then reports torch unavailable).
A fresh venv without the extras (``pip install eagle-datagen``) is the real-world case; docs/commands.md
"Installing" says how that was checked.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import SAMPLES

PY = sys.executable
REPO = Path(__file__).resolve().parents[2]
#: The extras' packages (pyproject.toml `extract` and `report`).
BLOCKED = ("torch", "safetensors", "accelerate", "datasets", "matplotlib")


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    site = tmp_path_factory.mktemp("site")
    (site / "sitecustomize.py").write_text(
        "import sys\n"
        f"for _m in {BLOCKED!r}:\n"
        "    sys.modules[_m] = None  # as if not installed\n")
    path = os.pathsep.join(p for p in (str(site), str(REPO), os.environ.get("PYTHONPATH", "")) if p)
    return {**os.environ, "PYTHONPATH": path, "OMP_NUM_THREADS": "1"}


def datagen(env: dict[str, str], *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([PY, "-m", "datagen", *args], capture_output=True, text=True, timeout=timeout, env=env,
                          cwd=REPO)


def test_the_blocker_blocks(env: dict[str, str]) -> None:
    r = subprocess.run([PY, "-c", "import importlib.util, sys\n"
                        "assert importlib.util.find_spec('torch') is None\n"
                        "try:\n    import torch\nexcept ImportError:\n    print('blocked')\n"
                        "from transformers.utils import is_torch_available\n"
                        "print('transformers sees torch:', is_torch_available())"],
                       capture_output=True, text=True, timeout=60, env=env)
    assert r.returncode == 0 and "blocked" in r.stdout and "transformers sees torch: False" in r.stdout, r.stderr


#: transformers' start-up advisory without torch (``logger.warning_advice``).
ADVISORY = "PyTorch was not found"


def test_the_advisory_is_silenced_for_the_tokenizer_path_only(env: dict[str, str]) -> None:
    """The tokenizer path imports transformers without its "PyTorch was not found" advisory; a real
    warning still shows, and so does a later advisory (the switch is restored after the import)."""
    code = ("import os\n"
            "from engine.tokens.hfimport import ADVISORY_ENV, transformers_module\n"
            "transformers_module('transformers.utils.chat_template_utils')\n"
            "print('env after:', os.environ.get(ADVISORY_ENV))\n"
            "from transformers.utils import logging\n"
            "log = logging.get_logger('transformers.test')\n"
            "log.warning('a real warning')\n"
            "log.warning_advice('a later advisory')\n")
    r = subprocess.run([PY, "-c", code], capture_output=True, text=True, timeout=60, env=env)
    assert r.returncode == 0, r.stderr
    assert "env after: None" in r.stdout
    assert ADVISORY not in r.stderr and "a real warning" in r.stderr and "a later advisory" in r.stderr, r.stderr
    plain = subprocess.run([PY, "-c", "import transformers"], capture_output=True, text=True, timeout=60, env=env)
    assert ADVISORY in plain.stderr  # the check can fail: a bare import does print it


@pytest.mark.slow  # issue 27: long robustness/e2e test, run by `make slow`
def test_generation_status_and_export_run_without_torch(tmp_path: Path, env: dict[str, str]) -> None:
    tok = tmp_path / "tok"
    r = datagen(env, "make-tokenizer", str(tok))
    assert r.returncode == 0, r.stderr
    cfg = tmp_path / "config.toml"
    cfg.write_text(f"""
[run]
name = "notorch"
dir = "{tmp_path / 'run'}"
progress_interval_s = 1
commit_interval_s = 0.2
[provider]
kind = "simulated"
[provider.sim]
tokens_per_s = 0
mean_completion_tokens = 60
faults = "429:0.05"
tokenizer = "{tok}"
[tokenizer]
path = "{tok}"
kind = "tiktoken"
[classes.short]
max_tokens = 1000
concurrency = 8
[[datasets]]
name = "glaive"
path = "{SAMPLES / 'b1_glaive.jsonl'}"
format = "glaive"
""")
    r = datagen(env, "run", str(cfg), "--headless")  # every result rebuilt and validated in a worker process
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    assert "run completed" in r.stdout and "glaive" in r.stdout
    assert ADVISORY not in r.stdout + r.stderr  # transformers' advisory: no model is needed here
    r = datagen(env, "validate", str(tmp_path / "run"))
    assert r.returncode == 0 and ADVISORY not in r.stdout + r.stderr, r.stdout[-2000:] + r.stderr[-2000:]
    r = datagen(env, "status", str(tmp_path / "run"))
    assert r.returncode == 0 and "glaive" in r.stdout, r.stderr
    for fmt in ("raw", "tokens"):
        r = datagen(env, "export", str(tmp_path / "run"), "--format", fmt, "--out", str(tmp_path / fmt))
        assert r.returncode == 0, r.stderr
    assert (tmp_path / "raw" / "glaive.jsonl").is_file() and list((tmp_path / "tokens").glob("*.parquet"))
    # extraction is the extra's: refused at once, naming it (no worker started, nothing written)
    with cfg.open("a") as f:
        f.write(f'[extract]\nmodel = "{tmp_path / "model"}"\n')
    (tmp_path / "model").mkdir()
    r = datagen(env, "extract", str(cfg))
    assert r.returncode == 1, r.stdout + r.stderr
    assert "datagen extract needs torch, safetensors, not installed here" in r.stderr
    assert "pip install 'eagle-datagen[extract]'" in r.stderr
    assert not (tmp_path / "run" / "extract").exists()


def test_docs_quote_the_base_installs_extract_refusal(monkeypatch: pytest.MonkeyPatch) -> None:
    """A base install lacks torch alone (transformers brings safetensors): docs/commands.md quotes the message
    the code gives there, word for word."""
    import importlib.util

    from engine.extract.job import ExtractError, require_extract_packages

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "torch" else real(name, *a))
    with pytest.raises(ExtractError) as e:
        require_extract_packages()
    assert str(e.value).startswith("datagen extract needs torch, not installed here")
    assert f"`error: {e.value}`" in (REPO / "docs" / "commands.md").read_text()


def test_chained_extraction_without_torch_is_refused_before_anything_is_bought(tmp_path: Path,
                                                                              env: dict[str, str]) -> None:
    cfg = tmp_path / "config.toml"
    cfg.write_text(f"""
[run]
dir = "{tmp_path / 'run'}"
[[datasets]]
name = "glaive"
path = "{SAMPLES / 'b1_glaive.jsonl'}"
format = "glaive"
[tokenizer]
path = "{tmp_path}"
kind = "tiktoken"
[extract]
model = "{tmp_path}"
after_run = "run"
""")
    r = datagen(env, "run", str(cfg), "--headless", timeout=60)
    assert r.returncode == 1, r.stdout + r.stderr
    assert "[extract] after_run = \"run\" needs torch, safetensors" in r.stderr
    assert "pip install 'eagle-datagen[extract]'" in r.stderr
    assert not (tmp_path / "run" / "store.sqlite").exists()


@pytest.mark.slow  # builds a venv and installs the base package from PyPI (minutes; pip's cache helps)
def test_fresh_venv_without_extras_runs_the_demo(tmp_path: Path) -> None:
    """``pip install -e REPO`` (no extras: the base install) into a fresh venv: no torch there, and the demo's
    commands (make-tokenizer, run headless on the simulator, validate, status, export) succeed."""
    venv = tmp_path / "venv"
    subprocess.run([PY, "-m", "venv", str(venv)], check=True, timeout=120)
    bin_ = venv / "bin"
    r = subprocess.run([str(bin_ / "pip"), "install", "-q", "-e", str(REPO)], capture_output=True, text=True, timeout=1200)
    assert r.returncode == 0, r.stderr[-3000:]
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}  # the venv's own install only
    r = subprocess.run([str(bin_ / "python"), "-c", "import torch"], capture_output=True, text=True, env=env)
    assert r.returncode != 0 and "No module named 'torch'" in r.stderr

    def run(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([str(bin_ / "datagen"), *args], capture_output=True, text=True, timeout=300, env=env,
                              cwd=tmp_path)

    tok = tmp_path / "tok"
    assert run("make-tokenizer", str(tok)).returncode == 0
    cfg = (REPO / "config.toml").read_text().replace('"runs/demo-tokenizer"', f'"{tok}"')
    cfg = cfg.replace('path = "engine/samples/', f'path = "{REPO}/engine/samples/')
    (tmp_path / "config.toml").write_text(cfg)
    r = run("run", "config.toml", "--headless", "--run-dir", str(tmp_path / "run"))
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    assert run("validate", "run").returncode == 0
    assert run("status", "run").returncode == 0
    assert run("export", "run", "--format", "tokens", "--out", "tokens").returncode == 0
    assert len(list((tmp_path / "tokens").glob("*.parquet"))) == 5
