"""A real old ClickHouse server for version checks: Debian's clickhouse-server 18.16.1, unpacked without root
(`apt-get download` + `dpkg -x`, with the libraries it links) into build/, started on a scratch directory."""

from __future__ import annotations

import os
import shutil
import subprocess
import time
import urllib.parse
import urllib.request
from pathlib import Path

from tests.support.chserver import Endpoint

ROOT = Path(__file__).resolve().parents[2]
BUILD = ROOT / "build" / "clickhouse-18.16.1"
# clickhouse-server and clickhouse-common, and every library clickhouse-server links that a minimal Debian
# lacks (found with ldd).
PACKAGES = (
    "clickhouse-server clickhouse-common libpocodata80 libpocodataodbc80 libpocofoundation80 libpocomongodb80 "
    "libpoconet80 libpoconetssl80 libpocoutil80 libpocoxml80 libpocojson80 libpococrypto80 libcapnp-0.9.2 "
    "libcctz2 libcpuinfo0 libdouble-conversion3 libfarmhash0 libjemalloc2 libmariadb3 libmetrohash1 "
    "librdkafka1 libre2-9 libodbc2 libltdl7 libpcre3 libboost-filesystem1.74.0 "
    "libboost-program-options1.74.0 libicu72"
).split()


def unpacked() -> tuple[Path | None, str]:
    """The unpacked package tree, fetched once into build/; (None, why) when it cannot be had here."""
    binary = BUILD / "root" / "usr" / "sbin" / "clickhouse-server"
    if binary.exists():
        return BUILD / "root", ""
    if shutil.which("apt-get") is None or shutil.which("dpkg") is None:
        return None, "apt-get and dpkg are needed to fetch Debian's clickhouse-server 18.16.1"
    debs = BUILD / "debs"
    debs.mkdir(parents=True, exist_ok=True)
    got = subprocess.run(
        ["apt-get", "download", *PACKAGES], cwd=debs, capture_output=True, text=True, timeout=600
    )
    if got.returncode != 0:
        return None, f"apt-get download of clickhouse-server 18.16.1 failed: {got.stderr.strip()[-300:]}"
    for deb in sorted(debs.glob("*.deb")):
        subprocess.run(["dpkg", "-x", str(deb), str(BUILD / "root")], check=True, timeout=300)
    return (BUILD / "root", "") if binary.exists() else (None, "the package held no clickhouse-server")


def start(root: Path, scratch: Path, port: int) -> subprocess.Popen:
    data = scratch / "data"
    data.mkdir(parents=True, exist_ok=True)
    (scratch / "users.xml").write_text(
        "<yandex><profiles><default></default></profiles><users><default><password></password>"
        "<networks><ip>::/0</ip></networks><profile>default</profile><quota>default</quota></default>"
        "</users><quotas><default></default></quotas></yandex>"
    )
    (scratch / "config.xml").write_text(
        f"<yandex><logger><level>warning</level><console>1</console></logger><http_port>{port}</http_port>"
        f"<listen_host>127.0.0.1</listen_host><path>{data}/</path><tmp_path>{data}/tmp/</tmp_path>"
        f"<users_config>{scratch}/users.xml</users_config><default_profile>default</default_profile>"
        f"<default_database>default</default_database><mark_cache_size>5368709</mark_cache_size></yandex>"
    )
    libs = f"{root}/usr/lib/x86_64-linux-gnu:{root}/lib/x86_64-linux-gnu"
    env = {**os.environ, "LD_LIBRARY_PATH": libs}
    server = subprocess.Popen(
        [str(root / "usr/sbin/clickhouse-server"), f"--config-file={scratch}/config.xml"],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        cwd=scratch,
    )
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/?query=SELECT%201", timeout=2):
                return server
        except OSError:
            time.sleep(0.2)
    server.kill()
    raise RuntimeError("clickhouse-server 18.16.1 did not answer within 60 s")


def endpoint(port: int) -> Endpoint:
    return Endpoint("127.0.0.1", port)


def query(port: int, sql: str) -> str:
    url = f"http://127.0.0.1:{port}/?query={urllib.parse.quote(sql)}"
    with urllib.request.urlopen(url, timeout=10) as response:
        return response.read().decode()
