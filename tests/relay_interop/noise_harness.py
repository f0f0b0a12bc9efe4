#!/usr/bin/env python3
"""A relay harness written only from RELAY.md, on an independent Noise implementation.

It speaks the whole harness side of remote mode with the Python `noiseprotocol` package
(Noise_IK_25519_AESGCM_SHA256) and the standard library: the registry `connect` call
(RELAY §7.4), a WebSocket client, the protobuf frame schema (§2), the prologue (§3.3), the
IK handshake with the authorisation as msg1 payload (§3.4), and records carrying
length-prefixed JSON-RPC messages (§4) with sequence numbers and acknowledgements (§5).

Usage: noise_harness.py --registry URL --environment ID --workdir DIR
The harness bearer token is read from EXEC_SERVER_RELAY_TOKEN. On success the script
prints one JSON object on stdout that describes what it observed; on failure it exits
non-zero with the reason on stderr.
"""

import argparse
import base64
import hashlib
import json
import os
import socket
import struct
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
import uuid

try:
    from noise.connection import Keypair, NoiseConnection
except ImportError:
    sys.stderr.write(
        "the Python package noiseprotocol is not installed; "
        "install it with: python3 -m pip install --quiet noiseprotocol==0.3.1\n"
    )
    sys.exit(3)
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey

SUITE = "Noise_IK_25519_AESGCM_SHA256"
PROFILE = "noise_ik_v1"
DOMAIN = b"codex-exec-server-relay-noise/v1"
MAX_RECORD = 61_440
IO_TIMEOUT = 20.0


class Failure(Exception):
    pass


class Closed(Failure):
    def __init__(self, code):
        super().__init__("the peer closed the socket with code %s" % code)
        self.code = code


def check(condition, message):
    if not condition:
        raise Failure(message)


# ---- protobuf (RELAY §2) -------------------------------------------------------------


def varint(value):
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def field_varint(number, value):
    return varint(number << 3) + varint(value) if value else b""


def field_bytes(number, value, always=False):
    if not value and not always:
        return b""
    return varint((number << 3) | 2) + varint(len(value)) + value


def encode_frame(stream_id, body_kind, body=b"", ack=0, ack_bits=0):
    """One RelayMessageFrame, fields in ascending order, defaults omitted (§2.3)."""
    number = {
        "data": 5,
        "ack_frame": 6,
        "resume": 7,
        "reset": 8,
        "heartbeat": 9,
        "handshake": 10,
    }[body_kind]
    return (
        field_varint(1, 1)
        + field_bytes(2, stream_id.encode())
        + field_varint(3, ack)
        + field_varint(4, ack_bits)
        + field_bytes(number, body, always=True)
    )


def data_body(seq, payload):
    return field_varint(1, seq) + field_varint(3, 1) + field_bytes(4, payload)


