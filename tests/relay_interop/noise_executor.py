#!/usr/bin/env python3
"""A relay executor stand-in on an independent Noise implementation, for the Rust harness.

It is the Noise responder of RELAY §3.5 written with the Python `noiseprotocol` package and
the helpers of noise_harness.py: it accepts one WebSocket on 127.0.0.1, reads msg1 for the
prologue of §3.3, checks the authorisation payload, answers msg2, then reads the harness's
records (§4, §5) and answers `initialize` and `environment/status` until the harness
resets the stream.

Usage: noise_executor.py --environment ID --registration ID --authorization TEXT
The first stdout line is a JSON object with the listening port and the executor's public
key (standard base64); after the stream ends, a second line reports what was observed.
"""

import argparse
import base64
import json
import socket
import struct
import sys

from noise_harness import (
    MAX_RECORD,
    SUITE,
    Closed,
    Failure,
    WebSocket,
    check,
    data_body,
    decode_frame,
    encode_frame,
    field_bytes,
    prologue,
)

from noise.connection import Keypair, NoiseConnection
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey


def serve(args, listener, private):
    report = {}
    ws = WebSocket.accept(listener)
    report["upgrade_target"] = ws.target
    frame = decode_frame(ws.recv())
    check(frame["kind"] == "handshake", "the first frame is not a handshake")
    check(frame["ack"] == 0 and frame["ack_bits"] == 0, "msg1 carries ack fields")
    stream_id = frame["stream_id"]
    report["stream_id"] = stream_id
    msg1 = frame["payload"]
    report["msg1_len"] = len(msg1)

    noise = NoiseConnection.from_name(SUITE.encode())
    noise.set_as_responder()
    noise.set_keypair_from_private_bytes(Keypair.STATIC, private)
    noise.set_prologue(prologue(args.environment, args.registration, stream_id))
    noise.start_handshake()
    payload = bytes(noise.read_message(msg1))
    report["authorization_matches"] = payload == args.authorization.encode()
    remote = noise.noise_protocol.handshake_state.rs.public_bytes
    report["harness_public_key"] = base64.b64encode(remote).decode()
    msg2 = bytes(noise.write_message(b""))
    check(len(msg2) == 48, "msg2 is not 48 bytes")
    check(noise.handshake_finished, "the IK handshake did not finish")
    ws.send_binary(encode_frame(stream_id, "handshake", field_bytes(1, msg2)))

    delivered = 0
    next_seq = 1
    plain = b""
    methods = []

    def send_message(message):
        nonlocal next_seq
        text = json.dumps(message, separators=(",", ":")).encode()
        stream = struct.pack(">I", len(text)) + text
        for start in range(0, len(stream), MAX_RECORD):
            ciphertext = noise.encrypt(stream[start : start + MAX_RECORD])
            ws.send_binary(encode_frame(stream_id, "data", data_body(next_seq, ciphertext), ack=delivered))
            next_seq += 1

    reorder = {}
    try:
        while True:
            frame = decode_frame(ws.recv())
            check(frame["stream_id"] == stream_id, "a frame for another stream")
            if frame["kind"] == "reset":
                report["reset"] = frame["reason"]
                break
            if frame["kind"] != "data":
                continue
            if frame["seq"] > delivered:
                reorder.setdefault(frame["seq"], frame["payload"])
            while delivered + 1 in reorder:
                plain += noise.decrypt(reorder.pop(delivered + 1))
                delivered += 1
                while len(plain) >= 4:
                    (length,) = struct.unpack(">I", plain[:4])
                    if len(plain) < 4 + length:
                        break
                    message = json.loads(plain[4 : 4 + length])
                    plain = plain[4 + length :]
                    methods.append(message.get("method"))
                    if message.get("method") == "initialize":
                        report["client_name"] = message["params"].get("clientName")
                        send_message({"id": message["id"], "result": {"sessionId": "python-session"}})
                    elif message.get("method") == "environment/status":
                        send_message({"id": message["id"], "result": {"status": "python-ready"}})
                    elif "id" in message:
                        send_message({"id": message["id"], "error": {"code": -32601, "message": "unknown"}})
            ws.send_binary(encode_frame(stream_id, "ack_frame", ack=delivered))
    except Closed as closed:
        report["closed"] = closed.code
    report["methods"] = methods
    report["records_received"] = delivered
    return report


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--environment", required=True)
    parser.add_argument("--registration", required=True)
    parser.add_argument("--authorization", required=True)
    args = parser.parse_args()
    key = X25519PrivateKey.generate()
    raw = serialization.Encoding.Raw
    private = key.private_bytes(raw, serialization.PrivateFormat.Raw, serialization.NoEncryption())
    public = key.public_key().public_bytes(raw, serialization.PublicFormat.Raw)
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)
    listener.settimeout(20.0)
    print(json.dumps({"port": listener.getsockname()[1], "public_key": base64.b64encode(public).decode()}), flush=True)
    try:
        report = serve(args, listener, private)
    except (Failure, OSError, ValueError, KeyError) as e:
        sys.stderr.write("interop executor failed: %s: %s\n" % (type(e).__name__, e))
        sys.exit(1)
    print(json.dumps(report, sort_keys=True), flush=True)


if __name__ == "__main__":
    main()
