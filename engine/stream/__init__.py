"""The data plane: stream-worker processes that hold the HTTP connections, parse SSE and assemble
completions, each on its own event loop, so the control plane's loop (scheduler, budgets,
controller, store writer, dashboard) grows with results and commands, not with SSE events.

- :mod:`engine.stream.wire`: the frames between the run and a worker (length-prefixed pickles over
  a socket pair) and the conversions of completions and errors.
- :mod:`engine.stream.journal`: each worker's append-only journal of finished completions (group
  fsync before the result is sent) and its in-flight ledger; reading and pruning them.
- :mod:`engine.stream.worker`: the worker process (``python -m engine.stream.worker FD``).
- :mod:`engine.stream.pool`: the run's side: starts the workers, sends requests, applies batched
  progress, cancels, notices a dead worker and replaces it, and a silent (frozen) one; its figures
  are :mod:`engine.stream.figures`.
- :mod:`engine.stream.liveness`: heartbeats, and the worker's clock that leaves out the time its
  loop did not run (a stopped worker judges stalls by the time it ran).
- :mod:`engine.stream.recover`: at start, completions journaled but not committed are stored, and
  streams cut by a kill are counted as lost spend (the files of earlier processes only).
"""
