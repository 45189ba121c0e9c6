"""Config validation: every error names the key (or file) and what was expected."""

from pathlib import Path

import pytest
from helpers import REPO, make_config

from engine.config import ConfigError, load_config


def write(tmp_path: Path, text: str) -> Path:
    p = tmp_path / "config.toml"
    p.write_text(text)
    (tmp_path / "a.jsonl").write_text('{"messages":[{"role":"user","content":"hi"}]}\n')
    return p


BASE = """
[run]
name = "x"
[[datasets]]
name = "a"
path = "a.jsonl"
"""


def test_repo_config_is_valid_and_paths_resolve():
    # The demo tokenizer is built by `make demo` (runs/demo-tokenizer): not there on a fresh clone.
    cfg = load_config(REPO / "config.toml", check_files=False)
    assert all(d.path.is_file() for d in cfg.datasets)
    assert cfg.tokenizer.path == str(REPO / "runs" / "demo-tokenizer") == str(cfg.provider.sim.tokenizer)
    assert cfg.provider.kind == "simulated"
    assert [d.name for d in cfg.datasets] == ["b1_glaive", "b3_oss_instruct", "b3_evol_instruct", "b7_sharegpt", "b8_swe_agent"]
    assert cfg.datasets[0].path == REPO / "engine" / "samples" / "b1_glaive.jsonl"
    assert cfg.run.dir == REPO / "runs" / "demo"
    assert cfg.classes["short"].concurrency == 2000 and cfg.classes["short"].max_tokens == 10240
    assert cfg.classes["long"].concurrency == 500 and cfg.classes["long"].max_tokens == 16384


def test_defaults_follow_reference_run(tmp_path):
    cfg = load_config(write(tmp_path, BASE))
    assert cfg.classes["short"].max_tokens == 10240 and cfg.classes["long"].max_tokens == 16384
    assert cfg.class_for("a", 10) == "short" and cfg.class_for("a", 9000) == "long"
    assert cfg.provider.stream is True
    assert cfg.datasets[0].path == tmp_path / "a.jsonl"


@pytest.mark.parametrize(
    "extra, needle",
    [
        ("[run]\nnmae = 'typo'\n", "run.nmae: unknown key"),
        ("[provider]\nkind = 'azure'\n", "provider.kind"),
        ("[provider]\nstream = 'yes please'\n", "provider.stream"),
        ("[provider]\nbase_url = 'ftp://x'\n", "provider.base_url: expected an http(s) URL"),
        ("[provider]\napi_key_env = 'sk-or-v1-abc'\n", "provider.api_key_env: expected the NAME"),
        ("[classes.short]\nmax_tokens = 10\nconcurrency = 0\n", "classes.short.concurrency"),
        ("[provider.routing]\nsort = 'cheapest'\n", "provider.routing.sort"),
        ("[provider.sim]\nfaults = '429:2.0'\n", "provider.sim.faults"),
    ],
)
def test_bad_keys_are_named(tmp_path, extra, needle):
    text = BASE.replace("[run]\nname = \"x\"\n", "") + "\n" + extra
    if not extra.startswith("[run]"):
        text = BASE + "\n" + extra
    with pytest.raises(ConfigError) as ei:
        load_config(write(tmp_path, text))
    msg = str(ei.value)
    assert str(tmp_path / "config.toml") in msg
    assert needle in msg, msg


def test_dataset_errors_name_index_and_file(tmp_path):
    text = BASE + '\n[[datasets]]\nname = "b"\npath = "missing.jsonl"\ntoken_budget = -5\n'
    with pytest.raises(ConfigError) as ei:
        load_config(write(tmp_path, text))
    assert "datasets[1].token_budget" in str(ei.value)
    text = BASE + '\n[[datasets]]\nname = "b"\npath = "missing.jsonl"\n'
    with pytest.raises(ConfigError) as ei:
        load_config(write(tmp_path, text))
    assert "datasets[1].path (b): file not found" in str(ei.value) and "missing.jsonl" in str(ei.value)


def test_duplicate_dataset_names_and_format(tmp_path):
    text = BASE + '\n[[datasets]]\nname = "a"\npath = "a.jsonl"\nformat = "csv"\n'
    with pytest.raises(ConfigError) as ei:
        load_config(write(tmp_path, text))
    assert "datasets[1].format" in str(ei.value)
    text = BASE + '\n[[datasets]]\nname = "a"\npath = "a.jsonl"\n'
    with pytest.raises(ConfigError) as ei:
        load_config(write(tmp_path, text))
    assert "repeated: a" in str(ei.value)


def test_toml_syntax_and_missing_file(tmp_path):
    with pytest.raises(ConfigError) as ei:
        load_config(write(tmp_path, "[run\nname='x'"))
    assert "TOML syntax error" in str(ei.value) and "line 1" in str(ei.value)
    with pytest.raises(ConfigError) as ei:
        load_config(tmp_path / "nope.toml")
    assert "nope.toml: config file not found" in str(ei.value)


def test_routing_becomes_provider_object(tmp_path):
    routing = {"only": ["moonshotai"], "allow_fallbacks": False, "max_price": {"completion": 2.5}}
    cfg = make_config(tmp_path, provider={"kind": "simulated", "routing": routing})
    assert cfg.provider.routing.to_provider_object() == {"only": ["moonshotai"], "allow_fallbacks": False,
                                                          "max_price": {"completion": 2.5}}


def test_class_membership_by_dataset(tmp_path):
    cfg = make_config(tmp_path, classes={"short": {"max_tokens": 10, "concurrency": 1},
                                         "long": {"max_tokens": 20, "concurrency": 1, "min_prompt_tokens": 100,
                                                  "datasets": ["b"]}})
    assert cfg.class_for("b", 1) == "long" and cfg.class_for("a", 1) == "short" and cfg.class_for("a", 100) == "long"
    with pytest.raises(ConfigError) as ei:
        make_config(tmp_path, classes={"short": {"max_tokens": 10, "concurrency": 1, "datasets": ["zzz"]}})
    assert "classes.short.datasets names unknown dataset(s): zzz" in str(ei.value)
