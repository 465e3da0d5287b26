#!/usr/bin/env python3
"""server_hostile.py — hostile HTTP clients for tests/integration/test_server_limits.sh.

Every mode talks only to 127.0.0.1, is bounded in count and time, and prints
one line of KEY VALUE pairs for the shell to check:

  header PORT BYTES          one request whose single header line is BYTES long:
                             status (the reply's status or 'closed'), secs, sent
  slowloris PORT N SECS      N connections that drip a header line every 0.5 s for
                             at most SECS; meanwhile a GET /health every 0.5 s:
                             closed (how many the server closed), last_close (secs),
                             health_max (slowest /health, secs), health_fail
  flood PORT N HOLD          N connections that send nothing, held HOLD s, then a
                             GET /health: health (its status), secs
"""
import socket
import sys
import time

HOST = "127.0.0.1"


def health(port, timeout=10.0):
    """(status, seconds) of one GET /health on a fresh connection."""
    t0 = time.time()
    try:
        s = socket.create_connection((HOST, port), timeout=timeout)
        s.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        line = s.recv(64).split(b"\r\n")[0].decode("latin-1")
        s.close()
        parts = line.split()
        return (parts[1] if len(parts) > 1 else "closed"), time.time() - t0
    except OSError:
        return "error", time.time() - t0


def mode_header(port, size):
    s = socket.create_connection((HOST, port), timeout=20)
    t0 = time.time()
    sent = 0
    try:
        s.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\nX-Big: ")
        chunk = b"a" * 65536
        while sent < size:
            s.sendall(chunk[: min(len(chunk), size - sent)])
            sent += min(len(chunk), size - sent)
        s.sendall(b"\r\n\r\n")
    except OSError:
        pass                      # the server stopped reading: that is the point
    status = "closed"
    try:
        data = s.recv(64)
        if data.startswith(b"HTTP/1."):
            status = data.split()[1].decode()
    except OSError:
        pass
    print("status %s secs %.2f sent %d" % (status, time.time() - t0, sent))


def mode_slowloris(port, n, secs):
    conns = []
    for _ in range(n):
        s = socket.create_connection((HOST, port), timeout=5)
        s.setblocking(False)
        s.send(b"GET /health HTTP/1.1\r\nHost: x\r\n")
        conns.append(s)
    t0 = time.time()
    open_ = set(range(n))
    closed, last_close, hmax, hfail = 0, 0.0, 0.0, 0
    while open_ and time.time() - t0 < secs:
        for i in list(open_):
            try:
                conns[i].send(b"X-Drip: 1\r\n")
                conns[i].recv(1, socket.MSG_PEEK)
            except BlockingIOError:
                continue          # still open, nothing to read: the server waits
            except OSError:
                pass
            # readable (a 408, or EOF) or reset: the server gave up on it
            open_.discard(i)
            closed += 1
            last_close = time.time() - t0
        st, dt = health(port)
        hmax = max(hmax, dt)
        hfail += st != "200"
        time.sleep(0.5)
    for s in conns:
        s.close()
    print("closed %d last_close %.2f health_max %.2f health_fail %d" % (closed, last_close, hmax, hfail))


def mode_flood(port, n, hold):
    socks = []
    for _ in range(n):
        s = socket.socket()
        s.setblocking(False)
        try:
            s.connect((HOST, port))
        except BlockingIOError:
            pass
        socks.append(s)
    time.sleep(hold)
    st, dt = health(port, timeout=20)
    for s in socks:
        s.close()
    print("health %s secs %.2f" % (st, dt))


def main():
    mode, port = sys.argv[1], int(sys.argv[2])
    if mode == "header":
        mode_header(port, int(sys.argv[3]))
    elif mode == "slowloris":
        mode_slowloris(port, int(sys.argv[3]), float(sys.argv[4]))
    elif mode == "flood":
        mode_flood(port, int(sys.argv[3]), float(sys.argv[4]))
    else:
        sys.exit("unknown mode " + mode)


if __name__ == "__main__":
    main()
