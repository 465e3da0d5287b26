# bounds_client.py — hostile shoald clients for test_bounds_daemon.sh (issue 18).
#
#   bounds_client.py SOCK flood N          N silent connections held 3 s
#   bounds_client.py SOCK partial          a frame begun and never ended
#   bounds_client.py SOCK nohello          a connection that never says HELLO
#   bounds_client.py SOCK hoard MODEL N    N connections GET a cached expert
#                                          8 x 1,024 times and never read
#   bounds_client.py SOCK bodies N PID     N connections declare 1 MiB bodies and
#                                          send 1 MiB - 1; prints shoald's peak RSS
#   bounds_client.py SOCK fair N           N connections say HELLO (the cap), then
#                                          another user's client (setpriv to
#                                          nobody) must still be served
#   bounds_client.py SOCK hello1           one HELLO, expect HELLO_OK
#
# Each scenario checks what the client sees (an ERROR naming the limit, then
# EOF) and prints one summary line; an assertion failure exits non-zero.
import os
import socket
import struct
import sys
import time

MAGIC = b"SHL\x01"
ERROR, OPEN_OK = 65, 67
ETIMEOUT, ETOOBIG, EBUSY = -12, -11, -18


def frame(t, body=b"", rid=0, length=None):
    n = len(body) if length is None else length
    return MAGIC + struct.pack("<IHHIQ", n, t, 0, 0, rid) + body


def sstr(b):
    return struct.pack("<H", len(b)) + b


def hello():
    return frame(1, struct.pack("<H", 1) + sstr(b"bounds") + struct.pack("<I", os.getpid()), rid=1)


def connect(path, timeout=10):
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(timeout)
    s.connect(path)
    return s


def frames(data):
    """(type, id, body) of every whole frame in data."""
    out, pos = [], 0
    while pos + 24 <= len(data):
        n, t, _f, _r, rid = struct.unpack_from("<IHHIQ", data, pos + 4)
        if pos + 24 + n > len(data):
            break
        out.append((t, rid, data[pos + 24:pos + 24 + n]))
        pos += 24 + n
    return out


def read_all(s, secs):
    """Everything until EOF (or secs); (bytes, eof)."""
    got, end = b"", time.time() + secs
    while time.time() < end:
        s.settimeout(max(0.1, end - time.time()))
        try:
            b = s.recv(1 << 16)
        except socket.timeout:
            return got, False
        except (ConnectionResetError, BrokenPipeError):
            return got, True
        if not b:
            return got, True
        got += b
    return got, False


def error_of(data):
    for t, _rid, body in frames(data):
        if t == ERROR:
            code = struct.unpack_from("<i", body, 0)[0]
            n = struct.unpack_from("<H", body, 4)[0]
            return code, body[6:6 + n].decode()
    return None, None


def expect_error(s, code, word, secs):
    data, eof = read_all(s, secs)
    got, msg = error_of(data)
    assert got == code, ("expected ERROR %d" % code, got, msg, data[:80])
    assert word in msg, (word, msg)
    assert eof, "the connection stayed open after the ERROR"
    return msg


def flood(path, n):
    socks = []
    for _ in range(n):
        try:
            socks.append(connect(path))
        except OSError:
            pass
    time.sleep(3)
    for s in socks:
        s.close()
    print("flood: %d of %d connected" % (len(socks), n))


def partial(path):
    s = connect(path)
    s.sendall(hello())
    time.sleep(0.2)
    s.sendall(frame(7, length=1000) + b"{")   # STATS, 1,000 bytes declared, 1 sent
    msg = expect_error(s, ETIMEOUT, "frame-timeout", 20)
    print("partial: " + msg)


def nohello(path):
    s = connect(path)
    msg = expect_error(s, ETIMEOUT, "HELLO", 20)
    print("nohello: " + msg)


def open_model(s, model):
    s.sendall(hello() + frame(2, sstr(model.encode()), rid=2))
    data = b""
    while True:
        b = s.recv(1 << 16)
        assert b, "EOF before OPEN_OK"
        data += b
        for t, rid, body in frames(data):
            if t == OPEN_OK:
                return struct.unpack_from("<I", body, 0)[0]
            assert t != ERROR, ("OPEN failed", body)


