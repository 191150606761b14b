"""Fixtures for the end-to-end tests: a `kimirt serve` process on 127.0.0.1.

The binary is $KIMIRT_BINARY, else build/kimirt beside this checkout. It is started with
`--port 0`; the port it bound is read from its "listening on http://HOST:PORT" line. Without
--model it serves the built-in model, so no download is needed.
"""
import os
import re
import subprocess
import threading
import time
import urllib.request
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
LISTEN_RE = re.compile(r"listening on http://127\.0\.0\.1:(\d+)")


def kimirt_binary():
    return Path(os.environ.get("KIMIRT_BINARY", REPO / "build" / "kimirt"))


class ServerProcess:
    def __init__(self, args, startup_timeout=120.0, env=None):
        binary = kimirt_binary()
        assert binary.exists(), f"{binary} is not built (scripts/setup.sh builds it; KIMIRT_BINARY names another)"
        cmd = [str(binary), "serve", "--host", "127.0.0.1", "--port", "0", *args]
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                     env=None if env is None else {**os.environ, **env})
        self.port = None
        self.stderr_lines = []
        # Collect stderr on a thread so a chatty server never blocks on a full pipe.
        threading.Thread(target=self._drain, args=(self.proc.stderr, self.stderr_lines), daemon=True).start()
        deadline = time.monotonic() + startup_timeout
        while time.monotonic() < deadline:
            line = self.proc.stdout.readline()
            if not line:
                break
            m = LISTEN_RE.search(line)
            if m:
                self.port = int(m.group(1))
                break
        if self.port is None:
            self.stop()
            raise RuntimeError("kimirt serve did not start:\n" + "".join(self.stderr_lines))
        threading.Thread(target=self._drain, args=(self.proc.stdout, []), daemon=True).start()
        self.base_url = f"http://127.0.0.1:{self.port}"

    @staticmethod
    def _drain(stream, sink):
        for line in stream:
            sink.append(line)

    def get(self, path):
        with urllib.request.urlopen(self.base_url + path, timeout=30) as r:
            return r.status, r.read().decode()

    def metrics(self):
        """The samples of /metrics that carry no label but vLLM's model_name, as {name: value}."""
        _, text = self.get("/metrics")
        out = {}
        for line in text.splitlines():
            if line.startswith("#") or not line.strip():
                continue
            series, value = line.rsplit(" ", 1)
            name, _, labels = series.partition("{")
            if labels and not re.fullmatch(r'model_name="[^"]*"}', labels):
                continue
            out[name] = float(value)
        return out

    def stop(self):
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                return self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return self.proc.returncode


@pytest.fixture(scope="session")
def server():
    s = ServerProcess([])
    yield s
    rc = s.stop()
    assert rc == 0, "kimirt serve did not exit cleanly on SIGTERM:\n" + "".join(s.stderr_lines)
