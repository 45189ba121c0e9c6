"""B8 from the Hugging Face Hub: the two public forms of SWE-agent trajectories read by ``format = "swe_agent"``.

- SWE-bench/SWE-smith-trajectories: Parquet ``data/{tool,xml,ticks}-0000K-of-00008.parquet``, columns
  ``messages`` (the JSON TEXT of the message list), ``instance_id``, ``resolved``, ``model``, ``traj_id``,
  ``patch``; split ``tool`` holds SWE-agent history messages (``tool_calls``, ``tool_call_ids``, user/tool
  content as text parts), splits ``xml``/``ticks`` plain ``{role, content}`` turns.
- nebius/SWE-agent-trajectories: Parquet ``data/train-*``, column ``trajectory``: list of ``{cutoff_date,
  mask, role: system|user|ai, system_prompt, text}`` steps (+ ``instance_id``, ``model_name``, ``target``,
  ``exit_status``, ``generated_patch``, ``eval_logs``).

Schemas and sources: docs/datasets.md, "B8 on the Hub". Rows are built here in those shapes (no data file
of either dataset is bundled), read through the real adapters (a local file), then as Hub datasets served by
the loopback fake Hub (:mod:`fakehub`) end to end, and the B8 Hub block of docs/datasets.md is ingested as
written.
"""

from __future__ import annotations

import json
import tomllib

from fakehub import jsonl, parquet
from helpers import REPO, make_config

from engine.config import parse_config
from engine.datasets import detect_format, iter_prompts
from engine.datasets import hub as hubs
from engine.datasets.hub import HubRef
from engine.prompts import Prompt, Reject
from engine.run.ingest import ingest_all
from engine.storage.store import Store

SMITH = "SWE-bench/SWE-smith-trajectories"
NEBIUS = "nebius/SWE-agent-trajectories"

# ----------------------------------------------------------------------------- SWE-smith rows (split tool)

SMITH_SYSTEM = ("You are a helpful assistant that can interact with a computer to solve tasks.\n<IMPORTANT>\n"
                "* If user provides a path, you should NOT assume it's relative to the current working directory. "
                "Instead, you should explore the file system to find the file before working on it.\n</IMPORTANT>")


def smith_task(title: str) -> str:
    return ("<uploaded_files>\n/testbed\n</uploaded_files>\nI've uploaded a python code repository in the directory "
            f"/testbed. Consider the following PR description:\n\n<pr_description>\n# {title}\n</pr_description>\n\n"
            "Can you help me implement the necessary changes to the repository so that the requirements specified in "
            "the <pr_description> are met?")


GREP = "grep -n \"def index\" /testbed/src/pptx/slide.py"
GREP_CALL = {"function": {"arguments": json.dumps({"command": GREP}), "name": "bash"},
             "id": "toolu_01DmPr3vQ8YFgqgkUfG8Cg2D", "type": "function"}
EDIT_ARGS = {"command": "str_replace", "path": "/testbed/src/pptx/slide.py",
             "old_str": "            if s.slide_id == slide.slide_id:", "new_str": "            if s == slide:"}
EDIT_CALL = {"function": {"arguments": json.dumps(EDIT_ARGS), "name": "str_replace_editor"},
             "id": "toolu_01Jw8C5kq7ZbTnV2YhB6pXfR", "type": "function"}
SUBMIT_CALL = {"function": {"arguments": "{}", "name": "submit"}, "id": "toolu_01QmA9dG4sVx7LbE2nHcKuTy",
               "type": "function"}
GREP_OUT = "OBSERVATION:\n263:    def index(self, slide: Slide) -> int:"
EDIT_OUT = ("OBSERVATION:\nThe file /testbed/src/pptx/slide.py has been edited. Here's the result of running `cat -n` "
            "on a snippet of /testbed/src/pptx/slide.py:\n   265\t        for idx, s in enumerate(self):\n"
            "   266\t            if s == slide:\n   267\t                return idx\nReview the changes and make sure "
            "they are as expected. Edit the file again if necessary.")


