"""A real S3 server on loopback for the remote tests and the benchmark.

``moto`` in server mode (``pip install 'moto[server]'``) runs in a child
process on 127.0.0.1 at a free port, and is stopped afterwards; nothing else
is ever contacted. Trees are uploaded with boto3 (moto's own dependency).
"""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

HOST = "127.0.0.1"
CREDENTIALS = {
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_DEFAULT_REGION": "us-east-1",
    "AWS_REGION": "us-east-1",
}


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((HOST, 0))
        return int(s.getsockname()[1])


def _wait_listening(port: int, proc: subprocess.Popen[bytes], seconds: float = 30.0) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"moto_server exited with {proc.returncode}")
        with contextlib.suppress(OSError), socket.create_connection((HOST, port), timeout=0.5):
            return
        time.sleep(0.1)
    raise RuntimeError(f"moto_server did not listen on {HOST}:{port} within {seconds} s")


@contextlib.contextmanager
def moto_server(env: dict[str, str] | None = None) -> Iterator[str]:
    """Run moto's S3 server on 127.0.0.1 at a free port; yields its endpoint URL."""
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "moto.server", "-H", HOST, "-p", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env={**os.environ, **(env or {})},
    )
    try:
        _wait_listening(port, proc)
        yield f"http://{HOST}:{port}"
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)


def s3_env(endpoint: str) -> dict[str, str]:
    """The environment a scan of the server needs (the standard AWS names)."""
    return {**CREDENTIALS, "AWS_ENDPOINT_URL": endpoint}


def client(endpoint: str) -> Any:
    import boto3

    return boto3.client(
        "s3",
        endpoint_url=endpoint,
        aws_access_key_id=CREDENTIALS["AWS_ACCESS_KEY_ID"],
        aws_secret_access_key=CREDENTIALS["AWS_SECRET_ACCESS_KEY"],
        region_name=CREDENTIALS["AWS_DEFAULT_REGION"],
    )


def upload_tree(s3: Any, bucket: str, root: Path, prefix: str) -> int:
    """Put every file under ``root`` (links followed) at ``prefix/<relative>``;
    returns the bytes uploaded."""
    total = 0
    for dirpath, _dirs, files in os.walk(root, followlinks=True):
        for name in sorted(files):
            path = Path(dirpath) / name
            key = f"{prefix}/{path.relative_to(root).as_posix()}"
            data = path.read_bytes()
            s3.put_object(Bucket=bucket, Key=key, Body=data)
            total += len(data)
    return total
