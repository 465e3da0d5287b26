#!/usr/bin/python3
"""hubmock_ranges.py — ranges of a hubmock repo against the files on disk.

    hubmock_ranges.py HUB REPO DIR [--headers-only] [--seed N]

For every file of DIR: resolve it on the hub port (302 to the CDN for LFS
files, 200 for small ones) and compare, with the disk file, ranged GETs
chosen to hit edges: the whole file, its first 8 bytes, the header and the
first data bytes, random ranges, both sides of tensor boundaries, the last
bytes, suffix (-N) and open-ended (N-) ranges.  --headers-only compares
only the bytes before a shard's data (DIR written by mkmodel --headers-only).
Prints one line per file; exits 1 on the first difference.
"""
import http.client
import json
import os
import random
import struct
import sys
import urllib.parse


def conn_for(url, pool):
    u = urllib.parse.urlsplit(url)
    c = pool.get(u.netloc)
    if c is None:
        c = pool[u.netloc] = http.client.HTTPConnection(u.netloc, timeout=60)
    return c, u.path + ("?" + u.query if u.query else "")


def get(url, pool, rng=None):
    c, path = conn_for(url, pool)
    c.request("GET", path, headers={"Range": rng} if rng else {})
    r = c.getresponse()
    body = r.read()
    return r.status, dict((k.lower(), v) for k, v in r.getheaders()), body


def resolve(hub, repo, name, pool):
    c, path = conn_for("%s/%s/resolve/main/%s" % (hub, repo, urllib.parse.quote(name)), pool)
    c.request("HEAD", path)
    r = c.getresponse()
    r.read()
    h = dict((k.lower(), v) for k, v in r.getheaders())
    if r.status == 302:
        return h["location"], h
    assert r.status == 200, (name, r.status)
    return "%s/%s/resolve/main/%s" % (hub, repo, urllib.parse.quote(name)), h


def edges(path, size):
    """Offsets worth testing: tensor starts of a shard."""
    if not path.endswith(".safetensors"):
        return 0, []
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        hdr = json.loads(f.read(n))
    hdr.pop("__metadata__", None)
    return 8 + n, sorted(8 + n + v["data_offsets"][0] for v in hdr.values())


def main():
    args = sys.argv[1:]
    headers_only = "--headers-only" in args
    seed = 1
    if "--seed" in args:
        seed = int(args[args.index("--seed") + 1])
        del args[args.index("--seed"):args.index("--seed") + 2]
    args = [a for a in args if a != "--headers-only"]
    hub, repo, d = args
    R = random.Random(seed)
    pool = {}
    for name in sorted(os.listdir(d)):
        path = os.path.join(d, name)
        size = os.path.getsize(path)
        url, h = resolve(hub, repo, name, pool)
        want_size = int(h.get("x-linked-size", h.get("content-length")))
        assert want_size == size, (name, want_size, size)
        data_off, starts = edges(path, size)
        whole = not (headers_only and data_off)     # small files are always whole
        limit = size if whole else data_off
        ranges = [(0, min(size, 8)), (0, min(limit, data_off + 4096 if data_off else limit))]
        if whole:
            ranges += [(size - 1, size), (max(0, size - 1000), size)]
            for _ in range(30):
                a = R.randrange(size)
                ranges.append((a, min(size, a + R.randrange(1, 300000))))
            for s in R.sample(starts, min(len(starts), 40)):
                ranges.append((max(0, s - 5), min(size, s + 5)))
            if size < (4 << 20):
                ranges.append((0, size))
        with open(path, "rb") as f:
            for a, b in ranges:
                if b <= a:
                    continue
                st, rh, body = get(url, pool, "bytes=%d-%d" % (a, b - 1))
                f.seek(a)
                want = f.read(b - a)
                if st != 206 or body != want:
                    print("FAIL: %s/%s bytes %d-%d: status %d, %s" % (
                        repo, name, a, b - 1, st,
                        "same bytes" if body == want else "different bytes"))
                    return 1
            if whole and size > 200:
                for rng, a in (("bytes=-123", size - 123), ("bytes=%d-" % (size - 77), size - 77)):
                    st, rh, body = get(url, pool, rng)
                    f.seek(a)
                    if st != 206 or body != f.read():
                        print("FAIL: %s/%s %s" % (repo, name, rng))
                        return 1
        print("%s/%s: %d ranges equal" % (repo, name, len(ranges)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