def parts(text: str) -> list[dict]:
    """User/tool content as SWE-agent writes it: a list of text parts."""
    return [{"type": "text", "text": text}]


def action(content: str, act: str, call: dict) -> dict:
    return {"role": "assistant", "content": content, "thought": content, "action": act, "agent": "main",
            "tool_calls": [call], "message_type": "action"}


def observation(text: str, call: dict) -> dict:
    return {"role": "tool", "content": parts(text), "agent": "main", "message_type": "observation",
            "tool_call_ids": [call["id"]]}


def smith_tool_messages(title: str, submitted: bool) -> list[dict]:
    """One trajectory of the ``tool`` split: SWE-agent history messages. ``submitted``: ends on the final
    submit action (an older run's ``messages[:-1]``), else on the observation before it (SWE-agent 1.1's
    ``query``)."""
    msgs = [
        {"role": "system", "content": SMITH_SYSTEM, "agent": "main", "message_type": "system_prompt"},
        {"role": "user", "content": parts(smith_task(title)), "agent": "main", "message_type": "observation"},
        action("Let me find the `index` method of `Slides`:", GREP, GREP_CALL),
        observation(GREP_OUT, GREP_CALL),
        action("The method compares slide ids. Let's compare the slides themselves:",
               "str_replace_editor str_replace /testbed/src/pptx/slide.py   --old_str '            if s.slide_id == "
               "slide.slide_id:' --new_str '            if s == slide:'", EDIT_CALL),
        observation(EDIT_OUT, EDIT_CALL),
    ]
    if submitted:
        msgs.append(action("The fix is in place. Let's submit it.", "submit", SUBMIT_CALL))
    return msgs


def smith_row(messages: list[dict] | str, instance: str) -> dict:
    """A row of SWE-smith-trajectories: ``messages`` is JSON text."""
    text = messages if isinstance(messages, str) else json.dumps(messages)
    return {"messages": text, "instance_id": instance, "resolved": True, "model": "claude-3-7-sonnet-20250219",
            "traj_id": f"{instance}.8qa84d2e", "patch": "diff --git a/src/pptx/slide.py b/src/pptx/slide.py\n"}


def smith_prompt(title: str) -> list[dict]:
    """What a tool-split trajectory of :func:`smith_tool_messages` becomes."""
    def call(c: dict) -> dict:
        return {"id": c["id"], "type": "function", "function": {"name": c["function"]["name"],
                                                                 "arguments": c["function"]["arguments"]}}
    return [
        {"role": "system", "content": SMITH_SYSTEM},
        {"role": "user", "content": smith_task(title)},
        {"role": "assistant", "content": "Let me find the `index` method of `Slides`:", "tool_calls": [call(GREP_CALL)]},
        {"role": "tool", "content": GREP_OUT, "tool_call_id": GREP_CALL["id"]},
        {"role": "assistant", "content": "The method compares slide ids. Let's compare the slides themselves:",
         "tool_calls": [call(EDIT_CALL)]},
        {"role": "tool", "content": EDIT_OUT, "tool_call_id": EDIT_CALL["id"]},
    ]


TITLE_A = "Slides.index() fails to find a slide held by another Slide object"
TITLE_B = "Slides.index() compares slide ids instead of slides"
SMITH_GOOD_QUERY = smith_row(smith_tool_messages(TITLE_A, submitted=False), "scanny__python-pptx.278b47b1.func_pm_op_change__k2zqz1fj")
SMITH_GOOD_SUBMIT = smith_row(smith_tool_messages(TITLE_B, submitted=True), "scanny__python-pptx.278b47b1.func_pm_ctrl_invert_if__r8u5bh1s")
#: A download cut short: the JSON text stops mid-string.
SMITH_TRUNCATED = smith_row(json.dumps(smith_tool_messages(TITLE_A, submitted=False))[:60], "scanny__python-pptx.278b47b1.lm_rewrite__0")
_NO_ID = {k: v for k, v in GREP_CALL.items() if k != "id"}
SMITH_CALL_WITHOUT_ID = smith_row([*smith_tool_messages(TITLE_A, False)[:2], action("Let me look:", GREP, _NO_ID),
                                   observation(GREP_OUT, GREP_CALL)], "scanny__python-pptx.278b47b1.lm_rewrite__1")
