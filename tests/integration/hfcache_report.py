#!/usr/bin/env python3
"""hfcache_report.py SOCK MODEL LAYER EXPERT

For test_hfcache_serve.sh: one client of shoald (docs/protocol.md) that
says HELLO, OPENs MODEL and REPORTs expert LAYER:EXPERT damaged — what an
engine does when the bytes it read do not match the item's XXH3-128 — and
exits 0 once shoald answers OK (any descriptor it is handed is closed)."""
import json
import os
import struct
import sys

from shoalproto import HELLO, HELLO_OK, OK, OPEN, OPEN_OK, REPORT, Conn, sstr


def main():
    path, model, layer, expert = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    c = Conn(path, 30)
    c.call(HELLO, struct.pack("<H", 3) + sstr(b"hfcache_report") + struct.pack("<I", os.getpid()),
           1, HELLO_OK)
    handle = struct.unpack_from("<I", c.call(OPEN, sstr(model.encode()), 2, OPEN_OK))[0]
    rep = json.dumps({"tier": "ram", "handle": handle,
                      "damaged": [{"layer": layer, "expert": expert}]}).encode()
    c.call(REPORT, struct.pack("<I", len(rep)) + rep, 3, OK)
    for fd in c.fds:
        os.close(fd)
    print("reported %s %d:%d damaged" % (model, layer, expert))


main()
