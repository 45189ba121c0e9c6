"""A stream worker: ``python -m engine.stream.worker FD`` (started by :mod:`engine.stream.pool`).

It owns its event loop, its HTTP connection pools (one :class:`~engine.client.chat.ChatClient`
per endpoint) and its share of the streams. Per request it runs ONE attempt (retries, budgets and
every decision stay with the run) and answers with one message:

- a finished completion is appended to the journal and fsynced first (:mod:`engine.stream.journal`),
  then sent as ``done``: whatever is killed afterwards, the paid completion is on disk;
- a failure is sent as ``err`` with the :class:`~engine.client.types.RequestError`'s fields;
- a ``cancel`` closes the stream's connection (the provider sees the disconnect) and answers ``gone``;
- a request held before its first byte was written answers ``unsent`` (nothing reached the provider).

Holds: ``("hold", Hold)`` is the run's whole hold state (:class:`~engine.stream.hold.Hold`: the run
paused, the datasets paused or skipped). On it, every request it covers whose bytes have not started to go out (its task not run
yet, waiting for a pooled connection, connecting) is cut and answered ``unsent`` at once; a ``req`` it
covers is answered ``unsent`` as it arrives. Whether a request's bytes went out is known per stream
from the client's ``gate`` (httpcore's ``trace`` hook as the request headers start to be written):
one check per request, nothing per chunk; before it lets a request go, the frames the run already
wrote are read (a hold among them applies first). The heartbeat carries how many requests wait unsent.

Progress (tokens received, generation id, provider, status) goes to the run in one batched ``prog``
message every ``progress_s`` (100 ms), not one per SSE event; the in-flight ledger is rewritten every
``ledger_s``. The worker ignores the terminal's signals (the run decides when it stops) and dies with
the run: on ``close``, on the socket's end, or by the kernel (``PR_SET_PDEATHSIG``).

It sends a heartbeat (``hb``) every :data:`~engine.stream.liveness.HEARTBEAT_S` with the time its
loop was found not running. Its loop (:class:`RunningTimeLoop`) keeps time only while it runs: a
worker stopped for 30 s (``SIGSTOP``) and continued judges its streams' stall and total timeouts
without those 30 s, and reads the bytes that arrived meanwhile before any of them is due, so a
stream the provider finished during the stop is stored, not cut as a stall and bought again.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import os
import selectors
import socket
import sys
import time
from collections.abc import Callable

from engine.client.accumulate import StreamProgress
from engine.client.aiochoice import stream_backend
from engine.client.chat import ChatClient
from engine.client.fleet import shown_url
from engine.client.types import ChatRequest, Completion, ErrorClass, RequestError
from engine.stream import journal
from engine.stream.hold import Hold
from engine.stream.liveness import HEARTBEAT_S, FreezeClock
from engine.stream.wire import FrameReader, StreamHeld, WorkerInit, encode, error_fields, open_frames, read_frame

log = logging.getLogger("engine.stream.worker")

#: Loop turns a request about to be sent waits, at most, for the command loop to read the frames the
#: run already wrote (a ``hold`` among them is applied before the request leaves).
GATE_YIELDS = 20


class _WatchedSelector(selectors.DefaultSelector):
    """The default selector, timing each wait for :class:`FreezeClock`."""

    def __init__(self, clock: FreezeClock, on_gap: Callable[[float], None]) -> None:
        super().__init__()
        self.clock = clock
        self.on_gap = on_gap

    def select(self, timeout: float | None = None):  # selectors.BaseSelector.select, timed
        before = time.monotonic()
        try:
            return super().select(timeout)
        finally:
            gap = self.clock.observe(before, time.monotonic(), timeout)
            if gap:
                self.on_gap(gap)


class RunningTimeLoop(asyncio.SelectorEventLoop):
    """An event loop whose :meth:`time` counts only the time it ran: ``time.monotonic()`` less the
    gaps :class:`~engine.stream.liveness.FreezeClock` found (a stopped process, a blocked loop).

    Every timer and timeout on it (``asyncio.timeout``, ``call_later``, httpx's read timeout through
    anyio) is measured on that clock. The gap is known as the wait for I/O that spans it returns,
    before the loop looks at its timers: the sockets that became readable meanwhile are served
    first, and no timer falls due because of the gap.
    """

    def __init__(self) -> None:
        self.freeze = FreezeClock()
        #: ``on_freeze(gap_s)`` runs on the loop (soon) after each gap found.
        self.on_freeze: Callable[[float], None] | None = None
        super().__init__(_WatchedSelector(self.freeze, self._gap))

    def _gap(self, gap: float) -> None:
        if self.on_freeze is not None:
            self.call_soon(self.on_freeze, gap)

    def time(self) -> float:
        return time.monotonic() - self.freeze.frozen_s


class _Stream:
    """One request in this worker: its task, progress and what was last reported of it; ``out``:
    its bytes started to go out (past the gate)."""

    __slots__ = ("rid", "req", "task", "progress", "started", "sent", "out")

    def __init__(self, rid: int, req: ChatRequest) -> None:
        self.rid = rid
        self.req = req
        self.task: asyncio.Task | None = None
        self.progress = StreamProgress()
        self.started = time.time()
        self.sent: tuple = ()
        self.out = False


class Worker:
    """The worker's state on its loop.

    Args:
        init: the pool's :class:`~engine.stream.wire.WorkerInit`.
        reader, writer: the socket to the run (:func:`engine.stream.wire.open_frames`: the reader counts its unread bytes).
        sock: that socket itself (None: unknown), peeked at before a request's first byte is written
            (:meth:`_gate`).
    """

    def __init__(self, init: WorkerInit, reader: FrameReader, writer: asyncio.StreamWriter,
                 sock: socket.socket | None = None) -> None:
        self.init = init
        self.reader = reader
        self.writer = writer
        self.sock = sock
        backend = {"http_backend": stream_backend()}  # aiohttp unless DATAGEN_STREAM_HTTP=httpx
        self.clients = [ChatClient(url, init.api_key, **{**backend, **init.client}) for url in init.endpoints]
        self.streams: dict[int, _Stream] = {}
        self.jdir = journal.journal_dir(init.journal_dir) if init.journal_dir else None
        self.journal = journal.JournalWriter(self.jdir, init.slot, os.getpid()) if self.jdir else None
        self.ledger = journal.ledger_path(self.jdir, init.slot, os.getpid()) if self.jdir else None
        self._pending: list[tuple[_Stream, Completion, bytes]] = []
        self._wake = asyncio.Event()
        self._closing = False
        self._journal_failed = False
        self.holding = Hold()  # what may not leave (the run's pause, datasets paused or skipped)
        self.unsent = 0  # requests here whose bytes have not started to go out
        self.unsent_peak = 0  # the most of them since the last heartbeat

    def send(self, msg: tuple) -> None:
        """Queue one frame to the run (the socket's buffer absorbs bursts)."""
        if not self.writer.is_closing():
            self.writer.write(encode(msg))

    # ---- requests ----------------------------------------------------------------------------
    def start(self, rid: int, endpoint: int, req: ChatRequest) -> None:
        if self.holding.covers(req):
            self.send(("unsent", rid))
            return
        s = _Stream(rid, req)
        self.streams[rid] = s
        self.unsent += 1
        self.unsent_peak = max(self.unsent_peak, self.unsent)
        s.task = asyncio.get_running_loop().create_task(self._run(s, endpoint))
        s.task.add_done_callback(lambda t: self._ended(s, t))

    async def _gate(self, s: _Stream) -> None:
        """Right before ``s``'s first byte is written: raise :class:`StreamHeld` when held, else mark it out.

        A ``hold`` the run has already written may still wait unread (a busy loop reads frames late):
        while frames from the run wait, the command loop reads them first (a few loop turns at most,
        :data:`GATE_YIELDS`), so nothing leaves after the run wrote its hold."""
        for _ in range(GATE_YIELDS):
            if not self._frames_waiting():
                break
            await asyncio.sleep(0)
        if self.holding.covers(s.req):
            raise StreamHeld("held before it was sent")
        if not s.out:  # once: a connection the pool finds gone re-runs it on another, nothing sent before
            s.out = True
            self.unsent -= 1

    def _frames_waiting(self) -> bool:
        """Whether the run wrote bytes this worker has not parsed yet: in its reader's buffer, or in the socket."""
        if self.reader.unread > 0:  # read off the socket (the FrameReader's buffer), not parsed yet
            return True
        if self.sock is None:
            return False
        try:
            return bool(self.sock.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT))
        except OSError:  # nothing waiting (EAGAIN), or the socket is gone
            return False

    def _ended(self, s: _Stream, task: asyncio.Task) -> None:
        """``s``'s task ended: uncount it if it never went out; a task cancelled before it ever ran
        (its handlers never ran) still answers ``gone``."""
        if not s.out:
            s.out = True
            self.unsent -= 1
        if task.cancelled() and self.streams.get(s.rid) is s:
            del self.streams[s.rid]
            self.send(("gone", s.rid))

    def hold(self, state: Hold) -> int:
        """Take the run's hold state; cut every request it covers whose bytes have not started to go
        out, answering ``unsent`` for each at once. Returns how many were cut."""
        self.holding = state
        if not state:
            return 0
        cut = [s for s in self.streams.values() if not s.out and state.covers(s.req)]
        for s in cut:
            del self.streams[s.rid]
            self.send(("unsent", s.rid))
            if s.task is not None:
                s.task.cancel()
        return len(cut)

    async def _run(self, s: _Stream, endpoint: int) -> None:
        try:
            c = await self.clients[endpoint].complete(s.req, s.progress, gate=lambda: self._gate(s))
            if len(self.clients) > 1:  # journaled with the base_urls entry that served it
                c = dataclasses.replace(c, endpoint=shown_url(self.init.endpoints[endpoint]))
        except asyncio.CancelledError:
            if self.streams.get(s.rid) is s:  # not already answered (`unsent` by a hold)
                del self.streams[s.rid]
                self.send(("gone", s.rid))
            return
        except StreamHeld:
            if self.streams.get(s.rid) is s:
                del self.streams[s.rid]
                self.send(("unsent", s.rid))
            return
        except RequestError as e:
            if self.streams.pop(s.rid, None) is s:
                self.send(("err", s.rid, error_fields(e)))
            return
        except Exception as e:  # a bug costs this attempt, not the worker
            if self.streams.pop(s.rid, None) is not s:
                return
            log.exception("unexpected error in a stream")
            self.send(("err", s.rid, error_fields(RequestError(ErrorClass.OTHER,
                                                               f"internal error: {type(e).__name__}: {e}"))))
            return
        if self.journal is None or s.req.ref is None:
            self.streams.pop(s.rid, None)
            self.send(("done", s.rid, c))
            return
        line = journal.record_line(s.rid, s.req.ref, s.started, time.time(), c)
        self._pending.append((s, c, line))
        self._wake.set()

    def cancel(self, rid: int) -> None:
        s = self.streams.get(rid)
        if s is not None and s.task is not None and not s.task.done():
            s.task.cancel()
        elif s is None:
            self.send(("gone", rid))

    # ---- background loops --------------------------------------------------------------------
    async def journal_loop(self) -> None:
        """Group commit: write and fsync what finished, then send those results."""
        assert self.journal is not None
        while True:
            await self._wake.wait()
            self._wake.clear()
            await asyncio.sleep(0)  # let completions that finished in this same tick join the group
            batch, self._pending = self._pending, []
            if not batch:
                continue
            try:
                await asyncio.to_thread(self.journal.write, [line for _, _, line in batch])
            except OSError as e:  # a paid completion is never dropped: sent unjournaled (the store still takes it)
                if not self._journal_failed:
                    log.warning("journal write failed (%s); completions are sent without a journal line", e)
                self._journal_failed = True
            else:
                self._journal_failed = False
            for s, c, _line in batch:
                self.streams.pop(s.rid, None)
                self.send(("done", s.rid, c))

    async def progress_loop(self) -> None:
        """Every ``progress_s``: one ``prog`` message with the streams whose figures changed."""
        while True:
            await asyncio.sleep(self.init.progress_s)
            changed = []
            for s in self.streams.values():
                p = s.progress
                now = (p.chars_received, p.status, p.generation_id, p.provider, p.cost_usd)
                if now != s.sent:
                    s.sent = now
                    changed.append((s.rid, *now))
            if changed:
                self.send(("prog", changed))

    async def ledger_loop(self) -> None:
        """Every ``ledger_s``: rewrite the in-flight ledger (what a kill of the whole run would cut)."""
        assert self.ledger is not None
        last: list = []
        warned = False
        while True:
            await asyncio.sleep(self.init.ledger_s)
            rows = [[*s.req.ref, s.progress.tokens_received, s.progress.generation_id, s.progress.provider,
                     s.started] for s in self.streams.values() if s.req.ref is not None]
            if rows != last:
                last = rows
                try:
                    await asyncio.to_thread(journal.write_ledger, self.ledger, rows)
                except OSError as e:  # e.g. every file descriptor taken: the next rewrite may work
                    if not warned:
                        log.warning("in-flight ledger not written (%s); retried every %gs", e, self.init.ledger_s)
                    warned = True
                else:
                    warned = False

    def heartbeat(self) -> None:
        """Send ``("hb", seconds this worker's loop was found not running in all, requests unsent now,
        the most unsent since the last heartbeat)``."""
        clock = getattr(asyncio.get_running_loop(), "freeze", None)
        self.send(("hb", clock.frozen_s if clock is not None else 0.0, self.unsent, self.unsent_peak))
        self.unsent_peak = self.unsent

    def woke(self, gap: float) -> None:
        """The loop did not run for ``gap`` s (found as it woke): say so at once, before the results
        of the streams that finished meanwhile."""
        log.warning("the loop did not run for %.1fs (process stopped or blocked); the streams' stall and "
                    "total timeouts leave that time out", gap)
        self.heartbeat()

    async def heartbeat_loop(self) -> None:
        """Every :data:`HEARTBEAT_S`: a heartbeat, so the run sees this worker answer (and a timer is
        always due within it: a wait for I/O never outlasts it)."""
        loop = asyncio.get_running_loop()
        if isinstance(loop, RunningTimeLoop):
            loop.on_freeze = self.woke
        while True:
            await asyncio.sleep(HEARTBEAT_S)
            self.heartbeat()

    async def serve(self) -> None:
        """Read commands until ``close`` or the end of the socket, then cancel every stream."""
        loops = [asyncio.create_task(self.progress_loop()), asyncio.create_task(self.heartbeat_loop())]
        if self.journal is not None:
            loops += [asyncio.create_task(self.journal_loop()), asyncio.create_task(self.ledger_loop())]
        self.send(("ready", os.getpid()))
        try:
            while True:
                try:
                    msg = await read_frame(self.reader)
                except (asyncio.IncompleteReadError, ConnectionError):
                    return
                verb = msg[0]
                if verb == "req":
                    self.start(msg[1], msg[2], msg[3])
                elif verb == "cancel":
                    self.cancel(msg[1])
                elif verb == "hold":
                    self.hold(msg[1])
                elif verb == "close":
                    return
        finally:
            tasks = [s.task for s in self.streams.values() if s.task is not None]
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            if self._pending and self.journal is not None:  # finished before the close: keep them on disk
                try:
                    self.journal.write([line for _, _, line in self._pending])
                except OSError:
                    pass
            for t in loops:
                t.cancel()
            await asyncio.gather(*loops, return_exceptions=True)
            for c in self.clients:
                await c.aclose()
            if self.journal is not None:
                self.journal.close()
            if self.ledger is not None:
                self.ledger.unlink(missing_ok=True)  # a clean end: nothing of this worker is in flight
            try:
                await self.writer.drain()
                self.writer.close()
            except (ConnectionError, RuntimeError):
                pass