SMITH_TRUNCATED_REASON = ("swe_agent: field 'messages' is a string but not JSON: Unterminated string starting at: "
                          "line 1 column 32 (char 31)")
SMITH_NO_ID_REASON = "swe_agent: message 3: tool_calls is not a list of calls: call 1 has no 'id' (a non-empty string)"

# ----------------------------------------------------------------------------- SWE-smith rows (split xml)

XML_MESSAGES = [
    {"role": "system", "content": SMITH_SYSTEM + "\n\nYou have access to the following functions:\n\n---- BEGIN "
                                                 "FUNCTION #1: bash ----\nDescription: Execute a bash command in the "
                                                 "terminal.\n---- END FUNCTION #1 ----"},
    {"role": "user", "content": smith_task(TITLE_A)},
    {"role": "assistant", "content": f"Let me find the `index` method of `Slides`:\n\n<function=bash>\n"
                                     f"<parameter=command>{GREP}</parameter>\n</function>"},
    {"role": "user", "content": GREP_OUT},
]

# ----------------------------------------------------------------------------- nebius rows

NEBIUS_SYSTEM = ("SETTING: You are an autonomous programmer, and you're working directly in the command line with a "
                 "special interface.\n\nThe special interface consists of a file editor that shows you 100 lines of a "
                 "file at a time.")
NEBIUS_ISSUE = ("We're currently solving the following issue within our repository. Here's the issue text:\nISSUE:\n"
                "Add support for `summary` and `description` fields for paths\n\nINSTRUCTIONS:\nNow, you're going to "
                "solve this issue on your own.\n\n(Open file: n/a)\n(Current directory: /apispec)\nbash-$")
NEBIUS_AI_1 = ("The term \"paths\" should be defined in the `apispec` package. Let's search for it.\n```\n"
               "search_dir \"paths\" apispec\n```")
NEBIUS_OUT_1 = ("Found 7 matches for \"paths\" in /apispec/apispec:\n/apispec/apispec/core.py (5 matches)\n"
                "/apispec/apispec/ext/marshmallow/openapi.py (2 matches)\nEnd of matches for \"paths\" in "
                "/apispec/apispec\n\n(Open file: n/a)\n(Current directory: /apispec)\nbash-$")
NEBIUS_SUBMIT = "The `summary` and `description` fields are now supported. Let's submit.\n```\nsubmit\n```"


def step(role: str, text: str | None, system_prompt: str | None = None) -> dict:
    """One ``trajectory`` step as published: every key present, nulls included."""
    return {"cutoff_date": "01.01.2023" if role == "system" else None, "mask": role == "ai", "role": role,
            "system_prompt": system_prompt, "text": text}


def nebius_row(trajectory: list[dict], instance: str, target: bool = True) -> dict:
    return {"instance_id": instance, "model_name": "swe-agent-llama-70b", "target": target, "trajectory": trajectory,
            "exit_status": "submitted", "generated_patch": "diff --git a/apispec/core.py b/apispec/core.py\n",
            "eval_logs": "Will execute following command for apply_patch: ..."}


NEBIUS_STEPS = [step("system", None, NEBIUS_SYSTEM), step("user", NEBIUS_ISSUE), step("ai", NEBIUS_AI_1),
                step("user", NEBIUS_OUT_1), step("ai", NEBIUS_SUBMIT)]
NEBIUS_GOOD = nebius_row(NEBIUS_STEPS, "marshmallow-code__apispec-382")
NEBIUS_GOOD_PROMPT = [{"role": "system", "content": NEBIUS_SYSTEM}, {"role": "user", "content": NEBIUS_ISSUE},
                      {"role": "assistant", "content": NEBIUS_AI_1}, {"role": "user", "content": NEBIUS_OUT_1}]
