"""A small Confluent Schema Registry stand-in: the REST endpoints confluent-kafka's schema
registry client calls to register a schema, look it up, and fetch it by id or by subject
version or by guid (for schema ids sent in headers). One id and one guid per
distinct schema (as the real registry assigns them), versions per subject. In memory, on 127.0.0.1, in a thread of its own; `requests` records the calls made,
so a test can say which ones a serializer needed.
"""

from __future__ import annotations

import json
import threading
import urllib.parse
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

_NOT_FOUND = {"subject": 40401, "version": 40402, "schema": 40403}


class StandInSchemaRegistry:
    """`with StandInSchemaRegistry() as registry:` serves at `registry.url` until the block ends."""

    def __init__(self) -> None:
        self.requests: list[tuple[str, str]] = []  # (method, path) of every call
        self._lock = threading.Lock()
        self._ids: dict[tuple[str, str, str], int] = {}  # (type, schema, references) -> id
        self._schemas: dict[int, dict[str, Any]] = {}  # id -> {"schema", "guid", ...}
        self._guids: dict[str, int] = {}  # guid -> id
        self._versions: dict[str, list[int]] = {}  # subject -> ids, version n at n - 1
        registry = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                registry._answer(self, "GET")

            def do_POST(self) -> None:
                registry._answer(self, "POST")

            def log_message(self, *args: Any) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        self._thread = threading.Thread(target=self._server.serve_forever,
                                        kwargs={"poll_interval": 0.05}, daemon=True)

    def __enter__(self) -> "StandInSchemaRegistry":
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(5)

    # -- the REST API ------------------------------------------------------------------------

    def _answer(self, handler: BaseHTTPRequestHandler, method: str) -> None:
        url = urllib.parse.urlsplit(handler.path)
        parts = [urllib.parse.unquote(p) for p in url.path.strip("/").split("/")]
        body: Any = None
        if method == "POST":
            length = int(handler.headers.get("Content-Length") or 0)
            body = json.loads(handler.rfile.read(length) or b"{}")
        with self._lock:
            self.requests.append((method, url.path))
            status, answer = self._route(method, parts, body)
        data = json.dumps(answer).encode()
        handler.send_response(status)
        handler.send_header("Content-Type", "application/vnd.schemaregistry.v1+json")
        handler.send_header("Content-Length", str(len(data)))
        handler.end_headers()
        handler.wfile.write(data)

    def _route(self, method: str, parts: list[str], body: Any) -> tuple[int, Any]:
        match method, parts:
            case "POST", ["subjects", subject, "versions"]:
                return 200, self._register(subject, body)
            case "POST", ["subjects", subject]:  # lookup: is this schema under the subject?
                schema_id = self._ids.get(_identity(body))
                if schema_id is None or schema_id not in self._versions.get(subject, []):
                    return _missing("schema", f"schema not found under {subject}")
                return 200, self._registered(subject, schema_id)
            case "GET", ["schemas", "ids", schema_id] if schema_id.isdigit():
                if int(schema_id) not in self._schemas:
                    return _missing("schema", f"schema {schema_id} not found")
                return 200, self._schemas[int(schema_id)]
            case "GET", ["schemas", "guids", guid]:
                if guid not in self._guids:
                    return _missing("schema", f"schema {guid} not found")
                return 200, self._schemas[self._guids[guid]]
            case "GET", ["subjects", subject, "versions", version]:
                ids = self._versions.get(subject)
                if not ids:
                    return _missing("subject", f"subject {subject} not found")
                index = len(ids) - 1 if version == "latest" else int(version) - 1
                if not 0 <= index < len(ids):
                    return _missing("version", f"version {version} not found")
                return 200, self._registered(subject, ids[index])
            case "GET", ["subjects"]:
                return 200, sorted(self._versions)
        return 404, {"error_code": 404, "message": f"the stand-in has no {method} /{'/'.join(parts)}"}

    def _register(self, subject: str, body: dict[str, Any]) -> dict[str, Any]:
        identity = _identity(body)
        schema_id = self._ids.get(identity)
        if schema_id is None:
            schema_id = self._ids[identity] = len(self._ids) + 1
            guid = str(uuid.uuid4())
            self._guids[guid] = schema_id
            self._schemas[schema_id] = {"guid": guid, **{
                key: body[key] for key in ("schema", "schemaType", "references") if key in body}}
        versions = self._versions.setdefault(subject, [])
        if schema_id not in versions:
            versions.append(schema_id)
        return {"id": schema_id, "guid": self._schemas[schema_id]["guid"]}

    def _registered(self, subject: str, schema_id: int) -> dict[str, Any]:
        return {"subject": subject, "id": schema_id,
                "version": self._versions[subject].index(schema_id) + 1,
                **self._schemas[schema_id]}


def _identity(body: dict[str, Any]) -> tuple[str, str, str]:
    return (body.get("schemaType", "AVRO"), body["schema"],
            json.dumps(body.get("references") or [], sort_keys=True))


def _missing(what: str, message: str) -> tuple[int, dict[str, Any]]:
    return 404, {"error_code": _NOT_FOUND[what], "message": message}
