"""Hub datasets (``path = "hf://datasets/ORG/NAME"``, ``revision``, ``split``, ``files``) read through huggingface_hub,
against a loopback fake of the Hub's file API (:mod:`fakehub`) and against a cache laid out as huggingface_hub lays it
out, offline. The commit sha is stored with the run; a revision that moves is re-read and reported like a changed file.
Nothing here leaves 127.0.0.1."""

from __future__ import annotations

import gzip
import json
import subprocess

import pytest
from e2e import PY, run_cmd
from fakehub import jsonl, parquet
from helpers import make_config

from engine.config import ConfigError, HubPath, parse_config
from engine.datasets import DatasetError, iter_prompts
from engine.datasets import hub as hubs
from engine.datasets.hub import HubRef, pick_files
from engine.prompts import Prompt
from engine.run.ingest import ingest_all
from engine.storage.store import Store


def chat(text: str) -> dict:
    return {"messages": [{"role": "user", "content": text}, {"role": "assistant", "content": "answer"}]}


FILES_V1 = {
    "README.md": b"---\nconfigs: ...\n---\n# card",
    ".gitattributes": b"*.parquet filter=lfs",
    "data/train-00000-of-00002.parquet": parquet([chat("q0"), chat("q1")]),
    "data/train-00001-of-00002.jsonl.gz": gzip.compress(jsonl([chat("q2")])),
    "data/test-00000-of-00001.parquet": parquet([chat("test q")]),
}


def offline(monkeypatch) -> None:
    from huggingface_hub import constants

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)  # any HTTP call would raise OfflineModeIsEnabled


# ----------------------------------------------------------------------------- paths, layouts, config


def test_hub_urls():
    assert hubs.parse_url("hf://datasets/HuggingFaceH4/ultrachat_200k") == "HuggingFaceH4/ultrachat_200k"
    assert hubs.parse_url("hf://datasets/open-r1/Mixture-of-Thoughts/") == "open-r1/Mixture-of-Thoughts"
    for bad in ("hf://datasets/name-only", "hf://models/org/name", "hf://datasets/org/name/file.parquet",
                "hf://datasets/../x", "hf://datasets/org/"):
        with pytest.raises(ValueError, match="expected hf://datasets/ORG/NAME"):
            hubs.parse_url(bad)


def test_split_layouts_pick_the_conventional_files():
    pushed = ["README.md", "data/train-00000-of-00002-a1.parquet", "data/train-00001-of-00002-b2.parquet",
              "data/test-00000-of-00001.parquet"]
    assert pick_files(pushed, "train", None) == ("data/train-*, data/train.*", pushed[1:3])
    assert pick_files(pushed, "test", None)[1] == ["data/test-00000-of-00001.parquet"]
    ultra = ["data/train_sft-00000-of-00003.parquet", "data/test_sft-00000-of-00001.parquet", "data/train_gen-0.parquet"]
    assert pick_files(ultra, "train_sft", None)[1] == ["data/train_sft-00000-of-00003.parquet"]
    assert pick_files(ultra, "train", None) == ("", [])  # named splits exist: no "everything is train" fallback
    assert pick_files(["train.jsonl", "test.jsonl", "train.py"], "train", None) == ("train-*, train.*", ["train.jsonl"])
    assert pick_files(["default/train/0000.parquet", "default/test/0000.parquet"], "train", None)[1] == ["default/train/0000.parquet"]
    thoughts = ["data/train-00000-of-00006.parquet", "metadata/train-00000-of-00012.parquet"]
    assert pick_files(thoughts, "train", None)[1] == ["data/train-00000-of-00006.parquet"]
    # no split in any name: the whole repository is the train split (as `datasets` reads it)
    magicoder = ["README.md", "data-oss_instruct-decontaminated.jsonl"]
    assert pick_files(magicoder, "train", None) == ("*", ["data-oss_instruct-decontaminated.jsonl"])
    # configurations as directories: the split alone is ambiguous
    mot = ["all/train-00000.parquet", "code/train-00000.parquet", "math/train-00000.parquet"]
    with pytest.raises(DatasetError, match=r"matches files in 3 directories, a dataset's configurations \(all/, code/, "
                                           r"math/\): set files to pick one, e.g. files = \"all/\*\""):
        pick_files(mot, "train", None)
    assert pick_files(mot, "train", "all/*") == ("all/*", ["all/train-00000.parquet"])
    assert pick_files([".cache/x.jsonl", "a/.hidden/y.jsonl", "z.jsonl"], "train", "*") == ("*", ["z.jsonl"])


