"""shoalproto.py — shoald's framing (docs/protocol.md) for the tests' Python
clients (hfcache_report.py, put_client.py): frames, strings, ERROR bodies
and a connection that answers one request at a time, keeping the
descriptors shoald hands over in Conn.fds."""
import array
import socket
import struct

MAGIC = b"SHL\x01"
HELLO, OPEN, REPORT, PUT_BEGIN, PUT_COMMIT = 1, 2, 8, 14, 15
OK, ERROR, HELLO_OK, OPEN_OK, PROGRESS, PUT_READY = 64, 65, 66, 67, 72, 73


def frame(t, body=b"", rid=0):
    return MAGIC + struct.pack("<IHHIQ", len(body), t, 0, 0, rid) + body


def sstr(b):
    return struct.pack("<H", len(b)) + b


def error(body):
    """(code, message) of an ERROR body."""
    code = struct.unpack_from("<i", body, 0)[0]
    n = struct.unpack_from("<H", body, 4)[0]
    return code, body[6:6 + n].decode(errors="replace")


class Conn:
    def __init__(self, path, timeout=60):
        self.s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.s.settimeout(timeout)
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
            data, anc, _fl, _a = self.s.recvmsg(1 << 16, socket.CMSG_SPACE(64 * fds.itemsize))
            for level, kind, d in anc:
                if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                    fds.frombytes(d[:len(d) - (len(d) % fds.itemsize)])
            self.fds.extend(fds)
            if not data:
                raise SystemExit("shoald closed the connection")
            self.buf += data

    def call(self, t, body, rid, want):
        """Send, and the answer's body; an ERROR (or another type) exits."""
        self.send(t, body, rid)
        got, body = self.reply(rid)
        if got == ERROR:
            raise SystemExit("ERROR %d: %s" % error(body))
        assert got == want, (got, want)
        return body
