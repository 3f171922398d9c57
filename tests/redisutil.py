"""Redis for tests: the shared server on 127.0.0.1:6379 under a fresh key prefix per test, or a
private ``redis-server`` on a free port that a test may kill and restart."""

from __future__ import annotations

import shutil
import subprocess
import tempfile
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import redis

from backends.listen import free_port

SHARED_URL = "redis://127.0.0.1:6379/0"


def wipe(url: str, prefix: str) -> None:
    client = redis.Redis.from_url(url)
    try:
        keys = list(client.scan_iter(match="{" + prefix + "}*", count=1000))
        if keys:
            client.delete(*keys)
    finally:
        client.close()


@pytest.fixture
def redis_prefix() -> Iterator[str]:
    """A key prefix no other test uses on the shared Redis; its keys are deleted afterwards."""
    prefix = "test-" + uuid.uuid4().hex[:12]
    try:
        redis.Redis.from_url(SHARED_URL, socket_connect_timeout=1).close()
    except redis.RedisError:  # pragma: no cover - CI starts one
        pytest.skip("no Redis on 127.0.0.1:6379")
    yield prefix
    wipe(SHARED_URL, prefix)


class RedisServer:
    """A private redis-server (no persistence) on a free loopback port. ``args`` go on its command line
    (``--replicaof``, TLS options); ``conf`` names a config file to start with (a Sentinel's, with ``args``
    ``--sentinel``). ``client`` is how the readiness check connects (TLS options, say)."""

    def __init__(self, *args: str, conf: str | None = None, port: int | None = None,
                 client: dict[str, Any] | None = None) -> None:  # fmt: skip
        self.port = port or free_port()
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self.args, self.conf, self.client = args, conf, client or {}
        self.proc: subprocess.Popen[bytes] | None = None
        self.dir: str | None = None  # its working folder, kept across a restart

    def start(self) -> RedisServer:
        exe = shutil.which("redis-server") or pytest.skip("redis-server is not installed")
        head = [exe] if self.conf is None else [exe, self.conf]
        # its own folder: a replica writes the snapshot its master sends (dump.rdb) where it runs
        self.dir = self.dir or tempfile.mkdtemp(prefix="redis-")
        self.proc = subprocess.Popen(
            [*head, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
             "--dir", self.dir, *self.args],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        deadline = time.monotonic() + 5
        while True:
            try:
                client = redis.Redis(port=self.port, socket_connect_timeout=0.2, **self.client)
                try:
                    client.ping()
                    return self
                finally:
                    client.close()
            except redis.ConnectionError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.02)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        self.proc = None

    def remove(self) -> None:
        """Stop it and delete its folder."""
        self.stop()
        if self.dir is not None:
            shutil.rmtree(self.dir, ignore_errors=True)
            self.dir = None


@pytest.fixture
def private_redis() -> Iterator[RedisServer]:
    srv = RedisServer().start()
    yield srv
    srv.remove()