def hoard(path, model, n):
    """GET one cached expert 1,024 times per GET, 8 GETs, never read."""
    key = struct.pack("<BHI", 1, 1, 0)
    socks = []
    for _ in range(n):
        s = connect(path, 30)
        h = open_model(s, model)
        body = struct.pack("<IB", h, 0) + struct.pack("<H", 1024) + key * 1024
        for g in range(8):
            s.sendall(frame(3, body, rid=10 + g))
        socks.append(s)
    time.sleep(2)
    dropped = 0
    for s in socks:
        data, eof = read_all(s, 15)
        code, msg = error_of(data)
        if eof and code == ETOOBIG and "descriptors" in msg:
            dropped += 1
    assert dropped > 0, "no hoarding connection was dropped"
    print("hoard: %d of %d connections dropped" % (dropped, n))


def rss_kb(pid):
    for line in open("/proc/%d/status" % pid):
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


def bodies(path, n, pid):
    base = rss_kb(pid)
    peak = base
    chunk = b"x" * ((1 << 20) - 1)
    socks = []
    for i in range(n):
        try:
            s = connect(path)
            s.sendall(frame(1, length=1 << 20) + chunk)
            socks.append(s)
        except OSError:
            pass   # dropped while sending: what the cap is for
        if i % 10 == 0:
            peak = max(peak, rss_kb(pid))
    time.sleep(1)
    peak = max(peak, rss_kb(pid))
    errors = 0
    for s in socks:
        data, _eof = read_all(s, 0.2)
        code, _msg = error_of(data)
        errors += code is not None
        s.close()
    print("bodies: %d connections, %d saw an ERROR, rss %d kB -> peak %d kB"
          % (n, errors, base, peak))
    print("peak_growth_kb %d" % (peak - base))


def hello_ok(s):
    """True: HELLO_OK; False: an ERROR (or closed: refused at the cap)."""
    try:
        s.sendall(hello())
    except (BrokenPipeError, ConnectionResetError):
        pass   # refused before it could say HELLO: its ERROR may still be readable
    data = b""
    while True:
        try:
            b = s.recv(4096)
        except (ConnectionResetError, BrokenPipeError):
            b = b""
        if not b:
            return False, data
        data += b
        for t, _rid, body in frames(data):
            if t == 66:
                return True, data
            if t == ERROR:
                return False, data


def hello1(path):
    s = connect(path)
    ok, data = hello_ok(s)
    assert ok, ("no HELLO_OK for another user's client", error_of(data))
    print("hello1: served")


def fair(path, n):
    import subprocess
    socks = []
    for _ in range(n):
        s = connect(path)
        ok, data = hello_ok(s)
        if not ok:
            code, msg = error_of(data)
            assert code in (EBUSY, None), (code, msg)
            break
        socks.append(s)
    print("fair: %d connections of this user said HELLO" % len(socks))
    r = subprocess.run(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups",
                        sys.executable, __file__, path, "hello1"],
                       capture_output=True, text=True, timeout=30)
    assert r.returncode == 0, ("the other user was not served", r.stdout, r.stderr)
    evicted = 0
    for s in socks:
        data, eof = read_all(s, 0.05)
        code, msg = error_of(data)
        if code == EBUSY and "newcomer" in msg:
            evicted += 1
    assert evicted == 1, ("expected one of this user's connections to make room", evicted)
    print("fair: the other user was served; one of %d connections made room" % len(socks))


def main():
    path, what = sys.argv[1], sys.argv[2]
    if what == "flood":
        flood(path, int(sys.argv[3]))
    elif what == "partial":
        partial(path)
    elif what == "nohello":
        nohello(path)
    elif what == "hoard":
        hoard(path, sys.argv[3], int(sys.argv[4]))
    elif what == "fair":
        fair(path, int(sys.argv[3]))
    elif what == "hello1":
        hello1(path)
    elif what == "bodies":
        bodies(path, int(sys.argv[3]), int(sys.argv[4]))
    else:
        sys.exit("unknown scenario " + what)


main()
