"""SeaweedFS's S3 gateway as the benchmarks' object store (`make seaweedfs` builds it from the Go module proxy).

moto's server (tests/support/s3server.py) speaks the S3 API exactly enough for the tests, but answers one
request at a time: a fleet of tables polled every second asks more of it than it answers, and a benchmark on
it measures moto. SeaweedFS (`weed mini`: master, volume, filer and S3 gateway in one Go process) answers
concurrently, and Spark's S3A, delta-rs, pyarrow and ClickHouse's reader all work against it.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

from tests.support.s3server import KEY_ID, SECRET, S3Server, free_port

BINARY = Path(__file__).resolve().parents[1] / "build" / "seaweedfs" / "weed"


def available() -> str | None:
    """None when the SeaweedFS binary is there, else why not (`make seaweedfs` wrote the reason)."""
    if BINARY.exists():
        return None
    reason = BINARY.parent / "UNAVAILABLE"
    return reason.read_text().strip() if reason.exists() else f"{BINARY} not built: run `make seaweedfs`"


class SeaweedServer(S3Server):
    """`weed mini` on 127.0.0.1, every port its own free one, the S3 gateway's one user holding KEY_ID and
    SECRET (its keys checked on every request); the same methods as S3Server."""

    def __init__(self) -> None:  # not S3Server's: that starts moto
        self.dir = Path(tempfile.mkdtemp(prefix="cdc2ch-seaweedfs-"))
        self.port = free_port()
        servers = ("master", "volume", "filer", "s3", "admin")
        ports = {
            f"-{s}.port{grpc}": str(free_port())
            for s in servers
            for grpc in ("", ".grpc")
            if s + grpc != "s3"
        }
        argv = [str(BINARY), "mini", f"-dir={self.dir}", "-ip=127.0.0.1", "-ip.bind=127.0.0.1",
                f"-s3.port={self.port}", "-s3.port.iceberg=0", "-s3.port.lance=0", "-webdav=false",
                "-admin.ui=false", "-admin.port.legacy=0", *(f"{k}={v}" for k, v in ports.items())]  # fmt: skip
        env = {**os.environ, "AWS_ACCESS_KEY_ID": KEY_ID, "AWS_SECRET_ACCESS_KEY": SECRET}
        self.log = open(self.dir / "weed.log", "w")  # noqa: SIM115 closed in stop()
        self.proc = subprocess.Popen(argv, env=env, stdout=self.log, stderr=subprocess.STDOUT, cwd=self.dir)
        deadline = time.monotonic() + 60
        while True:
            try:  # the gateway answers once the filer behind it does: an unsigned request is refused (403)
                urllib.request.urlopen(self.endpoint, timeout=2).read()
                break
            except urllib.error.HTTPError:
                break
            except OSError:
                assert self.proc.poll() is None, f"weed mini exited: see {self.dir / 'weed.log'}"
                assert time.monotonic() < deadline, "SeaweedFS's S3 gateway did not answer in 60 s"
                time.sleep(0.2)

    def bucket(self, name: str) -> str:
        deadline = time.monotonic() + 30
        while True:  # the first buckets wait for the volume server to register with the master
            try:
                return super().bucket(name)
            except Exception:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.5)

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(30)
        self.log.close()
        shutil.rmtree(self.dir, ignore_errors=True)
