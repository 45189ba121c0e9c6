"""Built-in OpenRouter simulator: the default provider, the users' rehearsal tool, and the server
every network test talks to over 127.0.0.1.

It reproduces the wire protocol of ``shared/reference/openrouter.md`` (SSE comments, both usage
placements, mid-stream errors, padding, 429 headers, 402 credits, cancellation billing) with
deterministic text: the answer is a function of ``(seed, prompt_key(messages, tools))``.

Public API::

    SimConfig, parse_faults, add_sim_arguments, sim_config_from_args, FAULT_KINDS
    SimServer (async: start/stop, base_url, port, ledger)
    SimThread (own loop in a daemon thread: start() -> base_url, stop(), context manager)
    serve_forever(cfg)
"""

from .config import FAULT_KINDS, SimConfig, add_sim_arguments, parse_faults, sim_config_from_args
from .ledger import GenerationRecord, Ledger
from .server import SimServer, SimThread, serve_forever

__all__ = [
    "FAULT_KINDS",
    "GenerationRecord",
    "Ledger",
    "SimConfig",
    "SimServer",
    "SimThread",
    "add_sim_arguments",
    "parse_faults",
    "serve_forever",
    "sim_config_from_args",
]
