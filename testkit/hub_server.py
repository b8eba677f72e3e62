"""A local Hugging Face hub: serves model directories through the hub's file API, the way
mirrors do, so the real huggingface_hub client (HF_ENDPOINT) pulls from it in tests and
benchmarks. What huggingface_hub 2.x reads (hf_api.py, file_download.py):

    GET  /api/models/{repo}/revision/{rev}          {"id", "sha", "siblings"}
    GET  /api/models/{repo}/tree/{rev}?recursive=   [{"type": "file", "path", "size", "oid",
                                                      "lfs": {"oid", "size", "pointerSize"}}]
    HEAD/GET /{repo}/resolve/{rev}/{path}           X-Repo-Commit, ETag (git sha1), for LFS
                                                    files X-Linked-Etag (sha256) and
                                                    X-Linked-Size; Content-Length; Range → 206
    errors: X-Error-Code (RepoNotFound, RevisionNotFound, EntryNotFound, GatedRepo) and
    X-Error-Message, as hf_raise_for_status maps them

Faults for tests: cut a file's next GET after some bytes (then optionally refuse the
next requests with 503), serve a file's bytes with one byte flipped, or send slowly. It counts the
body bytes it sent per file, so a test sees what a resumed pull fetched again.
"""

from __future__ import annotations

import hashlib
import json
import socket
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import unquote, urlsplit

# The bundled model served as this repo in the tests.
TEST_REPO = "mlx-community/SmolLM2-135M-Instruct-test"
CHUNK = 1 << 20


@dataclass(frozen=True)
class ServedFile:
    path: str
    source: Path
    size: int
    git_sha1: str
    sha256: str
    lfs: bool


@dataclass
class ServedRepo:
    repo_id: str
    commit: str
    files: dict[str, ServedFile]
    token: str | None = None  # a gated repo: only this bearer token may read it
    branches: tuple[str, ...] = ("main",)


@dataclass
class Faults:
    cut_after: dict[str, int] = field(default_factory=dict)  # path -> bytes, one GET each
    refuse_after_cut: int = 0  # then answer this many GETs of the cut file with 503
    cut_done: set[str] = field(default_factory=set)
    corrupt: set[str] = field(default_factory=set)  # paths served with one byte flipped
    rate: float | None = None  # bytes/s each file is sent at (a slow link); None: as fast as it can


def serve_dir(repo_id: str, root: Path, token: str | None = None) -> ServedRepo:
    """A repo holding every file under root (safetensors and files over 1 MB as LFS)."""
    files = {}
    for p in sorted(q for q in root.rglob("*") if q.is_file()):
        rel = p.relative_to(root).as_posix()
        data = p.read_bytes()
        files[rel] = ServedFile(
            rel,
            p,
            len(data),
            hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest(),
            hashlib.sha256(data).hexdigest(),
            rel.endswith(".safetensors") or len(data) > (1 << 20),
        )
    listing = json.dumps([[f.path, f.sha256] for f in files.values()]).encode()
    commit = hashlib.sha1(repo_id.encode() + listing).hexdigest()
    return ServedRepo(repo_id, commit, files, token)


class HubServer:
    """`with HubServer([repo]) as hub:` then HF_ENDPOINT=hub.url."""

    def __init__(self, repos: list[ServedRepo]) -> None:
        self.repos = {r.repo_id: r for r in repos}
        self.faults = Faults()
        self.sent: Counter[str] = Counter()  # body bytes sent per file path
        self.ranges: list[tuple[str, int]] = []  # (path, first byte) of every file GET
        self._lock = threading.Lock()
        server = self

        class Handler(_Handler):
            hub = server

        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self._httpd.server_address[1]}"
        self._thread = threading.Thread(target=self._httpd.serve_forever, daemon=True)

    def __enter__(self) -> HubServer:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join(timeout=10)

    def count(self, path: str, n: int) -> None:
        with self._lock:
            self.sent[path] += n


