"""datagen's KV connector for vLLM's ``extract_hidden_states`` method (loaded by vLLM, never by datagen).

vLLM (>= 0.32) captures the hidden states of the layers named in the draft config's
``eagle_aux_hidden_state_layer_ids`` into a cache-only attention layer during prefill; a KV
connector then reads each finished request's slots out of that cache. vLLM's own
``ExampleHiddenStatesConnector`` writes one safetensors file per request and assumes CUDA (a
pinned host buffer and a CUDA event per copy), so it fails on vLLM's CPU backend. This connector
keeps vLLM's scheduler-side bookkeeping (inherited) and replaces the worker side: the request's
slots are gathered, copied to host memory synchronously (on any device) and sent over the
worker's socket (:mod:`engine.extract.onvllm.channel`) under the key the worker gave the request
(``kv_transfer_params = {"datagen_key": ...}``). Only tensor-parallel rank 0 sends (every rank
holds the same hidden states).

vLLM loads it from ``kv_transfer_config = {"kv_connector": "DatagenHiddenStatesConnector",
"kv_connector_module_path": "engine.extract.onvllm.connector", "kv_connector_extra_config":
{"datagen_socket": PATH}}`` (vLLM's ``kv_connector_module_path`` plugin interface).
Source: vllm/distributed/kv_transfer/kv_connector/v1/example_hidden_states_connector.py (vLLM 0.32);
docs/vllm-extraction.md.
"""

from __future__ import annotations

from typing import Any

import torch
from vllm.distributed.kv_transfer.kv_connector.v1.example_hidden_states_connector import (
    ExampleHiddenStatesConnector,
    ExampleHiddenStatesConnectorMetadata,
    PendingSave,
)

from engine.extract.onvllm.channel import CaptureClient


def gather_slots(kv_cache: torch.Tensor, block_ids: list[int], num_tokens: int) -> torch.Tensor:
    """The first ``num_tokens`` cached rows of a request, ``[T, n, H]``, on the cache's device.

    Args:
        kv_cache: the cache-only layer's buffer ``[num_blocks, n, block_size, H]`` (vLLM's
            ``LBNHC`` layout for this method).
        block_ids: the request's blocks in order; num_tokens: its prompt length T.
    """
    block = kv_cache.shape[2]
    ids = torch.tensor(block_ids, dtype=torch.long)
    slots = (torch.arange(block, dtype=torch.long).reshape(1, block) + ids.reshape(-1, 1) * block).flatten()
    slots = slots[:num_tokens].to(kv_cache.device)
    return kv_cache[slots // block, :, slots % block]


class DatagenHiddenStatesConnector(ExampleHiddenStatesConnector):
    """Sends each finished request's ``[T, n, H]`` capture to the extraction worker (module doc)."""

    def __init__(self, vllm_config: Any, role: Any, kv_cache_config: Any = None) -> None:
        super().__init__(vllm_config=vllm_config, role=role, kv_cache_config=kv_cache_config)
        path = self._kv_transfer_config.get_from_extra_config("datagen_socket", None)
        if not path:
            raise ValueError("DatagenHiddenStatesConnector needs kv_connector_extra_config.datagen_socket")
        self._client = CaptureClient(str(path))
        self._sent: set[str] = set()

    # -- worker side ------------------------------------------------------------------------------
    def wait_for_save(self) -> None:
        """No lock files: the worker waits on its socket, not on files."""

    def _submit_async_write(self, pending: PendingSave) -> None:
        """Gather the request's slots, copy them to host memory and send them (rank 0 only)."""
        if self._is_tp_rank_zero:
            assert self._kv_cache is not None
            n = int(pending.token_ids.shape[0])
            hidden = gather_slots(self._kv_cache, pending.block_ids, n).to("cpu")
            self._client.send(pending.filename, pending.token_ids.tolist(), hidden)
            self._sent.add(pending.req_id)  # only rank 0 reports (get_finished_count() is 1)

    def get_finished(self, finished_req_ids: set[str]) -> tuple[set[str] | None, set[str] | None]:
        """Send the captures of the requests vLLM finished; report them done (the copy is synchronous)."""
        if self.has_connector_metadata():
            meta = self._get_connector_metadata()
            if isinstance(meta, ExampleHiddenStatesConnectorMetadata):
                for pending in meta.pending_saves:
                    self._submit_async_write(pending)
        self._accumulated_finished_req_ids.update(finished_req_ids)
        done = self._accumulated_finished_req_ids & self._sent
        self._accumulated_finished_req_ids -= done
        self._sent -= done
        return done or None, None

    # -- scheduler side ---------------------------------------------------------------------------
    def request_finished(self, request: Any, block_ids: list[int]) -> tuple[bool, dict[str, Any] | None]:
        """Keep the request's blocks until the worker side has read them; the pending save carries the
        worker's key (in ``PendingSave.filename``)."""
        self._request_filenames.pop(request.request_id, None)
        params = request.kv_transfer_params or {}
        key = params.get("datagen_key")
        if key is None or request.prompt_token_ids is None:
            return False, None
        self._pending_saves[request.request_id] = PendingSave(
            req_id=request.request_id, filename=str(key),
            token_ids=torch.tensor(request.prompt_token_ids, dtype=torch.long), block_ids=list(block_ids))
        return True, {"datagen_key": key}