def _cfg(tmp_path, **keys):
    data = {"run": {"dir": str(tmp_path / "run")}, "classes": {"short": {"max_tokens": 100, "concurrency": 2}},
            "datasets": [{"name": "h", "path": "hf://datasets/org/chat", **keys}]}
    return parse_config(data, tmp_path / "config.toml")


def test_config_reads_hub_paths_without_the_network(tmp_path, hub):
    cfg = _cfg(tmp_path, revision="v1.0", split="test")
    d = cfg.datasets[0]
    assert isinstance(d.path, HubPath) and str(d.path) == "hf://datasets/org/chat"
    assert d.hub() == HubRef("org/chat", "v1.0", "test", None)
    assert _cfg(tmp_path).datasets[0].hub() == HubRef("org/chat", "main", "train", None)
    assert _cfg(tmp_path, files="all/*.parquet").datasets[0].hub().files == "all/*.parquet"
    assert hub.requests == []  # validated (check_files=True) without one request: the repo does not even exist
    with pytest.raises(ConfigError) as e:
        _cfg(tmp_path, split="train", files="x/*")
    assert "datasets[0]: split and files: give one" in str(e.value)
    data = {"run": {"dir": str(tmp_path / "run")}, "datasets": [{"name": "l", "path": "d.jsonl", "revision": "main"}]}
    with pytest.raises(ConfigError, match=r"datasets\[0\]: revision: only for a path = \"hf://datasets/ORG/NAME\""):
        parse_config(data, tmp_path / "config.toml", check_files=False)


def test_offline_config_validation_checks_the_cache(tmp_path, hub, monkeypatch):
    hub.commit("org/chat", FILES_V1)
    offline(monkeypatch)
    with pytest.raises(ConfigError) as e:
        _cfg(tmp_path)
    assert str(e.value).startswith(f"{tmp_path / 'config.toml'}: invalid configuration:\n  datasets[0].path (h): "
                                   "hf://datasets/org/chat: revision 'main' is not in the Hugging Face cache")
    monkeypatch.delenv("HF_HUB_OFFLINE")
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    hubs.download(hubs.resolve(HubRef("org/chat")))
    offline(monkeypatch)
    hub.requests.clear()
    assert _cfg(tmp_path).datasets[0].hub() is not None  # cached now: valid
    assert hub.requests == []


# ----------------------------------------------------------------------------- resolve, download, read


def test_resolve_and_download_through_the_fake_hub(hub):
    sha = hub.commit("org/chat", FILES_V1)
    rev = hubs.resolve(HubRef("org/chat"))
    assert (rev.sha, rev.files, rev.pattern) == (
        sha, ("data/train-00000-of-00002.parquet", "data/train-00001-of-00002.jsonl.gz"), "data/train-*, data/train.*")
    assert hub.paths("/api/") == ["/api/datasets/org/chat/revision/main"]  # one API call to resolve
    shards = hubs.download(rev)
    assert [s.shown for s in shards] == ["hf://datasets/org/chat/data/train-00000-of-00002.parquet",
                                         "hf://datasets/org/chat/data/train-00001-of-00002.jsonl.gz"]
    assert all(s.path.is_file() and f"snapshots/{sha}/" in str(s.path) for s in shards)
    got = [(p.source, p.messages[0]["content"]) for p in iter_prompts(shards)]
    assert got == [("hf://datasets/org/chat/data/train-00000-of-00002.parquet:1", "q0"),
                   ("hf://datasets/org/chat/data/train-00000-of-00002.parquet:2", "q1"),
                   ("hf://datasets/org/chat/data/train-00001-of-00002.jsonl.gz:1", "q2")]
    assert sorted(p for p in hub.paths("/datasets/") if "/resolve/" in p) == sorted(
        f"/datasets/org/chat/resolve/{sha}/{f}" for f in rev.files for _ in (0, 1))  # HEAD + GET each; not the test split
    hub.requests.clear()
    assert [s.path for s in hubs.download(rev)] == [s.path for s in shards]
    assert [m for m, p in hub.requests if "/resolve/" in p and m == "GET"] == []  # cached: nothing fetched again

    test = hubs.resolve(HubRef("org/chat", split="test"))
    assert test.files == ("data/test-00000-of-00001.parquet",)
    pinned = hubs.resolve(HubRef("org/chat", revision=sha, files="data/*.jsonl.gz"))
    assert (pinned.sha, pinned.files) == (sha, ("data/train-00001-of-00002.jsonl.gz",))


