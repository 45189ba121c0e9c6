"""A scripted OpenAI/OpenRouter-compatible server on 127.0.0.1 for field-case tests (stdlib only).

Each field case (a provider behaviour seen in a public bug report) is a ``respond(req, n) -> Reply``
function: ``req`` is the parsed JSON body of a ``POST /chat/completions``, ``n`` the 1-based count of
requests so far whose last user message equals this one's (so "first attempt fails, retry succeeds" is
easy to script). The server writes the reply's bytes exactly as given, so a quirk is reproduced byte
for byte, and records every request body in :attr:`CaseServer.requests`.

Other endpoints answer fixed JSON: ``/key`` and ``/credits`` (a funded account), ``/models`` (one model
with prices), ``/generation?id=`` (:attr:`CaseServer.generations`, else 404).

Use it in a test as a context manager; ``base_url`` goes into the config's ``[provider] base_url``::

    with CaseServer(respond) as srv:
        run_cmd("run", cfg, "--headless")
        assert len(srv.requests) == 3
"""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Callable
from urllib.parse import parse_qs, urlparse

MODEL = "moonshotai/kimi-k2.5"


@dataclass
class Reply:
    """One scripted HTTP reply.

    Attributes:
        status: HTTP status code.
        headers: extra headers (``Content-Type`` defaults to ``text/event-stream`` for status 200).
        pieces: the body, as ``bytes`` to write and ``float`` seconds to sleep between writes.
        chunked: ``Transfer-Encoding: chunked`` (each piece one chunk); else close-delimited.
        drop: close the connection after the pieces without ending the body (no final chunk):
            a connection dropped mid-stream.
    """

    status: int = 200
    headers: list[tuple[str, str]] = field(default_factory=list)
    pieces: list[bytes | float] = field(default_factory=list)
    chunked: bool = True
    drop: bool = False


def sse(obj: Any) -> bytes:
    """One ``data:`` event carrying ``obj`` as JSON (``\\n\\n`` terminated)."""
    return b"data: " + json.dumps(obj, ensure_ascii=False).encode() + b"\n\n"


DONE = b"data: [DONE]\n\n"


def chunk(delta: dict | None = None, finish: Any = None, *, gid: str = "gen-1", usage: dict | None = None,
          choices: bool = True, provider: str = "Scripted", **extra: Any) -> dict:
    """A ``chat.completion.chunk`` object with one choice (or none when ``choices`` is false)."""
    c: dict[str, Any] = {"id": gid, "provider": provider, "model": MODEL, "object": "chat.completion.chunk",
                         "created": 1700000000}
    c["choices"] = [{"index": 0, "delta": delta or {}, "finish_reason": finish}] if choices else []
    if usage is not None:
        c["usage"] = usage
    c.update(extra)
    return c


def usage(prompt: int = 10, completion: int = 20, reasoning: int = 0, cost: float | None = None) -> dict:
    """A ``usage`` object (OpenRouter adds ``cost`` in USD; vLLM does not)."""
    u: dict[str, Any] = {"prompt_tokens": prompt, "completion_tokens": completion,
                         "total_tokens": prompt + completion}
    if reasoning:
        u["completion_tokens_details"] = {"reasoning_tokens": reasoning}
    if cost is not None:
        u["cost"] = cost
    return u


def stream(*chunks: dict | bytes, done: bool = True) -> Reply:
    """A 200 event-stream reply of the given chunks (dicts are sent as ``data:`` events)."""
    pieces: list[bytes | float] = [c if isinstance(c, bytes) else sse(c) for c in chunks]
    if done:
        pieces.append(DONE)
    return Reply(pieces=pieces)


def error_reply(status: int, message: str, code: int | None = None, **extra: Any) -> Reply:
    """A JSON error body ``{"error": {"code", "message", ...}}`` with HTTP ``status``."""
    body = json.dumps({"error": {"code": code if code is not None else status, "message": message, **extra}}).encode()
    return Reply(status=status, headers=[("Content-Type", "application/json")], pieces=[body], chunked=False)


def last_user(req: dict) -> str:
    """The text of the last user message of a request body ("" when none)."""
    for m in reversed(req.get("messages") or []):
        if m.get("role") == "user" and isinstance(m.get("content"), str):
            return m["content"]
    return ""