#: Ends on the environment's answer (a run stopped by its cost limit): the whole trajectory is the prompt.
NEBIUS_OPEN = nebius_row(NEBIUS_STEPS[:2], "marshmallow-code__apispec-383", target=False)
NEBIUS_WRONG_ROLE = nebius_row([*NEBIUS_STEPS[:2], {**step("ai", NEBIUS_AI_1), "role": "assistant"}, *NEBIUS_STEPS[3:]],
                               "marshmallow-code__apispec-384")
NEBIUS_NULL_TEXT = nebius_row([*NEBIUS_STEPS[:3], step("user", None), NEBIUS_STEPS[4]], "marshmallow-code__apispec-385")
NEBIUS_WRONG_ROLE_REASON = "swe_agent: message 3: unknown role 'assistant' (nebius roles: 'system', 'user', 'ai')"
NEBIUS_NULL_TEXT_REASON = "swe_agent: message 4: null content"


# ----------------------------------------------------------------------------- helpers


def split(items) -> tuple[list[tuple[str, list[dict]]], list[tuple[str, str]]]:
    items = list(items)
    assert all(isinstance(i, (Prompt, Reject)) for i in items)
    return ([(p.source, p.messages) for p in items if isinstance(p, Prompt)],
            [(r.source, r.reason) for r in items if isinstance(r, Reject)])


SMITH_FILES = {
    "README.md": b"---\nlicense: mit\nconfigs:\n- config_name: default\n  data_files:\n  - split: tool\n    path: data/tool-*\n"
                 b"  - split: xml\n    path: data/xml-*\n  - split: ticks\n    path: data/ticks-*\n---\n",
    ".gitattributes": b"*.parquet filter=lfs diff=lfs merge=lfs -text\n",
    "data/tool-00000-of-00002.parquet": parquet([SMITH_GOOD_QUERY, SMITH_TRUNCATED]),
    "data/tool-00001-of-00002.parquet": parquet([SMITH_CALL_WITHOUT_ID, SMITH_GOOD_SUBMIT]),
    "data/xml-00000-of-00001.parquet": parquet([smith_row(XML_MESSAGES, "scanny__python-pptx.278b47b1.func_pm_op_change__k2zqz1fj")]),
    "data/ticks-00000-of-00001.parquet": parquet([smith_row([{"role": "user", "content": "ticks"}], "t")]),
}
NEBIUS_FILES = {
    "README.md": b"---\nconfigs:\n- config_name: default\n  data_files:\n  - split: train\n    path: data/train-*\n---\n",
    "data/train-00000-of-00002.parquet": parquet([NEBIUS_GOOD, NEBIUS_WRONG_ROLE]),
    "data/train-00001-of-00002.parquet": parquet([NEBIUS_NULL_TEXT, NEBIUS_OPEN]),
}


# ----------------------------------------------------------------------------- the adapters, local files


def test_swe_smith_rows_through_the_swe_agent_adapter(tmp_path):
    path = tmp_path / "smith.jsonl"
    path.write_bytes(jsonl([SMITH_GOOD_QUERY, SMITH_GOOD_SUBMIT, SMITH_TRUNCATED, SMITH_CALL_WITHOUT_ID]))
    items = list(iter_prompts(path, "swe_agent"))
    prompts, rejects = split(items)
    assert prompts == [(f"{path}:1", smith_prompt(TITLE_A)), (f"{path}:2", smith_prompt(TITLE_B))]
    # the first ends on its last observation (whole), the second on the submit action (cut before it)
    assert [(p.became.ended_on, p.became.cut_at) for p in items[:2]] == [("tool", ""), ("assistant", "message 7")]
    assert rejects == [(f"{path}:3", SMITH_TRUNCATED_REASON), (f"{path}:4", SMITH_NO_ID_REASON)]


def test_swe_smith_messages_need_the_swe_agent_format(tmp_path):
    """A ``messages`` string is not detected (other datasets store OpenAI messages as JSON text): the reject says
    which format reads it."""
    path = tmp_path / "smith.jsonl"
    path.write_bytes(jsonl([SMITH_GOOD_QUERY]))
    assert detect_format(SMITH_GOOD_QUERY) is None
    assert split(iter_prompts(path)) == ([], [(f"{path}:1", "unrecognised row format: field 'messages' is a str, expected a "
                                                            "list (openai); messages as JSON text (SWE-smith trajectories) "
                                                            "are read by format = \"swe_agent\"")])