@pytest.mark.parametrize("ref, message", [
    (HubRef("org/none"), "hf://datasets/org/none: no such dataset on the Hub (or a private one: set HF_TOKEN)"),
    (HubRef("org/chat", revision="v9"), "hf://datasets/org/chat: revision 'v9' not found on the Hub"),
    (HubRef("org/chat", split="validation"), "split 'validation' (by the layouts data/validation-*, data/validation.* | "
                                             "validation-*, validation.* | validation/* | */validation/* | */validation-*, "
                                             "*/validation.*) matches no data file; the repository has: .gitattributes, "
                                             "README.md, data/test-00000-of-00001.parquet, data/train-00000-of-00002.parquet, "
                                             "data/train-00001-of-00002.jsonl.gz"),
    (HubRef("org/chat", files="*.csv"), "files '*.csv' matches no data file"),
])
def test_hub_errors_name_the_dataset(hub, ref, message):
    hub.commit("org/chat", FILES_V1)
    with pytest.raises(DatasetError) as e:
        hubs.resolve(ref)
    assert message in str(e.value) and str(e.value).startswith(ref.url)


def test_a_compressed_parquet_file_picked_from_the_hub_is_refused_before_any_download(hub):
    hub.commit("org/packed", {"data/train-00000.parquet.gz": gzip.compress(parquet([chat("q0")])),
                              "data/train-00001.jsonl": jsonl([chat("q1")])})
    with pytest.raises(DatasetError) as e:
        hubs.resolve(HubRef("org/packed"))
    assert str(e.value) == ("hf://datasets/org/packed/data/train-00000.parquet.gz: a gzip-compressed Parquet file; Parquet "
                            "compresses its own pages, so give the .parquet file itself; set files to leave it out")
    assert hubs.resolve(HubRef("org/packed", files="data/*.jsonl")).files == ("data/train-00001.jsonl",)
    assert [p for p in hub.paths() if "/resolve/" in p] == []


def test_an_unreachable_hub_is_one_clear_error(hub, monkeypatch):
    from huggingface_hub import constants

    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")
    monkeypatch.setattr(constants, "ENDPOINT", "http://127.0.0.1:9")
    monkeypatch.setattr(constants, "HUGGINGFACE_CO_URL_TEMPLATE", "http://127.0.0.1:9/{repo_id}/resolve/{revision}/{filename}")
    with pytest.raises(DatasetError, match=r"^hf://datasets/org/chat: cannot reach the Hub \(.*\); HF_HUB_OFFLINE=1 reads"):
        hubs.resolve(HubRef("org/chat"))