def read_varint(buf, pos):
    shift = value = 0
    while True:
        check(pos < len(buf), "truncated varint in a frame")
        byte = buf[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        shift += 7
        if not byte & 0x80:
            return value, pos


def parse_fields(buf):
    fields = {}
    pos = 0
    while pos < len(buf):
        key, pos = read_varint(buf, pos)
        number, wire = key >> 3, key & 7
        if wire == 0:
            value, pos = read_varint(buf, pos)
        elif wire == 2:
            length, pos = read_varint(buf, pos)
            value = bytes(buf[pos : pos + length])
            check(len(value) == length, "truncated field in a frame")
            pos += length
        elif wire == 1:
            value, pos = buf[pos : pos + 8], pos + 8
        elif wire == 5:
            value, pos = buf[pos : pos + 4], pos + 4
        else:
            raise Failure("unsupported wire type %d" % wire)
        fields[number] = value
    return fields


BODY_KINDS = {5: "data", 6: "ack_frame", 7: "resume", 8: "reset", 9: "heartbeat", 10: "handshake"}


def decode_frame(buf):
    f = parse_fields(buf)
    frame = {
        "version": f.get(1, 0),
        "stream_id": f.get(2, b"").decode(),
        "ack": f.get(3, 0),
        "ack_bits": f.get(4, 0),
        "kind": None,
    }
    for number, kind in BODY_KINDS.items():
        if number in f:
            frame["kind"] = kind
            sub = parse_fields(f[number])
            if kind == "data":
                frame["seq"] = sub.get(1, 0)
                frame["segment_index"] = sub.get(2, 0)
                frame["segment_count"] = sub.get(3, 0)
                frame["payload"] = sub.get(4, b"")
            elif kind == "handshake":
                frame["payload"] = sub.get(1, b"")
            elif kind == "reset":
                frame["reason"] = sub.get(1, b"").decode(errors="replace")
            elif kind == "resume":
                frame["next_seq"] = sub.get(1, 0)
    return frame


# ---- WebSocket client (RFC 6455, client side) ----------------------------------------


class WebSocket:
    GUID = b"258EAFA5-E914-47DA-95CA-C5AB0DC85B11"
    client = True

    @classmethod
    def accept(cls, listener):
        """The server side of one upgrade on `listener` (used by noise_executor.py)."""
        ws = cls.__new__(cls)
        ws.client = False
        ws.sock, _ = listener.accept()
        ws.sock.settimeout(IO_TIMEOUT)
        ws.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        ws.buf = b""
        while b"\r\n\r\n" not in ws.buf:
            chunk = ws.sock.recv(65536)
            check(chunk, "the client closed the connection during the upgrade")
            ws.buf += chunk
        head, ws.buf = ws.buf.split(b"\r\n\r\n", 1)
        lines = head.decode("latin-1").split("\r\n")
        ws.target = lines[0].split()[1]
        headers = {}
        for line in lines[1:]:
            name, _, value = line.partition(":")
            headers[name.strip().lower()] = value.strip()
        check(headers.get("upgrade", "").lower() == "websocket", "not a WebSocket upgrade")
        key = headers["sec-websocket-key"].encode()
        accept = base64.b64encode(hashlib.sha1(key + cls.GUID).digest()).decode()
        ws.sock.sendall(
            (
                "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
                "Sec-WebSocket-Accept: %s\r\n\r\n" % accept
            ).encode()
        )
        return ws

    def __init__(self, url):
        parts = urllib.parse.urlsplit(url)
        check(parts.scheme == "ws", "expected a ws:// rendezvous URL on loopback, got %s" % parts.scheme)
        self.sock = socket.create_connection((parts.hostname, parts.port or 80), timeout=IO_TIMEOUT)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        key = base64.b64encode(os.urandom(16))
        target = parts.path + ("?" + parts.query if parts.query else "")
        request = (
            "GET %s HTTP/1.1\r\nHost: %s\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
            "Sec-WebSocket-Key: %s\r\nSec-WebSocket-Version: 13\r\n\r\n"
        ) % (target, parts.netloc, key.decode())
        self.sock.sendall(request.encode())
        self.buf = b""
        while b"\r\n\r\n" not in self.buf:
            chunk = self.sock.recv(65536)
            check(chunk, "the rendezvous closed the connection during the upgrade")
            self.buf += chunk
        head, self.buf = self.buf.split(b"\r\n\r\n", 1)
        lines = head.decode("latin-1").split("\r\n")
        check(lines[0].split()[1] == "101", "upgrade refused: %s" % lines[0])
        headers = {}
        for line in lines[1:]:
            name, _, value = line.partition(":")
            headers[name.strip().lower()] = value.strip()
        accept = base64.b64encode(hashlib.sha1(key + self.GUID).digest()).decode()
        check(headers.get("sec-websocket-accept") == accept, "bad Sec-WebSocket-Accept")
        check("sec-websocket-extensions" not in headers, "a WebSocket extension was negotiated")

    def _send(self, opcode, payload):
        header = bytearray([0x80 | opcode])
        n = len(payload)
        masked_bit = 0x80 if self.client else 0
        if n < 126:
            header.append(masked_bit | n)
        elif n < 65536:
            header.append(masked_bit | 126)
            header += struct.pack(">H", n)
        else:
            header.append(masked_bit | 127)
            header += struct.pack(">Q", n)
        if not self.client:
            self.sock.sendall(bytes(header) + payload)
            return
        mask = os.urandom(4)
        header += mask
        if n:
            repeated = (mask * (n // 4 + 1))[:n]
            masked = (int.from_bytes(payload, "big") ^ int.from_bytes(repeated, "big")).to_bytes(n, "big")
        else:
            masked = b""
        self.sock.sendall(bytes(header) + masked)

    def send_binary(self, payload):
        self._send(0x2, payload)

    def close(self, code=1000):
        try:
            self._send(0x8, struct.pack(">H", code))
            self.sock.close()
        except OSError:
            pass

    def _exact(self, n):
        while len(self.buf) < n:
            chunk = self.sock.recv(65536)
            check(chunk, "the rendezvous closed the TCP connection")
            self.buf += chunk
        out, self.buf = self.buf[:n], self.buf[n:]
        return out

    def recv(self):
        """The next binary message; raises on a close or a text message."""
        message = b""
        while True:
            b0, b1 = self._exact(2)
            opcode, n = b0 & 0x0F, b1 & 0x7F
            check(bool(b1 & 0x80) != self.client, "frame masking is the wrong way round")
            if n == 126:
                (n,) = struct.unpack(">H", self._exact(2))
            elif n == 127:
                (n,) = struct.unpack(">Q", self._exact(8))
            mask = self._exact(4) if b1 & 0x80 else None
            payload = self._exact(n)
            if mask and n:
                repeated = (mask * (n // 4 + 1))[:n]
                payload = (int.from_bytes(payload, "big") ^ int.from_bytes(repeated, "big")).to_bytes(n, "big")
            if opcode == 0x9:
                self._send(0xA, payload)
            elif opcode == 0xA:
                pass
            elif opcode == 0x8:
                code = struct.unpack(">H", payload[:2])[0] if len(payload) >= 2 else None
                raise Closed(code)
            elif opcode == 0x1:
                raise Failure("a text message arrived on a relay socket")
            else:
                message += payload
                if b0 & 0x80:
                    return message


# ---- registry (RELAY §7) -------------------------------------------------------------


def b64(data):
    return base64.b64encode(data).decode()


def connect_bundle(registry, environment, token, public_key, deadline):
    url = "%s/cloud/environment/%s/connect" % (
        registry.rstrip("/"),
        urllib.parse.quote(environment, safe="-._~"),
    )
    body = json.dumps({"harness_public_key": {"suite": SUITE, "x25519_public_key": b64(public_key)}}).encode()
    while True:
        request = urllib.request.Request(
            url,
            data=body,
            method="POST",
            headers={
                "Authorization": "Bearer " + token,
                "Content-Type": "application/json",
                "Accept": "application/json",
            },
        )
        try:
            with urllib.request.urlopen(request, timeout=IO_TIMEOUT) as response:
                bundle = json.loads(response.read())
                break
        except urllib.error.HTTPError as e:
            # The executor may still be starting (§7.6 harness policy).
            if e.code in (404, 503) and time.monotonic() < deadline:
                time.sleep(0.1)
                continue
            raise Failure("connect answered HTTP %d" % e.code)
    check(bundle["environment_id"] == environment, "the bundle names another environment")
    check(bundle["security_profile"] == PROFILE, "unexpected security profile")
    key = bundle["executor_public_key"]
    check(key["suite"] == SUITE, "unexpected suite in the executor key")
    raw = base64.b64decode(key["x25519_public_key"], validate=True)
    check(len(raw) == 32, "executor key is not 32 bytes")
    bundle["executor_key_bytes"] = raw
    return bundle


def lp(data):
    return struct.pack(">Q", len(data)) + data


def prologue(environment, registration, stream_id):
    return lp(DOMAIN) + lp(environment.encode()) + lp(registration.encode()) + lp(stream_id.encode())


# ---- one stream (RELAY §3.4, §4, §5) -------------------------------------------------


class Stream:
    def __init__(self, registry, environment, token, deadline):
        private = X25519PrivateKey.generate()
        raw = serialization.Encoding.Raw
        self.private = private.private_bytes(raw, serialization.PrivateFormat.Raw, serialization.NoEncryption())
        self.public = private.public_key().public_bytes(raw, serialization.PublicFormat.Raw)
        self.bundle = connect_bundle(registry, environment, token, self.public, deadline)
        self.stream_id = str(uuid.uuid4())
        self.ws = WebSocket(self.bundle["url"])
        self.noise = NoiseConnection.from_name(SUITE.encode())
        self.noise.set_as_initiator()
        self.noise.set_keypair_from_private_bytes(Keypair.STATIC, self.private)
        self.noise.set_keypair_from_public_bytes(Keypair.REMOTE_STATIC, self.bundle["executor_key_bytes"])
        self.noise.set_prologue(prologue(environment, self.bundle["executor_registration_id"], self.stream_id))
        self.next_seq = 1
        self.delivered = 0
        self.reorder = {}
        self.plain = b""
        self.messages = []
        self.records_received = 0
        self.largest_record = 0
        self.peer_ack = 0
        self.msg1_len = self.msg2_len = None

    def send_frame(self, kind, body=b""):
        self.ws.send_binary(encode_frame(self.stream_id, kind, body, ack=self.delivered))

    def handshake(self):
        authorization = self.bundle["harness_key_authorization"].encode()
        self.noise.start_handshake()
        msg1 = bytes(self.noise.write_message(authorization))
        self.msg1_len = len(msg1)
        check(self.msg1_len == 96 + len(authorization), "msg1 is not 96 + P bytes")
        # msg1 is the first frame on the socket, ack fields 0 (§3.4 step 4).
        self.ws.send_binary(encode_frame(self.stream_id, "handshake", field_bytes(1, msg1)))
        while True:
            frame = self.next_frame()
            if frame["kind"] == "handshake":
                msg2 = frame["payload"]
                break
            if frame["kind"] == "reset":
                raise Failure("reset during the handshake: %s" % frame["reason"])
            check(frame["kind"] != "data", "data before msg2")
        self.msg2_len = len(msg2)
        check(self.msg2_len == 48, "msg2 is not 48 bytes")
        payload = self.noise.read_message(msg2)
        check(payload == b"", "msg2 carries a payload")
        check(self.noise.handshake_finished, "the IK handshake did not finish after msg2")

    def next_frame(self):
        frame = decode_frame(self.ws.recv())
        check(frame["version"] == 1, "frame version is not 1")
        check(frame["stream_id"] == self.stream_id, "a frame for another stream reached this socket")
        return frame

    def send_record(self, plaintext):
        check(1 <= len(plaintext) <= MAX_RECORD, "record size out of range")
        ciphertext = self.noise.encrypt(plaintext)
        check(len(ciphertext) == len(plaintext) + 16, "AES-GCM tag is not 16 bytes")
        self.send_frame("data", data_body(self.next_seq, ciphertext))
        self.next_seq += 1

    def send_bytes(self, stream_bytes):
        """Cuts part of the byte stream into records of at most 61,440 bytes."""
        for start in range(0, len(stream_bytes), MAX_RECORD):
            self.send_record(stream_bytes[start : start + MAX_RECORD])

    @staticmethod
    def framed(message):
        text = json.dumps(message, separators=(",", ":")).encode()
        return struct.pack(">I", len(text)) + text

    def send(self, message):
        self.send_bytes(self.framed(message))

    def pump(self):
        """Reads one frame and applies it; raises on a Reset."""
        frame = self.next_frame()
        if frame["ack"] > self.peer_ack:
            self.peer_ack = frame["ack"]
        kind = frame["kind"]
        if kind == "reset":
            raise StreamReset(frame["reason"])
        if kind != "data":
            return
        check(frame["segment_index"] == 0 and frame["segment_count"] == 1, "segmented data frame")
        seq = frame["seq"]
        if seq > self.delivered and seq not in self.reorder:
            self.reorder[seq] = frame["payload"]
        while self.delivered + 1 in self.reorder:
            ciphertext = self.reorder.pop(self.delivered + 1)
            record = self.noise.decrypt(ciphertext)
            self.delivered += 1
            self.records_received += 1
            self.largest_record = max(self.largest_record, len(record))
            check(1 <= len(record) <= MAX_RECORD, "record plaintext out of range")
            self.plain += record
            while len(self.plain) >= 4:
                (length,) = struct.unpack(">I", self.plain[:4])
                if len(self.plain) < 4 + length:
                    break
                self.messages.append(json.loads(self.plain[4 : 4 + length]))
                self.plain = self.plain[4 + length :]
        # A standalone acknowledgement for every data frame keeps the executor's window open.
        self.send_frame("ack_frame")

    def response(self, request_id):
        while True:
            for i, message in enumerate(self.messages):
                if message.get("id") == request_id:
                    del self.messages[i]
                    return message
            self.pump()

    def call(self, request_id, method, params):
        self.send({"id": request_id, "method": method, "params": params})
        answer = self.response(request_id)
        check("error" not in answer, "%s failed: %s" % (method, answer.get("error")))
        return answer["result"]

    def reset(self, reason):
        self.send_frame("reset", field_bytes(1, reason.encode()))
        self.ws.close(1000)


class StreamReset(Exception):
    def __init__(self, reason):
        super().__init__(reason)
        self.reason = reason


def run(args):
    token = os.environ.get("EXEC_SERVER_RELAY_TOKEN")
    check(token, "EXEC_SERVER_RELAY_TOKEN is not set")
    deadline = time.monotonic() + IO_TIMEOUT
    report = {}

    # The prologue vector of §3.3, as a check of this script's own construction.
    vector = prologue("env-1", "registration-1", "stream-1")
    report["prologue_vector_sha256"] = hashlib.sha256(vector).hexdigest()

    stream = Stream(args.registry, args.environment, token, deadline)
    stream.handshake()
    report["msg1_len"] = stream.msg1_len
    report["authorization_len"] = len(stream.bundle["harness_key_authorization"])
    report["msg2_len"] = stream.msg2_len

    initialized = stream.call(1, "initialize", {"clientName": "python-noise-interop"})
    report["session_id"] = initialized.get("sessionId")
    stream.send({"method": "initialized", "params": {}})
    report["status"] = stream.call(2, "environment/status", {})

    # Two requests in one record, then one request whose length prefix is split across
    # two records (§4: record boundaries are independent of message boundaries).
    stream.send_record(
        stream.framed({"id": 3, "method": "environment/status", "params": {}})
        + stream.framed({"id": 4, "method": "environment/status", "params": {}})
    )
    report["shared_record"] = [stream.response(3).get("result"), stream.response(4).get("result")]
    split = stream.framed({"id": 5, "method": "environment/status", "params": {}})
    stream.send_record(split[:2])
    stream.send_record(split[2:])
    report["split_prefix"] = stream.response(5).get("result")

    # A message larger than one record in each direction.
    content = (b"python-noise-interop " * 6000)[:120_000]
    path = os.path.join(args.workdir, "interop.bin")
    uri = "file://" + path
    records_before = stream.records_received
    stream.call(6, "fs/writeFile", {"path": uri, "dataBase64": b64(content)})
    with open(path, "rb") as written:
        report["file_written_by_executor"] = written.read() == content
    read = stream.call(7, "fs/readFile", {"path": uri})
    report["file_read_back"] = base64.b64decode(read["dataBase64"]) == content
    report["records_for_read"] = stream.records_received - records_before
    report["largest_record"] = stream.largest_record
    # Wait until the executor acknowledged every record sent (it decrypted them all).
    while stream.peer_ack < stream.next_seq - 1:
        stream.pump()
    report["records_sent"] = stream.next_seq - 1
    report["executor_ack"] = stream.peer_ack
    stream.reset("stream_closed")

    # A second stream: one flipped bit in a record must reset it (§3.7).
    tampered = Stream(args.registry, args.environment, token, deadline)
    tampered.handshake()
    ciphertext = bytearray(tampered.noise.encrypt(tampered.framed({"id": 1, "method": "initialize", "params": {"clientName": "x"}})))
    ciphertext[len(ciphertext) // 2] ^= 0x01
    tampered.send_frame("data", data_body(1, bytes(ciphertext)))
    try:
        while True:
            tampered.pump()
            check(not tampered.messages, "a tampered record produced a message")
    except StreamReset as reset:
        report["tampered_reset"] = reset.reason
    tampered.ws.close(1000)
    return report


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--registry", required=True)
    parser.add_argument("--environment", required=True)
    parser.add_argument("--workdir", required=True)
    args = parser.parse_args()
    try:
        report = run(args)
    except (Failure, StreamReset, OSError, ValueError, KeyError) as e:
        sys.stderr.write("interop harness failed: %s: %s\n" % (type(e).__name__, e))
        sys.exit(1)
    print(json.dumps(report, sort_keys=True))


if __name__ == "__main__":
    main()
