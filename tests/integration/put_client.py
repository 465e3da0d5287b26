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
import array
import ctypes
import os
import random
import socket
import struct
import sys

MAGIC = b"SHL\x01"
OK, ERROR, OPEN_OK, PROGRESS, PUT_READY = 64, 65, 67, 72, 73


def frame(t, body=b"", rid=0):
    return MAGIC + struct.pack("<IHHIQ", len(body), t, 0, 0, rid) + body


def sstr(b):
    return struct.pack("<H", len(b)) + b


class Conn:
    def __init__(self, path):
        self.s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.s.settimeout(60)
        self.s.connect(path)
        self.buf = b""
        self.fds = []

    def send(self, t, body, rid):
        self.s.sendall(frame(t, body, rid))

    def reply(self, rid):
        """The next frame for request rid that is not PROGRESS: (type, body)."""
        while True:
            while len(self.buf) >= 24:
                n, t, _f, _r, got = struct.unpack_from("<IHHIQ", self.buf, 4)
                if len(self.buf) < 24 + n:
                    break
                body, self.buf = self.buf[24:24 + n], self.buf[24 + n:]
                if got == rid and t != PROGRESS:
                    return t, body
            fds = array.array("i")
            data, anc, _fl, _a = self.s.recvmsg(1 << 16, socket.CMSG_LEN(16 * fds.itemsize))
            for level, kind, d in anc:
                if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                    fds.frombytes(d[:len(d) - (len(d) % fds.itemsize)])
            self.fds.extend(fds)
            if not data:
                raise SystemExit("EOF from shoald")
            self.buf += data


def error(body):
    code = struct.unpack_from("<i", body, 0)[0]
    n = struct.unpack_from("<H", body, 4)[0]
    return code, body[6:6 + n].decode(errors="replace")


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
