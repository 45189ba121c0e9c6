"""A loopback fake of the Hugging Face Hub's file API, enough for ``huggingface_hub`` to resolve and download
dataset repositories (``HF_ENDPOINT=http://127.0.0.1:PORT``).

Answers (read from huggingface_hub's source: ``HfApi.dataset_info``, ``HfApi.list_repo_tree`` under
``snapshot_download``, ``get_hf_file_metadata``/``hf_hub_download``):

- ``GET /api/datasets/ORG/NAME/revision/REV`` -> ``{"id", "sha", "siblings": [{"rfilename"}]}``;
- ``GET /api/datasets/ORG/NAME/tree/REV[/PATH]?recursive=...`` -> ``[{"type": "file", "path", "size", "oid"}]``;
- ``HEAD``/``GET /datasets/ORG/NAME/resolve/REV/FILE`` -> the bytes, with ``X-Repo-Commit``, ``ETag``,
  ``Content-Length``;
- unknown repository / revision / file: 404 with ``X-Error-Code`` ``RepoNotFound`` / ``RevisionNotFound`` /
  ``EntryNotFound``, as the Hub sends.

A repository is a dict of commits (sha -> {path: bytes}) and refs (name -> sha); :meth:`FakeHub.commit`
adds a commit and moves a branch to it. Every request is logged in :attr:`FakeHub.requests`.
:func:`parquet` and :func:`jsonl` give a data file's bytes for such a commit.
"""

from __future__ import annotations

import hashlib
import io
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import unquote, urlsplit

import pyarrow as pa
import pyarrow.parquet as pq


def parquet(rows: list[dict]) -> bytes:
    """``rows`` as the bytes of a Parquet file (one column per key)."""
    buf = io.BytesIO()
    pq.write_table(pa.Table.from_pylist(rows), buf)
    return buf.getvalue()


def jsonl(rows: list[dict]) -> bytes:
    """``rows`` as JSON Lines bytes."""
    return b"".join(json.dumps(r).encode() + b"\n" for r in rows)


class FakeHub:
    """Start with ``with FakeHub() as hub:``; ``hub.endpoint`` is the ``HF_ENDPOINT`` to use."""

    def __init__(self) -> None:
        self.repos: dict[str, dict] = {}
        self.requests: list[tuple[str, str]] = []
        self._lock = threading.Lock()
        hub = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args) -> None:  # quiet
                pass

            def do_GET(self) -> None:
                hub._serve(self, body=True)

            def do_HEAD(self) -> None:
                hub._serve(self, body=False)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.endpoint = f"http://127.0.0.1:{self.server.server_address[1]}"
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> "FakeHub":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.server.shutdown()
        self.server.server_close()

    def commit(self, repo: str, files: dict[str, bytes], branch: str = "main") -> str:
        """Add a commit holding exactly ``files`` and point ``branch`` at it; returns its 40-hex sha."""
        with self._lock:
            r = self.repos.setdefault(repo, {"commits": {}, "refs": {}})
            sha = hashlib.sha1(json.dumps([repo, len(r["commits"]), sorted(files)]).encode()).hexdigest()
            r["commits"][sha] = dict(files)
            r["refs"][branch] = sha
            return sha

    def paths(self, prefix: str = "") -> list[str]:
        """The request paths logged so far that start with ``prefix``."""
        return [p for _, p in self.requests if p.startswith(prefix)]

    # ---------------------------------------------------------------------------- serving
    def _serve(self, h: BaseHTTPRequestHandler, body: bool) -> None:
        url = urlsplit(h.path)
        path = unquote(url.path)
        with self._lock:
            self.requests.append((h.command, path))
        parts = path.strip("/").split("/")
        if parts[:2] == ["api", "datasets"] and len(parts) >= 6 and parts[4] in ("revision", "tree"):
            repo, kind, rev, rest = "/".join(parts[2:4]), parts[4], parts[5], "/".join(parts[6:])
            found = self._commit(h, repo, rev)
            if found is None:
                return
            sha, files = found
            if kind == "revision":
                doc = {"id": repo, "sha": sha, "private": False, "siblings": [{"rfilename": f} for f in sorted(files)]}
            else:
                doc = [{"type": "file", "path": f, "size": len(b), "oid": hashlib.sha1(b).hexdigest()}
                       for f, b in sorted(files.items()) if not rest or f.startswith(rest.rstrip("/") + "/")]
            self._send(h, 200, json.dumps(doc).encode(), {"Content-Type": "application/json"}, body)
            return
        if parts[:1] == ["datasets"] and len(parts) >= 6 and parts[3] == "resolve":
            repo, rev, name = "/".join(parts[1:3]), parts[4], "/".join(parts[5:])
            found = self._commit(h, repo, rev)
            if found is None:
                return
            sha, files = found
            if name not in files:
                self._send(h, 404, b"Entry not found", {"X-Error-Code": "EntryNotFound"}, body)
                return
            data = files[name]
            headers = {"X-Repo-Commit": sha, "ETag": f'"{hashlib.sha256(data).hexdigest()}"',
                       "Content-Type": "application/octet-stream"}
            self._send(h, 200, data, headers, body)
            return
        self._send(h, 404, b"not found", {}, body)

    def _commit(self, h: BaseHTTPRequestHandler, repo: str, rev: str) -> tuple[str, dict[str, bytes]] | None:
        with self._lock:
            r = self.repos.get(repo)
            if r is None:
                self._send(h, 404, b"Repository not found", {"X-Error-Code": "RepoNotFound"}, h.command == "GET")
                return None
            sha = r["refs"].get(rev, rev)
            files = r["commits"].get(sha)
        if files is None:
            self._send(h, 404, b"Revision not found", {"X-Error-Code": "RevisionNotFound"}, h.command == "GET")
            return None
        return sha, files

    @staticmethod
    def _send(h: BaseHTTPRequestHandler, status: int, data: bytes, headers: dict[str, str], body: bool) -> None:
        h.send_response(status)
        for k, v in headers.items():
            h.send_header(k, v)
        h.send_header("Content-Length", str(len(data)))
        h.end_headers()
        if body:
            h.wfile.write(data)
