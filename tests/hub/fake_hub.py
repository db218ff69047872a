"""A Hugging Face Hub on 127.0.0.1 that answers what huggingface_hub 2.4.0 asks, the way the Hub
does (a real ``ThreadingHTTPServer`` in a thread):

- ``GET /api/models/{repo_id}[/revision/{revision}]``: ``{"id", "sha", "siblings": [{"rfilename",
  "size", "blobId"}]}`` (``HfApi.model_info``);
- ``HEAD``/``GET /{repo_id}/resolve/{revision}/{path}``: ``X-Repo-Commit``, ``ETag``,
  ``Content-Length``; a ``Range: bytes=a-b`` request gets ``206`` and ``Content-Range``
  (``hf_hub_download``, ``HfApi.parse_safetensors_file_metadata``);
- errors as the Hub words them: ``404`` with ``X-Error-Code: RepoNotFound`` /
  ``RevisionNotFound`` / ``EntryNotFound``, ``401`` with ``X-Error-Code: GatedRepo`` for a
  gated repository's files without its token, ``401`` with ``X-Error-Message: Invalid
  credentials in Authorization header`` for a wrong token, ``401 RepoNotFound`` for a private
  repository without its token (the Hub does not tell private from missing).

Every request is recorded (method, path, ``Authorization``, ``Range``, status, body bytes sent).
"""

from __future__ import annotations

import hashlib
import json
import re
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit

__all__ = ["FakeHub", "FakeRepo", "Seen"]

_RANGE = re.compile(r"bytes=(\d+)-(\d*)")


@dataclass
class FakeRepo:
    """One repository: its files (a directory), one commit, its refs."""

    root: Path
    sha: str
    refs: dict[str, str] = field(default_factory=dict)
    gated_token: str | None = None
    """Files answer 401 GatedRepo without ``Authorization: Bearer <gated_token>``."""
    private_token: str | None = None
    """Everything answers 401 RepoNotFound without this token."""
    status: int | None = None
    """Answer every request with this status (a broken Hub)."""
    file_status: dict[str, int] = field(default_factory=dict)
    """Answer requests for these files with these statuses (a Hub failing mid-fetch)."""

    def resolve(self, revision: str | None) -> str | None:
        if revision is None:
            return self.sha
        if revision == self.sha:
            return self.sha
        return self.refs.get(revision)

    def files(self) -> Iterator[Path]:
        return (p for p in sorted(self.root.rglob("*")) if p.is_file())


@dataclass(frozen=True)
class Seen:
    method: str
    path: str
    authorization: str | None
    range: str | None
    status: int
    body_bytes: int


class FakeHub:
    """``with FakeHub(repos) as hub: hub.url ...``"""

    def __init__(self, repos: dict[str, FakeRepo]) -> None:
        self.repos = repos
        self.seen: list[Seen] = []
        self._lock = threading.Lock()
        hub = self

        class Handler(_Handler):
            owner = hub

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        self._thread = threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )

    def __enter__(self) -> FakeHub:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)

    def record(self, seen: Seen) -> None:
        with self._lock:
            self.seen.append(seen)

    def requests(self) -> list[Seen]:
        with self._lock:
            return list(self.seen)

    def clear(self) -> None:
        with self._lock:
            self.seen.clear()


