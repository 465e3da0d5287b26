#!/usr/bin/env python3
"""hfcache_layout.py MODEL_DIR CACHE_DIR REPO COMMIT [--ref main] [--poison FILE]

Lays out MODEL_DIR as huggingface_hub's cache does (docs/fetcher.md, "The
Hugging Face cache"): CACHE_DIR/models--org--name/blobs/<etag> holding the
bytes, snapshots/<commit>/<file> a relative symlink to its blob,
refs/<ref> holding the commit.  The etag is the sha256 for *.safetensors
(LFS files, as hubmock and the Hub name them: *.safetensors, tiktoken.model, 10 MiB and up) and the git blob sha1 for the rest.
--poison FILE: that file's blob is named by its real etag but holds other
bytes (every byte after the safetensors header plus one), as a hostile or
damaged snapshot would.  Prints "<file> <etag>" per file."""
import hashlib, os, struct, sys

def main():
    a = sys.argv[1:]
    ref, poison = "main", None
    if "--ref" in a:
        i = a.index("--ref"); ref = a[i + 1]; del a[i:i + 2]
    if "--poison" in a:
        i = a.index("--poison"); poison = a[i + 1]; del a[i:i + 2]
    src, dst, repo, commit = a
    top = os.path.join(dst, "models--" + repo.replace("/", "--"))
    for d in ("blobs", "snapshots/" + commit, "refs"):
        os.makedirs(os.path.join(top, d), exist_ok=True)
    with open(os.path.join(top, "refs", ref), "w") as f:
        f.write(commit)
    for name in sorted(os.listdir(src)):
        data = open(os.path.join(src, name), "rb").read()
        if name.endswith(".safetensors") or name == "tiktoken.model" or len(data) >= 10 << 20:
            etag = hashlib.sha256(data).hexdigest()
        else:
            etag = hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()
        if name == poison:
            n = struct.unpack("<Q", data[:8])[0] + 8
            data = data[:n] + bytes((b + 1) & 255 for b in data[n:])
        with open(os.path.join(top, "blobs", etag), "wb") as f:
            f.write(data)
        link = os.path.join(top, "snapshots", commit, name)
        if os.path.lexists(link):
            os.unlink(link)
        os.symlink(os.path.join("..", "..", "blobs", etag), link)
        print(name, etag)

main()
