"""Every ``datagen`` subcommand exits quietly when its stdout is gone (issue 11 §6): a pipe whose reader
exited (``datagen status RUN | true``) or a closed descriptor (``datagen status RUN >&-``). Real processes;
no ``Traceback`` / ``Exception ignored`` on stderr, and the command's own exit code (or 141 for the pipe)."""

from __future__ import annotations

import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from fixtures_tokens import kimi_dir

PY = sys.executable
REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A finished simulated run with a [tokenizer] (3 prompts), its config and a tokenizer directory."""
    tmp = tmp_path_factory.mktemp("closed")
    tok = tmp / "tok"
    subprocess.run(["cp", "-r", str(kimi_dir()), str(tok)], check=True)
    (tmp / "p.jsonl").write_text("".join(f'{{"prompt": "question {i}"}}\n' for i in range(3)))
    cfg = tmp / "config.toml"
    cfg.write_text(f"""[run]
name = "closed"
dir = "{tmp / 'run'}"
commit_interval_s = 0.2
progress_interval_s = 0.2
[provider]
kind = "simulated"
[provider.sim]
mean_completion_tokens = 20
tokenizer = "{tok}"
faults = ""
[tokenizer]
path = "{tok}"
executor = "thread"
[classes.short]
max_tokens = 256
concurrency = 4
[[datasets]]
name = "d"
path = "{tmp / 'p.jsonl'}"
format = "text"
""")
    r = subprocess.run([PY, "-m", "datagen", "run", str(cfg), "--headless"], cwd=REPO, capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    return {"tmp": tmp, "cfg": cfg, "run": tmp / "run", "tok": tok}


def _commands(r: dict[str, Path], mode: str) -> list[tuple[list[str], int]]:
    """(arguments, exit code with a working stdout) for every subcommand."""
    rd, out = str(r["run"]), r["tmp"] / f"out-{mode}"
    return [
        (["--help"], 0),
        (["run", "--help"], 0),
        (["run", str(r["cfg"]), "--headless", "--run-dir", str(r["tmp"] / f"fresh-{mode}")], 0),
        (["status", rd], 0),
        (["status", rd, "--json"], 0),
        (["status", rd, "--watch", "--interval", "0.2"], 0),
        (["status", str(r["tmp"] / "nowhere")], 1),
        (["ctl", rd, "pause", "d"], 0),
        (["ctl", rd, "resume", "d"], 0),
        (["export", rd, "--out", str(out / "raw")], 0),
        (["export", rd, "--format", "specforge", "--force", "--out", str(out / "sf")], 0),
        (["export", rd, "--format", "tokens", "--out", str(out / "tok")], 0),
        (["validate", rd], 0),
        (["validate", rd, "--json"], 0),
        (["make-tokenizer", str(r["tok"])], 0),
        (["extract", str(r["cfg"])], 1),  # no [extract] model: an error on stderr
        (["sim", "--port", "0", "--help"], 0),
    ]


def _closed_fd1() -> None:  # runs in the child before exec: `>&-`
    os.close(1)


def _probe(args: list[str], mode: str) -> tuple[int, str]:
    if mode == "pipe":
        rfd, wfd = os.pipe()
        os.close(rfd)  # the reader is gone before the first write
        p = subprocess.run([PY, "-m", "datagen", *args], cwd=REPO, stdout=wfd, stderr=subprocess.PIPE,
                           stdin=subprocess.DEVNULL, text=True, timeout=120)
        os.close(wfd)
    else:
        p = subprocess.run([PY, "-m", "datagen", *args], cwd=REPO, stderr=subprocess.PIPE,
                           stdin=subprocess.DEVNULL, text=True, timeout=120, preexec_fn=_closed_fd1)
    return p.returncode, p.stderr


@pytest.mark.parametrize("mode", ["pipe", "closed"])
@pytest.mark.slow  # issue 27: long robustness/e2e test, run by `make slow`
def test_every_subcommand_exits_quietly_without_stdout(run, mode):
    cmds = _commands(run, mode)
    # validate and validating exports take the run directory's lock: not two at once
    serial = {i for i, (args, _) in enumerate(cmds) if args[0] in ("validate", "export")}
    with ThreadPoolExecutor(4) as pool:
        futures = {i: pool.submit(_probe, c[0], mode) for i, c in enumerate(cmds) if i not in serial}
        done = {i: _probe(cmds[i][0], mode) for i in sorted(serial)}
        done.update({i: f.result() for i, f in futures.items()})
    results = [done[i] for i in range(len(cmds))]
    bad = []
    for (args, code), (got, err) in zip(cmds, results, strict=True):
        noisy = "Traceback" in err or "Exception ignored" in err
        allowed = {code, 141} if mode == "pipe" else {code}
        if noisy or got not in allowed:
            bad.append(f"{' '.join(args[:3])}: exit {got} (expected {sorted(allowed)}); stderr: {err[-800:]}")
    assert not bad, "\n".join(bad)
    # the pipe closed early is noticed: a command that prints its result says so with 141
    assert results[3][0] == 141 if mode == "pipe" else results[3][0] == 0
