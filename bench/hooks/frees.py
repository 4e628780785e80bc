#!/usr/bin/env python3
"""What replacing a small synced file costs on this disk, and why.

    python3 bench/hooks/frees.py [DIR] [N]

DIR must be on the disk the state root is on (default: $TMPDIR or /tmp).
Times, N times each (default 200), medians and p90 in ms:

  rename over a file       temp (500 B, fsynced) renamed over a synced 500 B file
  rename to a new name     the same temp renamed where nothing is
  rename over, kept        over a file that another link keeps alive
  rename over an empty one over a synced file with no data blocks
  unlink a synced file     500 B, fsynced, then removed
  unlink an unsynced file  500 B, never written back, then removed

A hook pair replaces six state files (counters, session and report at
`session begin`; session, report and metrics at `end`): if "rename over a
file" is far above "rename over, kept", freeing the replaced file's blocks is
what a replacement costs (ext4 mounted with `discard` issues the discard as
the inode is freed). Nothing is asserted; the directory it makes is removed.
"""
import os
import shutil
import sys
import tempfile
import time

base = sys.argv[1] if len(sys.argv) > 1 else os.environ.get("TMPDIR", "/tmp")
n = int(sys.argv[2]) if len(sys.argv) > 2 else 200
d = tempfile.mkdtemp(prefix="frees-", dir=base)


def make(path, size=500, sync=True):
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    os.write(fd, b"x" * size)
    if sync:
        os.fsync(fd)
    os.close(fd)


def timed(prepare, act):
    ts = []
    for i in range(n):
        prepare(i)
        t = time.perf_counter()
        act(i)
        ts.append(time.perf_counter() - t)
    ts.sort()
    return ts[len(ts) // 2] * 1e3, ts[len(ts) * 9 // 10] * 1e3


tmp, dst, keep = (os.path.join(d, x) for x in ("t.tmp", "dst", "dst.kept"))


def over(i, size=500, kept=False):
    make(tmp)
    make(dst, size)
    if kept:
        if os.path.exists(keep):
            os.unlink(keep)
        os.link(dst, keep)


cases = [
    ("rename over a file", over, lambda i: os.rename(tmp, dst)),
    ("rename to a new name", lambda i: make(tmp), lambda i: os.rename(tmp, f"{dst}.{i}")),
    ("rename over, kept", lambda i: over(i, kept=True), lambda i: os.rename(tmp, dst)),
    ("rename over an empty one", lambda i: over(i, size=0), lambda i: os.rename(tmp, dst)),
    ("unlink a synced file", lambda i: make(tmp), lambda i: os.unlink(tmp)),
    ("unlink an unsynced file", lambda i: make(tmp, sync=False), lambda i: os.unlink(tmp)),
]
try:
    print(f"frees: {n} each in {d}, load {open('/proc/loadavg').read().split()[0]}")
    for name, prepare, act in cases:
        p50, p90 = timed(prepare, act)
        print(f"  {name:<26} median {p50:7.3f} ms   p90 {p90:7.3f} ms")
finally:
    shutil.rmtree(d, ignore_errors=True)