class _Handler(BaseHTTPRequestHandler):
    owner: FakeHub
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:  # quiet
        pass

    def do_GET(self) -> None:
        self._answer(head=False)

    def do_HEAD(self) -> None:
        self._answer(head=True)

    # -- routing -------------------------------------------------------------------------

    def _answer(self, *, head: bool) -> None:
        path = urlsplit(self.path).path
        if path.startswith("/api/models/"):
            self._model_info(path[len("/api/models/") :], head=head)
        elif "/resolve/" in path:
            repo_id, _, rest = path[1:].partition("/resolve/")
            revision, _, filename = rest.partition("/")
            self._resolve(unquote(repo_id), unquote(revision), unquote(filename), head=head)
        else:
            self._send(404, b"", head=head)

    def _repo(self, repo_id: str, *, files: bool, head: bool) -> FakeRepo | None:
        repo = self.owner.repos.get(repo_id)
        if repo is None:
            self._error(404, "RepoNotFound", "Repository not found", head=head)
            return None
        if repo.status is not None:
            self._send(repo.status, b"Internal Error", head=head)
            return None
        auth = self.headers.get("Authorization")
        wanted = repo.private_token or (repo.gated_token if files else None)
        if auth is not None and wanted is not None and auth != f"Bearer {wanted}":
            self._error(401, None, "Invalid credentials in Authorization header", head=head)
            return None
        if repo.private_token is not None and auth is None:
            self._error(401, "RepoNotFound", "Invalid username or password.", head=head)
            return None
        if files and repo.gated_token is not None and auth is None:
            self._error(
                401,
                "GatedRepo",
                f"Access to model {repo_id} is restricted. You must have access to it and be "
                "authenticated to access it. Please log in.",
                head=head,
            )
            return None
        return repo

    def _model_info(self, rest: str, *, head: bool) -> None:
        repo_part, _, revision = rest.partition("/revision/")
        repo_id = unquote(repo_part)
        repo = self._repo(repo_id, files=False, head=head)
        if repo is None:
            return
        sha = repo.resolve(unquote(revision) if revision else None)
        if sha is None:
            self._error(404, "RevisionNotFound", f"Invalid rev id: {revision}", head=head)
            return
        siblings = [
            {
                "rfilename": p.relative_to(repo.root).as_posix(),
                "size": p.stat().st_size,
                "blobId": hashlib.sha1(p.read_bytes()).hexdigest(),
            }
            for p in repo.files()
        ]
        body = json.dumps({"id": repo_id, "modelId": repo_id, "sha": sha, "siblings": siblings})
        self._send(200, body.encode(), head=head, content_type="application/json")

    def _resolve(self, repo_id: str, revision: str, filename: str, *, head: bool) -> None:
        repo = self._repo(repo_id, files=True, head=head)
        if repo is None:
            return
        sha = repo.resolve(revision)
        if sha is None:
            self._error(404, "RevisionNotFound", "Invalid rev id", head=head)
            return
        if filename in repo.file_status:
            self._send(repo.file_status[filename], b"Service Unavailable", head=head)
            return
        file = repo.root / filename
        if not filename or ".." in filename.split("/") or not file.is_file():
            self._error(404, "EntryNotFound", "Entry not found", head=head, sha=sha)
            return
        data = file.read_bytes()
        headers = {
            "X-Repo-Commit": sha,
            "ETag": f'"{hashlib.sha256(data).hexdigest()}"',
            "Accept-Ranges": "bytes",
        }
        wanted = self.headers.get("Range")
        if wanted is None:
            self._send(200, data, head=head, headers=headers)
            return
        m = _RANGE.fullmatch(wanted.strip())
        if m is None or int(m.group(1)) >= len(data):
            headers["Content-Range"] = f"bytes */{len(data)}"
            self._send(416, b"", head=head, headers=headers)
            return
        start = int(m.group(1))
        stop = min(int(m.group(2)) if m.group(2) else len(data) - 1, len(data) - 1)
        headers["Content-Range"] = f"bytes {start}-{stop}/{len(data)}"
        self._send(206, data[start : stop + 1], head=head, headers=headers)

    # -- writing -------------------------------------------------------------------------

    def _error(
        self, status: int, code: str | None, message: str, *, head: bool, sha: str | None = None
    ) -> None:
        headers = {"X-Error-Message": message}
        if code is not None:
            headers["X-Error-Code"] = code
        if sha is not None:
            headers["X-Repo-Commit"] = sha
        body = json.dumps({"error": message}).encode()
        self._send(status, body, head=head, headers=headers, content_type="application/json")

    def _send(
        self,
        status: int,
        body: bytes,
        *,
        head: bool,
        headers: dict[str, str] | None = None,
        content_type: str = "application/octet-stream",
    ) -> None:
        # Recorded before answering: the client cannot see the answer before the log does.
        self.owner.record(
            Seen(
                method=self.command,
                path=self.path,
                authorization=self.headers.get("Authorization"),
                range=self.headers.get("Range"),
                status=status,
                body_bytes=0 if head else len(body),
            )
        )
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        self.end_headers()
        if not head:
            self.wfile.write(body)