async def _main(fd: int) -> None:
    # Start the thread pool now (it imports modules on first use): once thousands of sockets have
    # taken every file descriptor, an import would fail with EMFILE and the journal with it.
    await asyncio.to_thread(int)
    sock = socket.socket(fileno=fd)
    reader, writer = await open_frames(sock, 2 ** 20)
    msg = await read_frame(reader)
    if msg[0] != "init":
        raise SystemExit(f"stream worker: expected init, got {msg[0]!r}")
    await Worker(msg[1], reader, writer, sock).serve()


def main(argv: list[str] | None = None) -> None:
    """Entry point: ``python -m engine.stream.worker FD PARENT_PID``."""
    args = sys.argv[1:] if argv is None else argv
    from engine.proc.childproc import quiet_child

    quiet_child(int(args[1]) if len(args) > 1 else None)
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr,
                        format="%(asctime)s stream worker %(process)d %(levelname)s %(message)s")
    import gc

    gc.freeze()
    gc.set_threshold(50_000, 20, 100)  # as the run does: full collections stall a loop of thousands of streams
    try:
        with asyncio.Runner(loop_factory=RunningTimeLoop) as runner:
            runner.run(_main(int(args[0])))
    except KeyboardInterrupt:  # pragma: no cover - terminal signals are ignored
        pass


if __name__ == "__main__":
    main()
