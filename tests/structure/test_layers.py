"""The layers the folders show (issue 12): the CLI above the dashboard above the engine, the import
contracts `make test` checks, one error base caught once by the CLI, one implementation of the small
helpers, and docs the code cites living in the repository."""

from __future__ import annotations

import importlib
import importlib.metadata
import importlib.util
import inspect
import json
import os
import pkgutil
import re
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from datagen.cli import main

REPO = Path(__file__).resolve().parents[2]
PY = sys.executable


# ---------------------------------------------------------------------------- the entry point and the contracts

def test_the_cli_is_its_own_package_above_engine_and_tui():
    ep = [e for e in importlib.metadata.entry_points(group="console_scripts") if e.name == "datagen"]
    assert [e.value for e in ep] == ["datagen.cli:main"]
    r = subprocess.run([PY, "-m", "datagen", "--help"], capture_output=True, text=True, timeout=60, cwd="/")
    assert r.returncode == 0 and r.stdout.startswith("usage: datagen"), r.stderr
    assert not (REPO / "engine" / "cli.py").exists()
    with pytest.raises(ModuleNotFoundError):
        importlib.import_module("engine.cli")


def test_lint_imports_keeps_every_contract():
    """Layers (datagen > tui > engine), pure modules free of I/O, no cycles in engine: `make test`'s first step."""
    lint = Path(PY).with_name("lint-imports")
    r = subprocess.run([str(lint), "--no-cache"], capture_output=True, text=True, timeout=120, cwd=REPO)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-2000:]
    import tomllib

    contracts = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["importlinter"]["contracts"]
    assert re.search(rf"Contracts: {len(contracts)} kept, 0 broken\.", r.stdout), r.stdout[-2000:]
    make = (REPO / "Makefile").read_text()
    test_target = make[make.index("\ntest: venv") + 1:].split("\n\n")[0]
    assert "$(BIN)/lint-imports" in test_target.splitlines()[1]  # before pytest


def test_every_engine_folder_and_module_has_a_place_in_the_layers():
    """The engine-layers contract names each package and top-level module of engine/ exactly once, so a new
    folder or module cannot sit outside the layering unnoticed (lint-imports ignores what it is not told)."""
    import tomllib

    contracts = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["importlinter"]["contracts"]
    (layers,) = [c["layers"] for c in contracts if c["id"] == "engine-layers"]
    named = [n.strip() for layer in layers for n in layer.split("|")]
    present = sorted(m.name for m in pkgutil.iter_modules([str(REPO / "engine")]) if m.name != "__main__")
    assert sorted(named) == present
    assert len(named) == len(set(named))
    flat = [p.name for p in (REPO / "engine").glob("*.py") if p.name != "__init__.py"]
    assert len(flat) <= 8, flat  # the root holds the foundations only; the rest lives in folders


def test_only_storage_imports_sqlite_and_the_contract_names_every_other_package():
    """engine.storage owns the database (issue 27): the storage-owns-sqlite contract forbids sqlite3 and
    aiosqlite to the CLI, the dashboard and every engine package and root module but storage, so a new one
    cannot import them unnoticed; and no module outside storage holds SQL."""
    import tomllib

    contracts = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["importlinter"]["contracts"]
    (c,) = [c for c in contracts if c["id"] == "storage-owns-sqlite"]
    assert c["type"] == "forbidden" and sorted(c["forbidden_modules"]) == ["aiosqlite", "sqlite3"]
    present = {f"engine.{m.name}" for m in pkgutil.iter_modules([str(REPO / "engine")]) if m.name != "__main__"}
    assert sorted(c["source_modules"]) == sorted(present - {"engine.storage"} | {"datagen", "tui"})
    sql = re.compile(r"\b(SELECT .+ FROM|INSERT (OR \w+ )?INTO|UPDATE \w+ SET|DELETE FROM|CREATE TABLE|PRAGMA \w+)")
    outside = [str(p.relative_to(REPO)) for d in ("engine", "tui", "datagen") for p in sorted((REPO / d).rglob("*.py"))
               if not p.is_relative_to(REPO / "engine" / "storage")
               and (sql.search(p.read_text()) or re.search(r"\.execute(many|script)?\(", p.read_text()))]
    assert outside == [], outside


