#!/usr/bin/env python3
"""An independent second client for the small-request rows: sequential `fs/getMetadata`
(or `environment/status`) round trips over a plain WebSocket, written against the
protocol text only (Python standard library, no code shared with the server or the
compiled bench).

    rtt.py [--method fs/getMetadata] [--count 20000] [--perf] SERVER...

SERVER is `exec-server` (our release binary under target/release), `codex` (the codex CLI
found as the bench finds it) or a path to either. The servers are started in turn, each
measured `--rounds` times alternately, and the medians of p50/p99 per server printed.
With `--perf`, `perf stat` counts the server's system calls and context switches during
one extra run, per request.
"""
import argparse
import base64
import json
import os
import re
import signal
import socket
import statistics
import struct
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def codex_bin():
    if os.environ.get("CODEX_BIN"):
        return os.environ["CODEX_BIN"]
    return os.path.expanduser("~/.cache/exec-server/codex-0.171.0/node_modules/.bin/codex")


class Server:
    """A server listening on ws://127.0.0.1:<port>, started in its own process group."""

    def __init__(self, name):
        self.home = tempfile.mkdtemp()
        if name == "codex":
            argv = [codex_bin(), "exec-server", "--listen", "ws://127.0.0.1:0"]
        else:
            path = name if "/" in name else os.path.join(ROOT, "target/release/exec-server")
            argv = [path, "--listen", "ws://127.0.0.1:0"]
        env = dict(os.environ, HOME=self.home, CODEX_HOME=self.home, RUST_LOG="error")
        self.proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                     env=env, start_new_session=True)
        line = self.proc.stdout.readline().decode()
        match = re.search(r"ws://127\.0\.0\.1:(\d+)", line)
        if not match:
            self.stop()
            raise SystemExit(f"{name}: no listen address in {line!r}")
        self.port = int(match.group(1))
        self.pid = self.serving_pid()

    def serving_pid(self):
        """The process that owns the listening socket (codex's launcher execs a child)."""
        out = subprocess.run(["ss", "-Htlnp", f"sport = :{self.port}"], capture_output=True,
                             text=True).stdout
        found = re.search(r"pid=(\d+)", out)
        return int(found.group(1)) if found else self.proc.pid

    def stop(self):
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.proc.wait()


class WebSocket:
    """The client side of RFC 6455: masked text frames out, unmasked frames in."""

    def __init__(self, port):
        self.sock = socket.create_connection(("127.0.0.1", port))
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        key = base64.b64encode(os.urandom(16)).decode()
        self.sock.sendall((f"GET / HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nUpgrade: websocket\r\n"
                           f"Connection: Upgrade\r\nSec-WebSocket-Key: {key}\r\n"
                           "Sec-WebSocket-Version: 13\r\n\r\n").encode())
        self.buf = b""
        while b"\r\n\r\n" not in self.buf:
            self.buf += self.sock.recv(65536)
        head, self.buf = self.buf.split(b"\r\n\r\n", 1)
        if b" 101 " not in head.split(b"\r\n")[0]:
            raise SystemExit(f"upgrade refused: {head[:80]!r}")

    def send(self, text):
        data = text.encode()
        mask = os.urandom(4)
        n = len(data)
        if n < 126:
            header = struct.pack("!BB", 0x81, 0x80 | n)
        elif n < 65536:
            header = struct.pack("!BBH", 0x81, 0x80 | 126, n)
        else:
            header = struct.pack("!BBQ", 0x81, 0x80 | 127, n)
        masked = bytes(b ^ mask[i % 4] for i, b in enumerate(data))
        self.sock.sendall(header + mask + masked)

    def _need(self, n):
        while len(self.buf) < n:
            chunk = self.sock.recv(65536)
            if not chunk:
                raise SystemExit("connection closed")
            self.buf += chunk

    def recv(self):
        """The next text or binary message, its frames joined (control frames skipped)."""
        parts = []
        while True:
            self._need(2)
            fin, opcode, n = self.buf[0] & 0x80, self.buf[0] & 0x0F, self.buf[1] & 0x7F
            start = 2
            if n == 126:
                self._need(4)
                n, start = struct.unpack("!H", self.buf[2:4])[0], 4
            elif n == 127:
                self._need(10)
                n, start = struct.unpack("!Q", self.buf[2:10])[0], 10
            self._need(start + n)
            payload, self.buf = self.buf[start:start + n], self.buf[start + n:]
            if opcode in (0, 1, 2):
                parts.append(payload)
                if fin:
                    return b"".join(parts)

    def call(self, id_, method, params):
        self.send(json.dumps({"jsonrpc": "2.0", "id": id_, "method": method, "params": params}))
        while True:
            message = json.loads(self.recv())
            if message.get("id") == id_:
                if "error" in message:
                    raise SystemExit(f"{method}: {message['error']}")
                return message["result"]


def params_of(method):
    if method == "fs/getMetadata":
        return {"path": "file:///etc/hostname"}
    return {}


def run(port, method, count):
    ws = WebSocket(port)
    ws.call(0, "initialize", {"clientName": "rtt.py"})
    ws.send(json.dumps({"jsonrpc": "2.0", "method": "initialized", "params": {}}))
    params = params_of(method)
    for i in range(count // 10):
        ws.call(i + 1, method, params)
    samples = []
    clock = time.perf_counter_ns
    for i in range(count):
        start = clock()
        ws.call(count + i + 1, method, params)
        samples.append(clock() - start)
    ws.sock.close()
    samples.sort()
    return samples[len(samples) // 2] / 1000, samples[int(len(samples) * 0.99)] / 1000


def perf_counts(server, method, count):
    events = "raw_syscalls:sys_enter,context-switches,cpu-clock"
    perf = subprocess.Popen(["perf", "stat", "-x,", "-e", events, "-p",
                             str(server.pid)], stderr=subprocess.PIPE, text=True)
    time.sleep(0.2)
    run(server.port, method, count)
    perf.send_signal(signal.SIGINT)
    _, err = perf.communicate()
    counts = {}
    for line in err.splitlines():
        fields = line.split(",")
        if len(fields) > 2 and fields[0].replace(".", "").isdigit():
            counts[fields[2]] = float(fields[0])
    total = count + count // 10 + 2
    return {k: v / total for k, v in counts.items()}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("servers", nargs="+")
    ap.add_argument("--method", default="fs/getMetadata")
    ap.add_argument("--count", type=int, default=20000)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--perf", action="store_true")
    args = ap.parse_args()
    servers = {name: Server(name) for name in args.servers}
    results = {name: [] for name in servers}
    try:
        for _ in range(args.rounds):
            for name, server in servers.items():
                results[name].append(run(server.port, args.method, args.count))
        print(f"{args.method}, {args.count} sequential round trips, median of {args.rounds} rounds")
        for name, runs in results.items():
            p50 = statistics.median(r[0] for r in runs)
            p99 = statistics.median(r[1] for r in runs)
            line = f"  {name:12} p50 {p50:7.1f} µs   p99 {p99:7.1f} µs"
            if args.perf:
                counts = perf_counts(servers[name], args.method, args.count)
                line += "   per request: " + ", ".join(
                    f"{k} {v:.2f}" for k, v in sorted(counts.items()))
            print(line, flush=True)
    finally:
        for server in servers.values():
            server.stop()


if __name__ == "__main__":
    main()