class CaseServer:
    """The scripted server, run in a daemon thread on an ephemeral 127.0.0.1 port.

    Attributes:
        base_url: ``http://127.0.0.1:PORT/api/v1``.
        requests: every ``/chat/completions`` body received, in order.
        generations: ``/generation?id=`` answers by id (the ``data`` object, e.g. ``{"total_cost": 0.001,
            "native_tokens_completion": 42}``); an unknown id answers 404.
        credits_usd: total credits reported by ``/credits`` and ``/key``.
        generation_delay_s: seconds each ``/generation`` read waits before it answers (a slow account
            API); ``generation_reads`` counts the reads received.
    """

    def __init__(self, respond: Callable[[dict, int], Reply], *, credits_usd: float = 100.0, port: int = 0,
                 generation_delay_s: float = 0.0) -> None:
        self.respond = respond
        self.requests: list[dict] = []
        self.generations: dict[str, dict] = {}
        self.generation_delay_s = generation_delay_s
        self.generation_reads = 0
        self.credits_usd = credits_usd
        self._seen: Counter[str] = Counter()
        self._lock = threading.Lock()
        self._httpd = ThreadingHTTPServer(("127.0.0.1", port), self._handler())  # port 0: any free one
        self._httpd.daemon_threads = True
        self.base_url = f"http://127.0.0.1:{self._httpd.server_address[1]}/api/v1"
        self._thread = threading.Thread(target=self._httpd.serve_forever, daemon=True)

    def __enter__(self) -> "CaseServer":
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()

    def _next(self, req: dict) -> Reply:
        with self._lock:
            self.requests.append(req)
            key = last_user(req)
            self._seen[key] += 1
            n = self._seen[key]
        return self.respond(req, n)

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        srv = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:  # quiet
                pass

            def _json(self, status: int, obj: Any) -> None:
                body = json.dumps(obj).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def do_GET(self) -> None:
                url = urlparse(self.path)
                path = url.path.rstrip("/")
                if path.endswith("/credits"):
                    self._json(200, {"data": {"total_credits": srv.credits_usd, "total_usage": 0.0}})
                elif path.endswith("/key"):
                    self._json(200, {"data": {"label": "case", "limit": None, "usage": 0.0,
                                              "limit_remaining": None, "is_free_tier": False}})
                elif path.endswith("/models"):
                    self._json(200, {"data": [{"id": MODEL, "context_length": 262144,
                                               "pricing": {"prompt": "0.0000006", "completion": "0.0000025"}}]})
                elif path.endswith("/generation"):
                    with srv._lock:
                        srv.generation_reads += 1
                    if srv.generation_delay_s:
                        time.sleep(srv.generation_delay_s)
                    gid = (parse_qs(url.query).get("id") or [""])[0]
                    data = srv.generations.get(gid)
                    try:
                        if data is None:
                            self._json(404, {"error": {"code": 404, "message": f"generation {gid} not found"}})
                        else:
                            self._json(200, {"data": {"id": gid, **data}})
                    except (BrokenPipeError, ConnectionResetError):  # the client gave up waiting
                        self.close_connection = True
                else:
                    self._json(404, {"error": {"code": 404, "message": "not found"}})

            def do_POST(self) -> None:
                n = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(n) if n else b""
                try:
                    req = json.loads(raw or b"{}")
                except ValueError:
                    req = {}
                if not urlparse(self.path).path.rstrip("/").endswith("/chat/completions"):
                    self._json(404, {"error": {"code": 404, "message": "not found"}})
                    return
                self._play(srv._next(req))

            def _play(self, r: Reply) -> None:
                self.send_response(r.status)
                names = {k.lower() for k, _ in r.headers}
                if "content-type" not in names:
                    self.send_header("Content-Type", "text/event-stream" if r.status == 200 else "application/json")
                for k, v in r.headers:
                    self.send_header(k, v)
                if r.chunked:
                    self.send_header("Transfer-Encoding", "chunked")
                else:
                    self.send_header("Connection", "close")
                    self.close_connection = True
                self.end_headers()
                try:
                    for p in r.pieces:
                        if isinstance(p, (int, float)):
                            self.wfile.flush()
                            time.sleep(p)
                            continue
                        if r.chunked:
                            self.wfile.write(b"%x\r\n%s\r\n" % (len(p), p))
                        else:
                            self.wfile.write(p)
                        self.wfile.flush()
                    if r.drop:
                        self.close_connection = True
                        return
                    if r.chunked:
                        self.wfile.write(b"0\r\n\r\n")
                    self.wfile.flush()
                except (BrokenPipeError, ConnectionResetError):
                    self.close_connection = True

        return Handler