def test_the_dashboard_sees_the_engine_through_engine_api_only():
    """The engine's public face (issue 27): the tui-uses-api contract forbids every engine package and root module
    but api to the dashboard (so a new one is covered too), every name engine.api exports resolves, and what tui
    imports of the engine, statement by statement, is engine.api; no import cycle in tui or datagen either."""
    import ast
    import tomllib

    import engine.api as api

    contracts = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["importlinter"]["contracts"]
    (c,) = [c for c in contracts if c["id"] == "tui-uses-api"]
    assert c["type"] == "forbidden" and c["source_modules"] == ["tui"] and c["allow_indirect_imports"] is True
    present = {f"engine.{m.name}" for m in pkgutil.iter_modules([str(REPO / "engine")]) if m.name != "__main__"}
    assert sorted(c["forbidden_modules"]) == sorted(present - {"engine.api"})
    assert [n for n in api.__all__ if not hasattr(api, n)] == []
    named = set()
    for p in sorted((REPO / "tui").rglob("*.py")):
        for node in ast.walk(ast.parse(p.read_text())):
            if isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "").split(".")[0] == "engine":
                named.add(node.module)
            elif isinstance(node, ast.Import):
                named |= {a.name for a in node.names if a.name.split(".")[0] == "engine"}
    assert named == {"engine.api"}, named
    (acyclic,) = [c for c in contracts if c["id"] == "acyclic-ui"]
    assert acyclic["type"] == "acyclic_siblings" and sorted(acyclic["ancestors"]) == ["datagen", "tui"]


def test_no_module_of_the_dashboard_or_the_client_is_over_500_lines():
    """Modules are split along their concepts (issue 27) before they grow past 500 lines."""
    big = {str(p.relative_to(REPO)): n for d in ("tui", "engine/client") for p in sorted((REPO / d).rglob("*.py"))
           if (n := len(p.read_text().splitlines())) > 500}
    assert big == {}, big