class _Handler(BaseHTTPRequestHandler):
    hub: HubServer
    protocol_version = "HTTP/1.1"  # keep-alive, as httpx pools its connections

    def log_message(self, format: str, *args: object) -> None:
        pass

    def do_HEAD(self) -> None:
        self._route(body=False)

    def do_GET(self) -> None:
        self._route(body=True)

    def _route(self, body: bool) -> None:
        parts = [unquote(p) for p in urlsplit(self.path).path.strip("/").split("/")]
        if parts[:2] == ["api", "models"] and len(parts) >= 6:
            repo, kind, rev = "/".join(parts[2:4]), parts[4], parts[5]
            if self._allowed(repo, rev):
                self._api(self.hub.repos[repo], kind, body)
        elif len(parts) >= 5 and parts[2] == "resolve":
            repo, rev, path = "/".join(parts[:2]), parts[3], "/".join(parts[4:])
            if self._allowed(repo, rev):
                self._resolve(self.hub.repos[repo], path, body)
        else:
            self._error(404, "RepoNotFound", "no such route")

    def _allowed(self, repo_id: str, rev: str) -> bool:
        repo = self.hub.repos.get(repo_id)
        if repo is None:
            self._error(404, "RepoNotFound", f"Repository {repo_id} not found")
            return False
        if repo.token is not None:
            given = self.headers.get("Authorization", "").removeprefix("Bearer ").strip()
            if given != repo.token:
                status = 403 if given else 401
                self._error(status, "GatedRepo", f"Access to model {repo_id} is restricted.")
                return False
        if rev not in (repo.commit, *repo.branches):
            self._error(404, "RevisionNotFound", f"Invalid rev id: {rev}")
            return False
        return True

    def _api(self, repo: ServedRepo, kind: str, body: bool) -> None:
        if kind == "revision":
            doc: object = {
                "id": repo.repo_id,
                "modelId": repo.repo_id,
                "sha": repo.commit,
                "private": False,
                "gated": "manual" if repo.token else False,
                "siblings": [{"rfilename": p} for p in repo.files],
            }
        elif kind == "tree":
            doc = [_tree_entry(f) for f in repo.files.values()]
        else:
            self._error(404, "EntryNotFound", kind)
            return
        data = json.dumps(doc).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        if body:
            self.wfile.write(data)

    def _resolve(self, repo: ServedRepo, path: str, body: bool) -> None:
        f = repo.files.get(path)
        if f is None:
            self._error(404, "EntryNotFound", f"{path} does not exist", repo.commit)
            return
        faults = self.hub.faults
        if body and faults.refuse_after_cut > 0 and path in faults.cut_done:
            faults.refuse_after_cut -= 1
            self._error(503, "", "try later", repo.commit)
            return
        start = _range_start(self.headers.get("Range"))
        if start is not None and start >= f.size:
            self.send_response(416)
            self.send_header("Content-Range", f"bytes */{f.size}")
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        self.send_response(206 if start is not None else 200)
        self.send_header("X-Repo-Commit", repo.commit)
        self.send_header("ETag", f'"{f.git_sha1}"')
        if f.lfs:
            self.send_header("X-Linked-Etag", f'"{f.sha256}"')
            self.send_header("X-Linked-Size", str(f.size))
        self.send_header("Accept-Ranges", "bytes")
        offset = start or 0
        if start is not None:
            self.send_header("Content-Range", f"bytes {start}-{f.size - 1}/{f.size}")
        self.send_header("Content-Length", str(f.size - offset))
        self.end_headers()
        if body:
            self.hub.ranges.append((path, offset))
            self._send_file(f, offset)

    def _send_file(self, f: ServedFile, offset: int) -> None:
        faults = self.hub.faults
        cut = faults.cut_after.pop(f.path, None)
        if cut is not None:
            faults.cut_done.add(f.path)
        left = f.size - offset if cut is None else min(cut, f.size - offset)
        with f.source.open("rb") as src:
            src.seek(offset)
            position = offset
            while left > 0:
                chunk = src.read(min(CHUNK, left))
                if not chunk:
                    break
                if f.path in faults.corrupt and position <= f.size // 2 < position + len(chunk):
                    i = f.size // 2 - position
                    chunk = chunk[:i] + bytes([chunk[i] ^ 0xFF]) + chunk[i + 1 :]
                try:
                    self.wfile.write(chunk)
                except OSError:
                    return
                self.hub.count(f.path, len(chunk))
                if faults.rate:
                    time.sleep(len(chunk) / faults.rate)
                left -= len(chunk)
                position += len(chunk)
        if cut is not None:  # the connection ends mid-body (a FIN after what was sent)
            self.wfile.flush()
            self.connection.shutdown(socket.SHUT_WR)
            self.close_connection = True

    def _error(self, status: int, code: str, message: str, commit: str | None = None) -> None:
        data = json.dumps({"error": message}).encode()
        self.send_response(status)
        if code:
            self.send_header("X-Error-Code", code)
        self.send_header("X-Error-Message", message)
        if commit:
            self.send_header("X-Repo-Commit", commit)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(data)


def _tree_entry(f: ServedFile) -> dict[str, object]:
    entry: dict[str, object] = {"type": "file", "path": f.path, "size": f.size, "oid": f.git_sha1}
    if f.lfs:
        entry["lfs"] = {"oid": f.sha256, "size": f.size, "pointerSize": 134}
    return entry


def _range_start(header: str | None) -> int | None:
    """The first byte of `Range: bytes=N-` (the only form huggingface_hub sends)."""
    if not header or not header.startswith("bytes="):
        return None
    first = header.removeprefix("bytes=").split("-", 1)[0]
    return int(first) if first.isdigit() else None
