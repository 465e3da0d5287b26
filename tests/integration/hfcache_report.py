#!/usr/bin/env python3
"""hfcache_report.py SOCK MODEL LAYER EXPERT

For test_hfcache_serve.sh: one client of shoald (docs/protocol.md) that
says HELLO, OPENs MODEL and REPORTs expert LAYER:EXPERT damaged — what an
engine does when the bytes it read do not match the item's XXH3-128 — and
exits 0 once shoald answers OK (any descriptor it is handed is closed)."""
import array
import json
import os
import socket
import struct
import sys

MAGIC = b"SHL\x01"
HELLO, OPEN, REPORT = 1, 2, 8
OK, ERROR, HELLO_OK, OPEN_OK = 64, 65, 66, 67


def frame(t, body, rid):
    return MAGIC + struct.pack("<IHHIQ", len(body), t, 0, 0, rid) + body


def sstr(b):
    return struct.pack("<H", len(b)) + b


class Conn:
    def __init__(self, path):
        self.s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.s.settimeout(30)
        self.s.connect(path)
        self.buf = b""

    def recv(self):
        fds = array.array("i")
        data, anc, _flags, _addr = self.s.recvmsg(1 << 16, socket.CMSG_SPACE(64 * fds.itemsize))
        for level, kind, payload in anc:
            if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                fds.frombytes(payload[:len(payload) - len(payload) % fds.itemsize])
        for fd in fds:
            os.close(fd)
        if not data:
            raise SystemExit("shoald closed the connection")
        self.buf += data

    def reply(self, rid):
        """(type, body) of the answer to request rid (PROGRESS frames skipped)."""
        while True:
            while len(self.buf) >= 24:
                n, t, _f, _r, got = struct.unpack_from("<IHHIQ", self.buf, 4)
                if len(self.buf) < 24 + n:
                    break
                body, self.buf = self.buf[24:24 + n], self.buf[24 + n:]
                if got == rid and t != 72:
                    return t, body
            self.recv()

    def call(self, t, body, rid, want):
        self.s.sendall(frame(t, body, rid))
        got, body = self.reply(rid)
        if got == ERROR:
            n = struct.unpack_from("<H", body, 4)[0]
            raise SystemExit("ERROR %d: %s" % (struct.unpack_from("<i", body)[0],
                                               body[6:6 + n].decode()))
        assert got == want, (got, want)
        return body


def main():
    path, model, layer, expert = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    c = Conn(path)
    c.call(HELLO, struct.pack("<H", 3) + sstr(b"hfcache_report") + struct.pack("<I", os.getpid()),
           1, HELLO_OK)
    handle = struct.unpack_from("<I", c.call(OPEN, sstr(model.encode()), 2, OPEN_OK))[0]
    rep = json.dumps({"tier": "ram", "handle": handle,
                      "damaged": [{"layer": layer, "expert": expert}]}).encode()
    c.call(REPORT, struct.pack("<I", len(rep)) + rep, 3, OK)
    print("reported %s %d:%d damaged" % (model, layer, expert))


main()
