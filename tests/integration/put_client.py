# put_client.py — a PUT_BEGIN held open, for test_put_budget.sh (issue 18):
# the engine's way of storing its spine pack, paused between the writes and
# the commit so a test can warm beside it.
#
#   put_client.py SOCK MODEL NAME LENGTH
#
# Says HELLO, OPENs MODEL, sends PUT_BEGIN NAME LENGTH and prints one line:
#   "refused CODE MESSAGE"        the daemon answered ERROR (then exits 0), or
#   "ready ID LENGTH"             PUT_READY came with a descriptor; LENGTH
#                                 pseudo-random bytes were written into it.
# After "ready" it reads commands from stdin, one a line:
#   "commit"  PUT_COMMIT with the bytes' XXH3-128 (libxxhash through ctypes):
#             prints "committed" or "commit failed CODE MESSAGE"
#   "abort"   PUT_COMMIT keep=0: prints "aborted"
#   EOF       leaves without a word (the daemon drops the PUT)
import ctypes
import os
import random
import struct
import sys

from shoalproto import ERROR, OK, PUT_READY, Conn, error, sstr


def xxh128(data):
    lib = ctypes.CDLL("libxxhash.so.0")

    class H(ctypes.Structure):
        _fields_ = [("low64", ctypes.c_uint64), ("high64", ctypes.c_uint64)]
    lib.XXH3_128bits.restype = H
    lib.XXH3_128bits.argtypes = [ctypes.c_char_p, ctypes.c_size_t]
    h = lib.XXH3_128bits(data, len(data))
    return struct.pack(">QQ", h.high64, h.low64)   # canonical: big-endian


def main():
    path, model, name, length = sys.argv[1], sys.argv[2], sys.argv[3].encode(), int(sys.argv[4])
    c = Conn(path)
    c.send(1, struct.pack("<H", 2) + sstr(b"put_client") + struct.pack("<I", os.getpid()), 0)
    t, body = c.reply(0)
    assert t == 66, ("HELLO", t, body)
    c.send(2, sstr(model.encode()), 2)
    t, body = c.reply(2)
    if t == ERROR:
        raise SystemExit("OPEN: %d %s" % error(body))
    handle = struct.unpack_from("<I", body, 0)[0]
    c.send(14, struct.pack("<I", handle) + sstr(name) + struct.pack("<Q", length), 3)
    t, body = c.reply(3)
    if t == ERROR:
        print("refused %d %s" % error(body), flush=True)
        return
    assert t == PUT_READY and c.fds, ("PUT_BEGIN", t, body)
    pid, plen = struct.unpack_from("<QQ", body, 0)
    fd = c.fds.pop()
    data = random.Random(7).randbytes(length)
    os.pwrite(fd, data, 0)
    os.close(fd)
    print("ready %d %d" % (pid, plen), flush=True)
    for line in sys.stdin:
        cmd = line.strip()
        if cmd == "commit":
            c.send(15, struct.pack("<QB", pid, 1) + xxh128(data), 4)
            t, body = c.reply(4)
            print("committed" if t == OK else "commit failed %d %s" % error(body), flush=True)
            return
        if cmd == "abort":
            c.send(15, struct.pack("<QB", pid, 0) + bytes(16), 4)
            t, body = c.reply(4)
            assert t == OK, ("abort", t, body)
            print("aborted", flush=True)
            return


if __name__ == "__main__":
    main()