def case_config(tmp: Path, base_url: str, prompts: list[dict] | None = None, *, kind: str = "openai",
                max_tokens: int = 2048, concurrency: int = 4, max_attempts: int = 2, tokenizer: Path | None = None,
                dataset_path: str = "prompts.jsonl", dataset_format: str = "openai", dataset_extra: str = "",
                extra: str = "") -> Path:
    """Write ``tmp/config.toml`` shaped like the field cases' configs (run dir ``tmp/run``, key from
    ``$CASE_KEY``) and, when ``prompts`` is given, ``tmp/prompts.jsonl`` (one ``{"messages": ...}`` row each).

    ``extra`` is appended verbatim (more TOML sections); ``dataset_extra`` goes inside ``[[datasets]]``.
    """
    tmp = Path(tmp)
    if prompts is not None:
        (tmp / dataset_path).write_text("".join(json.dumps(p) + "\n" for p in prompts), encoding="utf-8")
    tok = f'[tokenizer]\npath = "{tokenizer}"\nkind = "tiktoken"\nexecutor = "thread"\n' if tokenizer else ""
    text = f"""[run]
name = "case"
dir = "{tmp / 'run'}"
progress_interval_s = 1
max_attempts = {max_attempts}

[provider]
kind = "{kind}"
base_url = "{base_url}"
model = "{MODEL}"
api_key_env = "CASE_KEY"

[provider.timeouts]
connect_s = 5
stall_s = 10
total_s = 30

[pricing]
prompt_usd_per_m = 0.6
completion_usd_per_m = 2.5

{tok}
[classes.short]
max_tokens = {max_tokens}
concurrency = {concurrency}
min_prompt_tokens = 0

[[datasets]]
name = "d"
path = "{tmp / dataset_path}"
format = "{dataset_format}"
{dataset_extra}
{extra}
"""
    cfg = tmp / "config.toml"
    cfg.write_text(text, encoding="utf-8")
    return cfg


def run_case(cfg: Path, *args: str, timeout: float = 90.0) -> subprocess.CompletedProcess[str]:
    """``datagen run CFG --headless ARGS`` in a subprocess with ``CASE_KEY`` set; output captured."""
    env = dict(os.environ, CASE_KEY="case-key-123")
    return subprocess.run([sys.executable, "-m", "datagen", "run", str(cfg), "--headless", *args],
                          capture_output=True, text=True, timeout=timeout, env=env)


def prompts(n: int) -> list[dict]:
    """``n`` distinct one-turn prompts (``Give me fun fact number I.``) for :func:`case_config`."""
    return [{"messages": [{"role": "user", "content": f"Give me fun fact number {i}."}]} for i in range(n)]


def ok_reply(req: dict | None = None, n: int = 1) -> Reply:
    """A complete streamed answer with reasoning and usage (what a healthy provider sends); a ``respond``
    function as it is, or what one returns."""
    return stream(chunk({"role": "assistant", "reasoning": "A fact."}), chunk({"content": "Octopuses have three hearts."}),
                  chunk({}, "stop", usage=usage(15, 12, 3, cost=0.0001)))


def states(run_dir: Path) -> dict[str, int]:
    """The run's prompts counted by state (``{"done": 8, "failed": 4}``), read from its store."""
    with sqlite3.connect(run_dir / "store.sqlite") as c:
        return dict(c.execute("SELECT state, COUNT(*) FROM prompts GROUP BY state").fetchall())


def cli(*args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    """``datagen ARGS`` in a subprocess with ``CASE_KEY`` set; output captured."""
    env = dict(os.environ, CASE_KEY="case-key-123")
    return subprocess.run([sys.executable, "-m", "datagen", *args], capture_output=True, text=True,
                          timeout=timeout, env=env)


def status(run_dir: Path) -> dict:
    """``datagen status RUN_DIR --json``, parsed (it must succeed)."""
    r = cli("status", str(run_dir), "--json")
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def status_when_there(run_dir: Path) -> dict | None:
    """``status --json`` of a run being started, for polling: None until its store exists and while
    ``status`` cannot read it."""
    if not (run_dir / "store.sqlite").exists():
        return None
    r = cli("status", str(run_dir), "--json")
    return json.loads(r.stdout) if r.returncode == 0 else None
