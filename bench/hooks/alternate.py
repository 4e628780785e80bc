#!/usr/bin/env python3
"""Two (or more) agent-state binaries' hook pairs, alternated pair by pair.

    python3 bench/hooks/alternate.py PAIRS NAME=BINARY NAME=BINARY...

A before/after comparison on a busy machine: each binary gets its own fresh
state root (one agent, rio), and the pairs alternate (the order flipping
each round), so load that comes and goes falls on both alike. Per binary,
medians of:

* pair: `session begin rio` then `session end rio --session ID ...`, as a
  script calls them (the begin's stdout captured);
* nosync: the same with fsync and fdatasync made no-ops (LD_PRELOAD of a
  shim built here with gcc): pair - nosync is what the syncs cost;
* two starts: `agent-state --version` twice;
* floor: two starts + the syncs (issue 21's floor of a pair), and
  pair / floor.

GAP (seconds, default 0) pauses, untimed, after the begin and after the
end: a script's session runs minutes between the two, so work a hook leaves
to the disk or to a child (the frees of replaced files, see
crates/store/src/state/replaced.rs) is done before the next hook; without
a gap it lands on the next pair. BENCH_TMPDIR (default /var/tmp): where the
roots go; a real disk, since fsync on tmpfs costs nothing.
"""

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time


def shim(directory):
    """A shared object whose fsync/fdatasync do nothing; None without gcc."""
    src = os.path.join(directory, "nosync.c")
    out = os.path.join(directory, "nosync.so")
    with open(src, "w") as f:
        f.write(
            "int fsync(int fd){(void)fd;return 0;}\n"
            "int fdatasync(int fd){(void)fd;return 0;}\n"
        )
    r = subprocess.run(["gcc", "-shared", "-fPIC", "-O2", "-o", out, src], capture_output=True)
    return out if r.returncode == 0 else None


def main():
    if len(sys.argv) < 3 or not sys.argv[1].isdigit():
        sys.exit(__doc__)
    pairs = int(sys.argv[1])
    binaries = dict(a.split("=", 1) for a in sys.argv[2:])
    gap = float(os.environ.get("GAP", "0"))
    base = tempfile.mkdtemp(prefix="hooks-alternate.", dir=os.environ.get("BENCH_TMPDIR", "/var/tmp"))
    configs = {}
    for name, binary in binaries.items():
        d = os.path.join(base, name)
        os.makedirs(d)
        config = os.path.join(d, "config.toml")
        with open(config, "w") as f:
            f.write(f'state_root = "{d}/root"\n[[agent]]\nname = "rio"\n')
        subprocess.run([binary, "--config", config, "bootstrap"], check=True, stdout=subprocess.DEVNULL, timeout=60)
        configs[name] = config
    nosync = shim(base)
    if nosync is None:
        print("note: no gcc: the syncs and the floor are not measured", file=sys.stderr)

    def pair(binary, config, env=None):
        t0 = time.perf_counter()
        begin = subprocess.run(
            [binary, "--config", config, "session", "begin", "rio"],
            check=True, capture_output=True, env=env, timeout=60,
        )
        session = begin.stdout.decode().split()[-1]
        took = time.perf_counter() - t0
        if gap:
            time.sleep(gap)
        t1 = time.perf_counter()
        subprocess.run(
            [binary, "--config", config, "session", "end", "rio", "--session", session,
             "--sources-archived", "8", "--summary", "a summary", "--handoff-notes", "notes"],
            check=True, stdout=subprocess.DEVNULL, env=env, timeout=60,
        )
        took += time.perf_counter() - t1
        if gap:
            time.sleep(gap)
        return took * 1000

    def starts(binary):
        t0 = time.perf_counter()
        for _ in range(2):
            subprocess.run([binary, "--version"], check=True, stdout=subprocess.DEVNULL, timeout=60)
        return (time.perf_counter() - t0) * 1000

    shimmed = dict(os.environ, LD_PRELOAD=nosync) if nosync else None
    got = {n: {"pair": [], "nosync": [], "starts": []} for n in binaries}
    for _ in range(min(10, pairs)):  # warm-up, not timed
        for n, b in binaries.items():
            pair(b, configs[n])
    for i in range(pairs):
        order = list(binaries.items())
        if i % 2:
            order.reverse()
        for n, b in order:
            got[n]["pair"].append(pair(b, configs[n]))
            if shimmed:
                got[n]["nosync"].append(pair(b, configs[n], shimmed))
            got[n]["starts"].append(starts(b))
    # Every pair was recorded: as many sessions as pairs were run.
    expected = min(10, pairs) + pairs * (2 if shimmed else 1)
    for n, config in configs.items():
        with open(os.path.join(os.path.dirname(config), "root", "rio", "metrics.json")) as f:
            total = json.load(f)["lifetime"]["sessions_total"]
        if total != expected:
            sys.exit(f"{n}: metrics.json counts {total} sessions, {expected} pairs ran")
    for n in binaries:
        m = {k: statistics.median(v) for k, v in got[n].items() if v}
        line = f"{n}: pair {m['pair']:.2f} ms, two starts {m['starts']:.2f}"
        if "nosync" in m:
            syncs = m["pair"] - m["nosync"]
            floor = m["starts"] + syncs
            line += f", nosync {m['nosync']:.2f}, syncs {syncs:.2f}, floor {floor:.2f}, pair/floor {m['pair'] / floor:.2f}"
        print(line)
    subprocess.run(["rm", "-rf", base], check=False)


if __name__ == "__main__":
    main()