def test_nebius_rows_through_the_swe_agent_adapter(tmp_path):
    path = tmp_path / "nebius.jsonl"
    path.write_bytes(jsonl([NEBIUS_GOOD, NEBIUS_WRONG_ROLE, NEBIUS_NULL_TEXT, NEBIUS_OPEN]))
    assert detect_format(NEBIUS_GOOD) == "swe_agent"
    for fmt in ("swe_agent", "auto"):
        items = list(iter_prompts(path, fmt))
        assert split(items) == (
            [(f"{path}:1", NEBIUS_GOOD_PROMPT), (f"{path}:4", NEBIUS_GOOD_PROMPT[:2])],
            [(f"{path}:2", NEBIUS_WRONG_ROLE_REASON), (f"{path}:3", NEBIUS_NULL_TEXT_REASON)])
        assert [(p.became.ended_on, p.became.cut_at) for p in items if isinstance(p, Prompt)] == [
            ("assistant", "message 5"), ("user", "")]


def test_the_forms_and_what_a_row_without_one_gets(tmp_path):
    """``history`` (a .traj) wins over the other fields; a row with none of the three is named with all three; a
    .traj without its ``history`` is not mistaken for nebius steps."""
    traj_steps = [{"action": "ls", "observation": "a.py", "response": "ls", "thought": "", "state": "{}"}]
    rows = [
        {"history": [{"role": "user", "content": "from history"}], "messages": "not read", "trajectory": traj_steps},
        {"info": {"exit_status": "submitted"}},
        {"trajectory": traj_steps, "info": {}},
    ]
    path = tmp_path / "forms.jsonl"
    path.write_bytes(jsonl(rows))
    assert split(iter_prompts(path, "swe_agent")) == (
        [(f"{path}:1", [{"role": "user", "content": "from history"}])],
        [(f"{path}:2", "swe_agent: missing field 'history' (a SWE-agent .traj), 'messages' (SWE-smith trajectories) "
                       "or 'trajectory' (nebius/SWE-agent-trajectories)"),
         (f"{path}:3", "swe_agent: message 1: missing field 'role' (a .traj step, not a message: a .traj's messages "
                       "are its 'history', which this row lacks)")])
    assert detect_format(rows[2]) is None


# ----------------------------------------------------------------------------- as Hub datasets


def test_swe_smith_tool_split_from_the_hub(hub):
    sha = hub.commit(SMITH, SMITH_FILES)
    rev = hubs.resolve(HubRef(SMITH, split="tool"))
    assert (rev.sha, rev.files, rev.pattern) == (
        sha, ("data/tool-00000-of-00002.parquet", "data/tool-00001-of-00002.parquet"), "data/tool-*, data/tool.*")
    base = f"hf://datasets/{SMITH}/data"
    assert split(iter_prompts(hubs.download(rev), "swe_agent")) == (
        [(f"{base}/tool-00000-of-00002.parquet:1", smith_prompt(TITLE_A)),
         (f"{base}/tool-00001-of-00002.parquet:2", smith_prompt(TITLE_B))],
        [(f"{base}/tool-00000-of-00002.parquet:2", SMITH_TRUNCATED_REASON),
         (f"{base}/tool-00001-of-00002.parquet:1", SMITH_NO_ID_REASON)])
    xml = hubs.download(hubs.resolve(HubRef(SMITH, split="xml")))
    assert split(iter_prompts(xml, "swe_agent")) == ([(f"{base}/xml-00000-of-00001.parquet:1", XML_MESSAGES)], [])


