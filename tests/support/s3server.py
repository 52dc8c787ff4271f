"""A real S3-compatible server for the tests, and storage faults in front of it.

`S3Server` is moto's server mode in a process of its own on 127.0.0.1: the S3 API that Spark's S3A, delta-rs,
pyarrow and ClickHouse's reader all speak, each with its own client. `S3FaultProxy` forwards to it and
answers like a failing store: throttled (503 SlowDown), slow, or not listening.
"""

from __future__ import annotations

import http.client
import os
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass

from cdc2ch.clickhouse.serving.httpservice import Handler, HTTPService

KEY_ID, SECRET = "cdc2ch-test-key", "cdc2ch-test-secret"
REGION = "us-east-1"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class S3Server:
    """moto's S3 server; `auth`: it checks signatures against the keys it issued (see `issue_keys`) after the
    first `auth` requests, which may create them."""

    def __init__(self, auth: int | None = None):
        self.port = free_port()
        env = {**os.environ, "MOTO_ALLOW_NONEXISTENT_REGION": "true"}
        if auth is not None:
            env["INITIAL_NO_AUTH_ACTION_COUNT"] = str(auth)
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(self.port)],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 60
        while True:
            try:
                urllib.request.urlopen(f"{self.endpoint}/moto-api/", timeout=2).read()
                break
            except OSError:
                assert self.proc.poll() is None, "moto's server exited"
                assert time.monotonic() < deadline, "moto's server did not answer in 60 s"
                time.sleep(0.1)

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def env(self, endpoint: str | None = None, key_id: str = KEY_ID, secret: str = SECRET) -> dict[str, str]:
        """The standard AWS variables a user of an S3-compatible store sets: endpoint, keys, region."""
        return {
            "AWS_ENDPOINT_URL": endpoint or self.endpoint,
            "AWS_ACCESS_KEY_ID": key_id,
            "AWS_SECRET_ACCESS_KEY": secret,
            "AWS_REGION": REGION,
        }

    def client(self, service: str = "s3", **keys):
        import boto3

        keys = keys or {"aws_access_key_id": KEY_ID, "aws_secret_access_key": SECRET}
        return boto3.client(service, endpoint_url=self.endpoint, region_name=REGION, **keys)

    def bucket(self, name: str) -> str:
        self.client().create_bucket(Bucket=name)
        return name

    def issue_keys(self) -> tuple[str, str]:
        """A user with every right and its keys (3 requests: within the first `auth`)."""
        import json

        iam = self.client("iam")
        iam.create_user(UserName="lake")
        policy = {"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": "*", "Resource": "*"}]}
        iam.put_user_policy(UserName="lake", PolicyName="all", PolicyDocument=json.dumps(policy))
        key = iam.create_access_key(UserName="lake")["AccessKey"]
        return key["AccessKeyId"], key["SecretAccessKey"]

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(30)


def storage_options(env: dict[str, str]) -> dict[str, str]:
    """delta-rs's options for the store `env` names (S3Server.env)."""
    return {
        "AWS_ENDPOINT_URL": env["AWS_ENDPOINT_URL"],
        "AWS_ACCESS_KEY_ID": env["AWS_ACCESS_KEY_ID"],
        "AWS_SECRET_ACCESS_KEY": env["AWS_SECRET_ACCESS_KEY"],
        "AWS_REGION": env["AWS_REGION"],
        "AWS_ALLOW_HTTP": "true",
        "AWS_S3_ALLOW_UNSAFE_RENAME": "true",  # one writer at a time here: no lock table needed
    }


@dataclass
class StorageFault:
    action: str  # slowdown: 503 SlowDown; delay: `seconds` then forward
    match: Callable[[str, str], bool]  # (method, path)
    seconds: float = 0.0
    fired: int = 0


class _S3ProxyHandler(Handler):
    def do_GET(self):
        self.server.owner.handle(self)

    do_HEAD = do_PUT = do_POST = do_DELETE = do_GET


SLOW_DOWN = (
    b'<?xml version="1.0" encoding="UTF-8"?><Error><Code>SlowDown</Code>'
    b"<Message>Please reduce your request rate.</Message><RequestId>fault</RequestId></Error>"
)


class S3FaultProxy(HTTPService):
    """Forwards S3 requests to `upstream` (an S3Server), failing those an armed fault matches. `down()`
    refuses connections; `up()` listens on the same port again."""

    handler_class = _S3ProxyHandler

    def __init__(self, upstream: S3Server):
        super().__init__(max_connections=256)
        self.upstream = upstream
        self.faults: list[StorageFault] = []
        self.requests: list[tuple[str, str]] = []
        self._lock = threading.Lock()

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def add_fault(self, action: str, match: Callable[[str, str], bool] = lambda m, p: True, **options):
        fault = StorageFault(action, match, **options)
        with self._lock:
            self.faults.append(fault)
        return fault

    def clear(self) -> None:
        with self._lock:
            self.faults.clear()

    def up(self) -> S3FaultProxy:
        return self if self._server else self.start()

    down = HTTPService.stop

    def handle(self, h: _S3ProxyHandler) -> None:
        body = h.body()
        with self._lock:
            self.requests.append((h.command, h.path))
            fault = next((f for f in self.faults if f.match(h.command, h.path)), None)
            if fault is not None:
                fault.fired += 1
        if fault is not None and fault.action == "slowdown":
            return h.reply(
                503, b"" if h.command == "HEAD" else SLOW_DOWN, {"Content-Type": "application/xml"}
            )
        if fault is not None and fault.action == "delay":
            time.sleep(fault.seconds)
        hop = {"host", "content-length", "transfer-encoding", "connection", "keep-alive"}
        conn = http.client.HTTPConnection("127.0.0.1", self.upstream.port, timeout=120)
        try:
            conn.request(
                h.command, h.path, body, {k: v for k, v in h.headers.items() if k.lower() not in hop}
            )
            resp = conn.getresponse()
            data = resp.read()
        finally:
            conn.close()
        h.send_response(resp.status)
        for k, v in resp.getheaders():
            if k.lower() not in hop:
                h.send_header(k, v)
        h.send_header("Content-Length", resp.getheader("Content-Length") or str(len(data)))
        h.end_headers()
        if h.command != "HEAD":
            h.wfile.write(data)
