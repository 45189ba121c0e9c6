"""Train check (issue 36): speculators' ONLINE path reads our ``tokens-jsonl`` export through its own code.

Runs only where speculators is importable (``make train-check``: ``.venv-train``, speculators 0.9.0 with its
hs_connectors). The online path is ``prepare_data.py --data EXPORT_DIR`` then ``train.py --data-path PREPARED
--vllm-endpoint URL --on-missing generate``: the hidden states come from a live vLLM through an hs_connectors
transfer, nothing on disk. Everything that reads our data here is speculators' own code:
``load_raw_dataset`` (a directory: every ``*.jsonl`` under it) and ``build_speculator_training_dataset``
(pre-tokenized rows passed through) as ``prepare_data.py`` calls them, ``save_to_disk``, then
``speculators.train.data.ArrowDataset`` with ``on_missing="generate"``: ``build_client_item`` builds the
request, and the sample it returns carries the loss mask it read. Only the vLLM round trip is stood in for:
``generate_hidden_states`` (the Completions request, ``prompt`` = the token ids) records what it would send,
and the transfer's ``get_generated`` hands back hidden states of that length.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

data_mod = pytest.importorskip(
    "speculators.train.data",
    reason="speculators==0.9.0 is not installed here: `make train-check` runs this test in its own venv (.venv-train)")

from hs_connectors import HiddenStatesTransfer  # noqa: E402
from speculators.data_generation.preprocessing import build_speculator_training_dataset, load_raw_dataset  # noqa: E402

from engine.tokens.records import TokenRecord, write_jsonl  # noqa: E402

HIDDEN, LAYERS = 8, 4  # 3 aux layers + the last one
RECORDS = [
    TokenRecord(id="a:1", dataset="a", input_ids=[5, 163586, 17, 99999, 163585, 1], loss_mask=[0, 0, 0, 1, 1, 1],
                prompt_len=3, completion_len=3),
    TokenRecord(id="b:2", dataset="b", input_ids=[7, 8, 9, 10, 11], loss_mask=[0, 0, 1, 1, 1], prompt_len=2,
                completion_len=3),
]


class _Transfer(HiddenStatesTransfer):
    """hs_connectors' interface; ``get_generated`` returns states for the ids the request carried."""

    def get_cached(self, file_idx: int):
        return None

    def get_generated(self, params):
        ids = params["ids"]
        return {"hidden_states": torch.randn(len(ids), LAYERS, HIDDEN), "token_ids": torch.tensor(ids)}


def test_online_loader_reads_the_tokens_jsonl_export(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    export = tmp_path / "export"
    for r in RECORDS:  # `datagen export RUN --format tokens-jsonl --out export`: one file per dataset
        write_jsonl(export / f"{r.dataset}.jsonl", [r])
    raw, normalize = load_raw_dataset(str(export))
    assert normalize is None
    prepared = build_speculator_training_dataset(raw, processor=object(), max_length=64, num_proc=1)
    prepared.save_to_disk(str(tmp_path / "prepared"))

    sent: list[list[int]] = []

    def fake_generate(client, model, item, **kw):
        sent.append(list(item["input_ids"]))
        assert "messages" not in item  # text-only: the Completions API with our ids, never re-rendered
        return f"h{len(sent)}", {"ids": list(item["input_ids"])}

    monkeypatch.setattr(data_mod, "generate_hidden_states", fake_generate)
    ds = data_mod.ArrowDataset(max_len=64, datapath=str(tmp_path / "prepared"), transfer=_Transfer(),
                               on_missing="generate", model="m", hidden_states_dtype=torch.float32)
    ds.client = object()  # the vLLM endpoint is not reached: generate_hidden_states stands in for it
    assert len(ds) == len(RECORDS) and ds.approx_lengths == [len(r) for r in RECORDS]
    for i, r in enumerate(RECORDS):
        sample = ds[i]
        assert sent[i] == r.input_ids
        assert sample["input_ids"].tolist() == r.input_ids
        assert sample["loss_mask"].dtype == torch.int64 and sample["loss_mask"].tolist() == r.loss_mask
        assert tuple(sample["hidden_states"].shape) == (len(r), (LAYERS - 1) * HIDDEN)