def test_offline_reads_a_cache_laid_out_as_huggingface_hub_lays_it_out(tmp_path, hub, monkeypatch):
    """No Hub at all: ``datasets--ORG--NAME/refs/main`` holds the sha, ``snapshots/SHA/`` the files (a
    cache written by ``huggingface-cli download`` or copied from another machine)."""
    sha = "0123456789abcdef0123456789abcdef01234567"
    storage = tmp_path / "hf" / "hub" / "datasets--org--offline"
    (storage / "refs").mkdir(parents=True)
    (storage / "refs" / "main").write_text(sha)
    snap = storage / "snapshots" / sha / "data"
    snap.mkdir(parents=True)
    (snap / "train-00000-of-00001.jsonl").write_bytes(jsonl([chat("cached one"), chat("cached two")]))
    (snap / "validation-00000-of-00001.jsonl").write_bytes(jsonl([chat("val")]))
    offline(monkeypatch)
    rev = hubs.resolve(HubRef("org/offline"))
    assert (rev.sha, rev.files) == (sha, ("data/train-00000-of-00001.jsonl",))
    assert [p.messages[0]["content"] for p in iter_prompts(hubs.download(rev))] == ["cached one", "cached two"]
    with pytest.raises(DatasetError, match=r"revision 'v2' is not in the Hugging Face cache .* HF_HUB_OFFLINE is set"):
        hubs.resolve(HubRef("org/offline", revision="v2"))
    assert hub.requests == []


# ----------------------------------------------------------------------------- ingest: the sha is stored, a move re-reads


async def test_ingest_stores_the_sha_skips_an_unmoved_revision_and_rereads_a_moved_one(tmp_path, hub):
    sha1 = hub.commit("org/chat", FILES_V1)
    cfg = make_config(tmp_path, [{"name": "h", "path": "hf://datasets/org/chat", "format": "openai"}])
    store = await Store.open(cfg.run.dir)
    try:
        (rep,) = await ingest_all(cfg, store)
        assert (rep.skipped_unchanged, rep.prompts, rep.revision, rep.moved_from, rep.hub_files) == (False, 3, sha1, None, 2)
        assert rep.revision_summary("hf://datasets/org/chat", "main") == (
            f"hf://datasets/org/chat revision main is commit {sha1} (2 file(s): data/train-*, data/train.*)")
        assert (await store.datasets())["h"]["revision"] == sha1

        hub.requests.clear()
        (rep,) = await ingest_all(cfg, store)  # resumed at the same commit: one API call, no download
        assert (rep.skipped_unchanged, rep.revision) == (True, sha1)
        assert hub.paths() == ["/api/datasets/org/chat/revision/main"]

        files = dict(FILES_V1)
        files["data/train-00001-of-00002.jsonl.gz"] = gzip.compress(jsonl([chat("q2 edited"), chat("q3")]))
        sha2 = hub.commit("org/chat", files)
        (rep,) = await ingest_all(cfg, store)
        assert (rep.skipped_unchanged, rep.revision, rep.moved_from, rep.inserted) == (False, sha2, sha1, 2)
        assert rep.revision_summary("hf://datasets/org/chat", "main") == (
            f"hf://datasets/org/chat revision main moved: {sha1} -> {sha2} (re-read like a changed file: rows no "
            f"longer in it are handled as edited rows)")
        assert rep.stale_deleted == 1  # "q2" left the dataset, never sent: removed, as for an edited file
        assert (await store.datasets())["h"]["revision"] == sha2
        rows = await (await store.conn.execute("SELECT source, messages FROM prompts ORDER BY id")).fetchall()
        assert [(s, json.loads(m)[0]["content"]) for s, m in rows] == [
            ("hf://datasets/org/chat/data/train-00000-of-00002.parquet:1", "q0"),
            ("hf://datasets/org/chat/data/train-00000-of-00002.parquet:2", "q1"),
            ("hf://datasets/org/chat/data/train-00001-of-00002.jsonl.gz:1", "q2 edited"),
            ("hf://datasets/org/chat/data/train-00001-of-00002.jsonl.gz:2", "q3")]
    finally:
        await store.close()