def test_a_fault_spec_in_the_config_loads_no_simulator(tmp_path):
    """`[provider.sim] faults` is checked by engine.simfaults alone: loading a config does not import the
    simulator's server, generator or the tokenizer (engine.sim imports lazily)."""
    cfg = tmp_path / "c.toml"
    cfg.write_text(f'[run]\ndir = "{tmp_path / "run"}"\n[provider]\nkind = "simulated"\n[provider.sim]\n'
                   f'faults = "429:0.1,midstream:0.05"\n[[datasets]]\nname = "a"\npath = "{tmp_path / "a.jsonl"}"\n'
                   f'format = "text"\n')
    (tmp_path / "a.jsonl").write_text('{"prompt": "hi"}\n')
    code = ("import json, sys; from engine.config import load_config; c = load_config(sys.argv[1]); "
            "import engine.sim; "
            "print(json.dumps([c.provider.sim.faults, sorted(m for m in sys.modules if m.startswith(('engine.sim.', "
            "'engine.tokens')))]))")
    r = subprocess.run([PY, "-c", code, str(cfg)], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    faults, loaded = json.loads(r.stdout)
    assert faults == "429:0.1,midstream:0.05"
    assert loaded == [], loaded
    bad = cfg.read_text().replace("429:0.1", "430:0.1")
    cfg.write_text(bad)
    from engine.config import ConfigError, load_config

    with pytest.raises(ConfigError, match=r"provider\.sim\.faults.*unknown kind '430'"):
        load_config(cfg)


def test_engine_sim_names_resolve_lazily():
    import engine.sim as sim
    from engine.sim.server import SimThread
    from engine.simfaults import parse_faults

    assert sim.SimThread is SimThread and sim.parse_faults is parse_faults
    assert {"SimConfig", "SimServer", "SimThread", "serve_forever", "FAULT_KINDS"} <= set(dir(sim))
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        sim.nope  # noqa: B018


# ---------------------------------------------------------------------------- one error base

#: modules vLLM imports (its KV connector plugin); they import vllm themselves
VLLM_ONLY = {"engine.extract.onvllm.connector"}


def _engine_exception_classes() -> dict[str, type]:
    import engine

    found: dict[str, type] = {}
    for info in pkgutil.walk_packages(engine.__path__, "engine."):
        if info.name in VLLM_ONLY and importlib.util.find_spec("vllm") is None:
            continue
        mod = importlib.import_module(info.name)
        for obj in vars(mod).values():
            if inspect.isclass(obj) and issubclass(obj, BaseException) and obj.__module__ == mod.__name__:
                found[f"{obj.__module__}.{obj.__qualname__}"] = obj
    return found


#: Defined in a module another helper owns in issue 12 (the run core's guards); it gets the base there.
_NOT_YET: set[str] = set()


def test_every_engine_exception_derives_from_datagen_error_and_keeps_its_value_error_base():
    from engine.errors import DatagenError

    classes = _engine_exception_classes()
    assert len(classes) >= 24, sorted(classes)
    outside = sorted(k for k, c in classes.items() if not issubclass(c, DatagenError))
    assert outside == sorted(_NOT_YET & set(classes)), outside
    still_value_errors = ["engine.money.budget.NoPriceError", "engine.client.sse.SSEDecodeError",
                          "engine.datasets.adapters.AdapterError", "engine.datasets.adapters.MissingField",
                          "engine.datasets.reasoning.ReasoningError", "engine.tokens.kimi_tools.ToolSchemaError"]
    assert all(issubclass(classes[k], ValueError) for k in still_value_errors)
    assert issubclass(classes["engine.tokens.template.TemplateError"], classes["engine.tokens.tokenizer.TokenizerError"])


def test_cli_has_no_exception_tuples_left():
    cli = (REPO / "datagen" / "cli.py").read_text()
    assert cli.count("except DatagenError") == 1  # main's one catch
    run = (REPO / "datagen" / "runcmd.py").read_text()
    assert run.count("except DatagenError") == 1  # run's clean-up of a refused start, which re-raises
    for f in ("cli.py", "runcmd.py", "commands.py", "parser.py"):
        assert not re.search(r"except \(", (REPO / "datagen" / f).read_text()), f
    assert "except DatagenError" not in (REPO / "datagen" / "commands.py").read_text()


@pytest.mark.parametrize("argv, target, code", [
    (["status", "R"], "engine.report.status.collect_status", 1),
    (["export", "R", "--out", "O"], "engine.report.export.export", 2),
    (["validate", "R"], "engine.tokens.service.section_for_run", 2),
    (["make-tokenizer", "D"], "engine.tokens.demo_tokenizer.build_demo_tokenizer", 1),
])
def test_any_datagen_error_is_one_error_line_with_the_commands_exit_status(argv, target, code, tmp_path, capsys,
                                                                            monkeypatch):
    """An error no command names (a StoreError from export used to escape as a traceback) is printed once,
    as `error: <message>`, with the command's error status: 2 for export and validate, 1 elsewhere."""
    from engine.storage.store import StoreError

    mod, _, name = target.rpartition(".")

    def boom(*a, **k):
        raise StoreError("the store says no")

    monkeypatch.setattr(importlib.import_module(mod), name, boom)
    argv = [str(tmp_path / a) if a in ("R", "O", "D") else a for a in argv]
    assert main(argv) == code
    out, err = capsys.readouterr()
    assert err == "error: the store says no\n" and "Traceback" not in out


def test_nothing_to_export_keeps_exit_1_and_is_a_datagen_error(tmp_path, capsys, monkeypatch):
    import engine.report.export
    from engine.errors import DatagenError, NothingToExport

    assert issubclass(NothingToExport, DatagenError)

    def nothing(*a, **k):
        raise NothingToExport("nothing to export: no result")

    monkeypatch.setattr(engine.report.export, "export", nothing)
    assert main(["export", str(tmp_path / "r"), "--out", str(tmp_path / "o")]) == 1
    assert capsys.readouterr().err == "error: nothing to export: no result\n"


# ---------------------------------------------------------------------------- one implementation each

def test_pid_alive_is_one_function_and_never_addresses_a_group():
    from engine.extract import shards
    from engine.extract import status as xstatus
    from engine.proc import pids
    from engine.report import liveness

    assert liveness.pid_alive is shards.pid_alive is xstatus.pid_alive is pids.pid_alive
    p = subprocess.Popen([PY, "-c", "pass"])
    p.wait()
    assert pids.pid_alive(os.getpid()) and not pids.pid_alive(p.pid)
    assert not any(pids.pid_alive(x) for x in (None, 0, -1, 2**40))


def test_a_worker_status_without_a_pid_is_not_taken_for_alive(tmp_path):
    """kill(-1, 0) succeeds (it addresses every process), so a worker record without a pid looked alive forever."""
    from engine.extract.status import read_workers, status_dir

    d = status_dir(tmp_path)
    d.mkdir(parents=True)
    (d / "worker-0.json").write_text(json.dumps({"state": "running", "host": socket.gethostname()}))
    (d / "worker-1.json").write_text(json.dumps({"state": "running", "host": socket.gethostname(),
                                                 "pid": os.getpid()}))
    w = read_workers(tmp_path)
    assert [x["state"] for x in w] == ["failed", "running"]


def test_one_loopback_predicate_for_the_client_and_the_key_check():
    from engine import loopback
    from engine.client import chat
    from engine.run import apikey

    assert apikey.is_loopback_url is loopback.is_loopback_url and chat.is_loopback_host is loopback.is_loopback_host
    for url in ("http://localhost:8000/v1", "http://api.localhost/v1", "http://LOCALHOST./v1",
                "http://127.0.0.9/v1", "http://[::1]:9/v1", "http://[::ffff:127.0.0.1]/v1"):
        assert loopback.is_loopback_url(url), url
    for url in ("http://127.0.0.1.evil.com/v1", "https://openrouter.ai/api/v1", "http://10.0.0.1/v1", "nohost"):
        assert not loopback.is_loopback_url(url), url


# ---------------------------------------------------------------------------- docs the code cites

def test_docs_the_code_cites_are_in_the_repository():
    cited: dict[str, list[str]] = {}
    outside = []
    for top in ("engine", "tui", "datagen", "tests", "bench"):
        for f in (REPO / top).rglob("*.py"):
            if f.name == "test_layers.py":  # this file names the patterns it looks for
                continue
            text = f.read_text(encoding="utf-8")
            for m in re.finditer(r"docs/([\w.-]+\.md)", text):
                cited.setdefault(m.group(1), []).append(str(f.relative_to(REPO)))
            # a markdown link of a generated docs page, ](openrouter.md), is relative to docs/ itself
            if re.search(r"shared/reference|(?<!docs/)(?<!\]\()\b(openrouter|eagle3-data)\.md|SOURCES\.md", text):
                outside.append(str(f.relative_to(REPO)))
    assert not outside, outside
    missing = {doc: files for doc, files in cited.items() if not (REPO / "docs" / doc).is_file()}
    assert not missing, missing
    assert {"openrouter.md", "eagle3-data.md", "datasets.md"} <= set(cited)


def test_final_report_is_the_dataset_lines_then_the_summary_line():
    """One implementation of the lines a run ends with (headless and after the dashboard; the two call
    sites, engine/run/runner.py and tui/app.py, switch to it when the run-core and dashboard changes merge)."""
    from engine.report.progress import dataset_line, final_report
    from engine.report.snapshot import DatasetSnapshot, RunSnapshot

    d = DatasetSnapshot(name="b1", state="done", state_reason="", prompts=5, rejected=0, done=4, failed=1, skipped=0,
                        pending=0, in_flight=0, prompt_tokens=100, completion_tokens=2000, reasoning_tokens=300,
                        cost_usd=0.0123, token_budget=None)
    snap = RunSnapshot(name="r", state="paused", state_reason="credits below the floor", elapsed_s=12.0, datasets=(d,),
                       classes=(), in_flight=0, req_per_s=0.0, cost_usd=1.23456, errors={})
    assert final_report(snap, Path("/x/store.sqlite")) == [
        dataset_line(d), "run paused: credits below the floor; $1.2346 spent; store /x/store.sqlite"]
    done = RunSnapshot(name="r", state="done", state_reason="", elapsed_s=1.0, datasets=(), classes=(), in_flight=0,
                       req_per_s=0.0, cost_usd=0.0, errors={})
    assert final_report(done, "?") == ["run done; $0.0000 spent; store ?"]