def test_nebius_from_the_hub(hub):
    hub.commit(NEBIUS, NEBIUS_FILES)
    rev = hubs.resolve(HubRef(NEBIUS))
    assert rev.files == ("data/train-00000-of-00002.parquet", "data/train-00001-of-00002.parquet")
    base = f"hf://datasets/{NEBIUS}/data"
    for fmt in ("swe_agent", "auto"):  # Parquet's null fields (text on the system step) are dropped on reading
        assert split(iter_prompts(hubs.download(rev), fmt)) == (
            [(f"{base}/train-00000-of-00002.parquet:1", NEBIUS_GOOD_PROMPT),
             (f"{base}/train-00001-of-00002.parquet:2", NEBIUS_GOOD_PROMPT[:2])],
            [(f"{base}/train-00000-of-00002.parquet:2", NEBIUS_WRONG_ROLE_REASON),
             (f"{base}/train-00001-of-00002.parquet:1", NEBIUS_NULL_TEXT_REASON)])


def docs_b8_hub_block() -> list[dict]:
    text = (REPO / "docs" / "datasets.md").read_text()
    block = text.split("B8 from the Hub, without local `.traj` files", 1)[1].split("```toml\n", 1)[1].split("```", 1)[0]
    return tomllib.loads(block)["datasets"]


async def test_the_docs_b8_hub_block_ingests_end_to_end(tmp_path, hub):
    """The B8 Hub entries of docs/datasets.md, as written, against the fake Hub: resolved, downloaded, read, stored; bad rows
    stored as rejects with their file:row and reason."""
    entries = docs_b8_hub_block()
    cfg = parse_config({"run": {"dir": str(tmp_path / "run")}, "datasets": entries}, tmp_path / "config.toml")
    assert {d.name: (d.hub(), d.format) for d in cfg.datasets} == {
        "b8_swe_agent": (HubRef(SMITH, split="tool"), "swe_agent"),
        "b8_swe_agent_nebius": (HubRef(NEBIUS), "swe_agent")}
    assert hub.requests == []  # validating the config touches no network

    smith_sha, nebius_sha = hub.commit(SMITH, SMITH_FILES), hub.commit(NEBIUS, NEBIUS_FILES)
    cfg = make_config(tmp_path, entries)
    store = await Store.open(cfg.run.dir)
    try:
        reports = {r.dataset: r for r in await ingest_all(cfg, store)}
        got = {name: (r.revision, r.hub_files, r.prompts, r.rejected, r.whole, r.cut) for name, r in reports.items()}
        assert got == {"b8_swe_agent": (smith_sha, 2, 2, 2, 1, 1), "b8_swe_agent_nebius": (nebius_sha, 2, 2, 2, 1, 1)}
        rows = await (await store.conn.execute("SELECT dataset, source, messages FROM prompts ORDER BY id")).fetchall()
        smith, neb = f"hf://datasets/{SMITH}/data", f"hf://datasets/{NEBIUS}/data"
        assert [(d, s, json.loads(m)) for d, s, m in rows] == [
            ("b8_swe_agent", f"{smith}/tool-00000-of-00002.parquet:1", smith_prompt(TITLE_A)),
            ("b8_swe_agent", f"{smith}/tool-00001-of-00002.parquet:2", smith_prompt(TITLE_B)),
            ("b8_swe_agent_nebius", f"{neb}/train-00000-of-00002.parquet:1", NEBIUS_GOOD_PROMPT),
            ("b8_swe_agent_nebius", f"{neb}/train-00001-of-00002.parquet:2", NEBIUS_GOOD_PROMPT[:2])]
        rejects = await (await store.conn.execute("SELECT dataset, source, reason FROM rejects ORDER BY id")).fetchall()
        assert [tuple(r) for r in rejects] == [
            ("b8_swe_agent", f"{smith}/tool-00000-of-00002.parquet:2", SMITH_TRUNCATED_REASON),
            ("b8_swe_agent", f"{smith}/tool-00001-of-00002.parquet:1", SMITH_NO_ID_REASON),
            ("b8_swe_agent_nebius", f"{neb}/train-00000-of-00002.parquet:2", NEBIUS_WRONG_ROLE_REASON),
            ("b8_swe_agent_nebius", f"{neb}/train-00001-of-00002.parquet:1", NEBIUS_NULL_TEXT_REASON)]
    finally:
        await store.close()