def test_datagen_run_headless_on_a_hub_dataset_stores_the_sha_and_reports_a_moved_revision(tmp_path, hub):
    """The real CLI end to end: run, status --json shows the sha; the Hub moves main; the rerun reports it."""
    sha1 = hub.commit("org/chat", FILES_V1)
    cfg = tmp_path / "config.toml"
    cfg.write_text(f"""[run]
name = "hub"
dir = "{tmp_path / 'run'}"
commit_interval_s = 0.05
[provider]
kind = "simulated"
[classes.short]
max_tokens = 64
concurrency = 4
[[datasets]]
name = "chat"
path = "hf://datasets/org/chat"
format = "openai"
""")
    env = {**__import__("os").environ, "HF_ENDPOINT": hub.endpoint, "HF_HOME": str(tmp_path / "hf")}
    for k in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_HUB_CACHE", "HF_TOKEN"):
        env.pop(k, None)

    def status() -> dict:
        out = subprocess.run([PY, "-m", "datagen", "status", str(tmp_path / "run"), "--json"], capture_output=True,
                             text=True, env=env, check=True)
        return json.loads(out.stdout)["datasets"][0]

    done = subprocess.run(run_cmd(cfg), capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert f"[chat] hf://datasets/org/chat revision main is commit {sha1} (2 file(s): data/train-*, data/train.*)" in done.stdout
    assert "[chat] ingested 3 prompts (3 new), 0 rejected rows" in done.stdout
    st = status()
    assert (st["path"], st["revision"], st["done"], st["prompts"]) == ("hf://datasets/org/chat", sha1, 3, 3)

    files = {**FILES_V1, "data/train-00001-of-00002.jsonl.gz": gzip.compress(jsonl([chat("q2"), chat("q3 new")]))}
    sha2 = hub.commit("org/chat", files)
    again = subprocess.run(run_cmd(cfg), capture_output=True, text=True, env=env, timeout=120)
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
    assert f"[chat] hf://datasets/org/chat revision main moved: {sha1} -> {sha2}" in again.stdout
    assert "[chat] ingested 4 prompts (1 new), 0 rejected rows" in again.stdout
    st = status()
    assert (st["revision"], st["done"], st["prompts"]) == (sha2, 4, 4)
    assert [p for p in hub.paths() if not p.startswith(("/api/datasets/", "/datasets/", "/api/agent-harnesses"))] == []


def test_prompts_read_from_hub_shards_are_prompts(hub):
    hub.commit("org/chat", FILES_V1)
    items = list(iter_prompts(hubs.download(hubs.resolve(HubRef("org/chat", split="test")))))
    assert all(isinstance(p, Prompt) for p in items) and [p.messages[0]["content"] for p in items] == ["test q"]


def test_the_docs_blocks_of_the_eight_datasets_are_valid_config_and_touch_no_network(tmp_path, hub):
    from helpers import REPO

    text = (REPO / "docs" / "datasets.md").read_text()
    block = text.split("The eight datasets of the reference run", 1)[1].split("```toml\n", 1)[1].split("```", 1)[0]
    (tmp_path / "trajectories").mkdir()
    (tmp_path / "trajectories" / "run1.traj").write_text("{}")
    import tomllib

    data = {"run": {"dir": str(tmp_path / "run")}, **tomllib.loads(block)}
    cfg = parse_config(data, tmp_path / "config.toml")  # check_files: the local directory is checked, hf:// are not
    got = {d.name: (d.hub(), d.format) for d in cfg.datasets}
    assert got == {
        "b1_glaive": (HubRef("glaiveai/glaive-function-calling-v2"), "glaive"),
        "b2_opencodeinstruct": (HubRef("nvidia/OpenCodeInstruct"), "opencodeinstruct"),
        "b3_oss_instruct": (HubRef("ise-uiuc/Magicoder-OSS-Instruct-75K"), "oss_instruct"),
        "b3_evol_instruct": (HubRef("ise-uiuc/Magicoder-Evol-Instruct-110K"), "instruction"),
        "b4_mixture_of_thoughts": (HubRef("open-r1/Mixture-of-Thoughts", files="all/*"), "openai"),
        "b5_openthoughts": (HubRef("open-thoughts/OpenThoughts-114k"), "sharegpt"),
        "b6_ultrachat": (HubRef("HuggingFaceH4/ultrachat_200k", split="train_sft"), "openai"),
        "b7_sharegpt": (HubRef("anon8231489123/ShareGPT_Vicuna_unfiltered",
                               files="ShareGPT_V3_unfiltered_cleaned_split.json"), "sharegpt"),
        "b8_swe_agent": (None, "swe_agent"),
    }
    assert cfg.dataset("b8_swe_agent").path == tmp_path / "trajectories"
    assert hub.requests == []
