"""A small measurement of the HTTP transport (docs/server.md, "Transport"): not a test.

Starts `kimirt serve` (the built-in model; $KIMIRT_BINARY or build/kimirt), then for 0 and 100
slow clients (each sends one header byte every 2 s) reports GET /health latency (median and max
of 10 calls (3 s timeout), each on a new connection) and GET /health requests/s over 4 keep-alive connections
for 3 s. Run: python3 tests/python/http_load_probe.py [--port N]
(--port: measure a server already listening on 127.0.0.1:N instead, e.g. another library's).
"""
import http.client
import socket
import statistics
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from conftest import ServerProcess  # noqa: E402


def health_latency(port, n=10):
    times = []
    for _ in range(n):
        t0 = time.monotonic()
        try:
            c = http.client.HTTPConnection("127.0.0.1", port, timeout=3)
            c.request("GET", "/health")
            c.getresponse().read()
            c.close()
            times.append(time.monotonic() - t0)
        except OSError:
            times.append(float("inf"))
    return statistics.median(times), max(times)


def requests_per_second(port, seconds=3.0, clients=4):
    count = [0] * clients
    stop = time.monotonic() + seconds

    def run(i):
        c = http.client.HTTPConnection("127.0.0.1", port, timeout=3)
        try:
            while time.monotonic() < stop:
                c.request("GET", "/health")
                c.getresponse().read()
                count[i] += 1
        except OSError:
            pass

    threads = [threading.Thread(target=run, args=(i,)) for i in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return sum(count) / seconds


class External:
    def __init__(self, port):
        self.port = port

    def stop(self):
        pass


def main():
    server = External(int(sys.argv[2])) if sys.argv[1:2] == ["--port"] else ServerProcess([])
    try:
        slow, stop = [], threading.Event()
        for label, n_slow in (("0 slow clients", 0), ("100 slow clients", 100)):
            while len(slow) < n_slow:
                slow.append(socket.create_connection(("127.0.0.1", server.port)))

            def trickle():
                request = b"GET /health HTTP/1.1\r\nHost: x\r\n" * 100
                i = 0
                while not stop.wait(2.0):
                    for s in slow:
                        try:
                            s.send(request[i:i + 1])
                        except OSError:
                            pass
                    i += 1

            threading.Thread(target=trickle, daemon=True).start()
            time.sleep(0.5)
            median, worst = health_latency(server.port)
            rps = requests_per_second(server.port)
            print(f"{label}: /health median {median * 1e3:.1f} ms, max {worst * 1e3:.1f} ms, {rps:.0f} requests/s")
        stop.set()
        for s in slow:
            s.close()
    finally:
        server.stop()


if __name__ == "__main__":
    main()
