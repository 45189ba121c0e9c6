"""Built-in OpenRouter simulator: the default provider, the users' rehearsal tool, and the server
every network test talks to over 127.0.0.1.

It reproduces the wire protocol of ``docs/openrouter.md`` (SSE comments, both usage
placements, mid-stream errors, padding, 429 headers, 402 credits, cancellation billing) with
deterministic text: the answer is a function of ``(seed, prompt_key(messages, tools))``.

Model-backed (rehearsal of provider fidelity, issue 35): with ``SimConfig.target`` the completions
are sampled token by token from a small causal LM (:mod:`.backend`), per provider as its behaviour
says (:mod:`.behaviours`: honest, fake-quantized weights :mod:`.quant`, a drifted temperature, a mix);
``python -m engine.sim.rehearsal DIR`` builds the kit it serves (:mod:`.rehearsal`, :mod:`.wordtok`).
``GET /models/{author}/{slug}/endpoints`` lists one endpoint per provider (:mod:`.endpoints`).

The fault specification (``FAULT_KINDS``, ``parse_faults``) lives beside this package in
:mod:`engine.simfaults`, a pure module, so ``engine.config`` checks ``[provider.sim] faults`` without
importing the simulator (which imports the tokenizer, which imports the config: a cycle).

Public API, imported lazily (PEP 562: ``import engine.sim`` or ``engine.sim.config`` alone loads no
server, generator or tokenizer code)::

    SimConfig, parse_faults, add_sim_arguments, sim_config_from_args, FAULT_KINDS
    SimServer (async: start/stop, base_url, port, ledger)
    SimThread (own loop in a daemon thread: start() -> base_url, stop(), context manager)
    serve_forever(cfg)
"""

from __future__ import annotations

from engine.lazy import lazy_exports

#: Public name -> the submodule that defines it.
_EXPORTS = {
    "FAULT_KINDS": "config",
    "parse_faults": "config",
    "validate_faults": "config",
    "SimConfig": "config",
    "add_sim_arguments": "config",
    "sim_config_from_args": "config",
    "GenerationRecord": "ledger",
    "Ledger": "ledger",
    "SimServer": "server",
    "SimThread": "server",
    "serve_forever": "server",
}

__all__ = sorted(_EXPORTS)


__getattr__ = lazy_exports(__name__, _EXPORTS)


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_EXPORTS))
