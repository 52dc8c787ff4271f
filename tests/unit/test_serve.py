"""`run --serve`'s HTTP side without an engine: addresses, TLS options, bounded decompression, credentials,
and the holder file that readers use to find the service."""

from __future__ import annotations

import base64
import gzip
import json
import os
from email.message import Message

import lz4.frame
import pytest

from cdc2ch.base.errors import ConfigError
from cdc2ch.clickhouse import embedded
from cdc2ch.commands import serve


def test_addresses():
    assert serve.parse_address("127.0.0.1:8123") == ("127.0.0.1", 8123)
    assert serve.parse_address("0.0.0.0:9000") == ("0.0.0.0", 9000)
    assert serve.parse_address("[::1]:8123") == ("::1", 8123)
    assert serve.parse_address("8123") == ("127.0.0.1", 8123)
    assert serve.parse_address(":8123") == ("0.0.0.0", 8123)
    for bad in ("host:port", "127.0.0.1:70000", ""):
        with pytest.raises(ConfigError, match="HOST:PORT"):
            serve.parse_address(bad)


def test_tls_needs_both_files_that_exist(tmp_path):
    assert serve.tls_context(None, None) is None
    with pytest.raises(ConfigError, match="both --serve-tls-cert and --serve-tls-key"):
        serve.tls_context(str(tmp_path / "c.pem"), None)
    with pytest.raises(ConfigError, match="Cannot use the TLS certificate"):
        serve.tls_context(str(tmp_path / "c.pem"), str(tmp_path / "k.pem"))


def test_decompression_is_bounded():
    data = b"x" * 10_000
    assert serve.decompress(lz4.frame.compress(data) * 2, "lz4", 20_000) == data * 2
    assert serve.decompress(gzip.compress(data), "gzip", 10_000) == data
    for encoding, packed in (("lz4", lz4.frame.compress(data)), ("gzip", gzip.compress(data))):
        with pytest.raises(serve.ClientError) as err:
            serve.decompress(packed, encoding, 9_999)
        assert err.value.status == 413
    with pytest.raises(serve.ClientError) as err:
        serve.decompress(b"abc", "br", 100)
    assert err.value.status == 415


def _headers(**values) -> Message:
    msg = Message()
    for k, v in values.items():
        msg[k.replace("_", "-")] = v
    return msg


def test_credentials_as_clickhouse_takes_them():
    class H:
        def __init__(self, **headers):
            self.headers = _headers(**headers)

    basic = "Basic " + base64.b64encode(b"grafana:pa:ss").decode()
    creds = serve.ClickHouseHTTP._credentials
    assert creds(H(Authorization=basic), {}) == (True, "grafana", "pa:ss")
    assert creds(H(X_ClickHouse_User="u", X_ClickHouse_Key="k"), {}) == (True, "u", "k")
    assert creds(H(), {"user": "u", "password": "p"}) == (True, "u", "p")
    assert creds(H(), {}) == (False, "default", "")
    server = serve.ClickHouseHTTP(engine=None, user="default", password="s3cret")
    assert server._authenticated("default", "s3cret")
    assert not server._authenticated("default", "") and not server._authenticated("other", "s3cret")
    assert server.url == "http://default@127.0.0.1:0/"  # the user, never the password


def test_the_holder_file_announces_the_service(tmp_path):
    embedded._write_holder(tmp_path)
    embedded.announce_service(tmp_path, "http://default@127.0.0.1:8123/", None)
    info = json.loads((tmp_path / embedded.HOLDER_FILE).read_text())
    assert info["pid"] == os.getpid() and embedded._service(tmp_path) == {
        "url": "http://default@127.0.0.1:8123/"
    }
    embedded.withdraw_service(tmp_path)
    assert embedded._service(tmp_path) is None and "pid" in json.loads(
        (tmp_path / embedded.HOLDER_FILE).read_text()
    )
