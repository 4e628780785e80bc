#!/usr/bin/env python3
"""Driver for the daemon benchmarks (see README.md). Python 3 standard library only.

    bench.py latency  --out R.json [--wakes 1000] [--agents 100] [--gap 0.02] [--preload LIB]
    bench.py web      --out R.json [--wakes 1000] [--clients 20]   (SSE clients vs none, paired)
    bench.py wakecli  --out R.json [--wakes 200] [--agents 100]
    bench.py burst    --out R.json [--agents 100] [--per-agent 1000] [--max-concurrent 4]
    bench.py startup  --out R.json --agents N [--wakes-after 0]
    bench.py idle     --out R.json [--agents 100] [--seconds 60] [--strace 1]
    bench.py summary  R.json...
    bench.py table    R.json... [hooks.json]   (the issue's table; see bench/table.sh)

Common options: --bin (agent-state), --fake-agent (fake_agent), --work (a directory
on a real disk; each benchmark makes its own subdirectory), --pids (a file the
pids of started daemons are appended to, so run.sh's trap can stop them).

Every daemon is started with NOTIFY_SOCKET pointing at a datagram socket this
driver listens on, so READY=1 marks the end of its start-up; JOURNAL_STREAM and
WATCHDOG_* are removed (logs go to stderr, no watchdog).
"""

import argparse
import ctypes
import json
import os
import re
import resource
import select
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import threading
import time

CLK_TCK = os.sysconf("SC_CLK_TCK")
PAGE = os.sysconf("SC_PAGE_SIZE")
MSG = b'{"from":"bench","subject":"s","priority":"high"}\n'


# ---- small helpers -----------------------------------------------------------


class BenchFailed(Exception):
    """The benchmark cannot complete: said in one line, and the driver exits 1."""


def log(*a):
    print(*a, file=sys.stderr, flush=True)


def wait_or_kill(proc, timeout, what):
    """Wait for a helper process (strace, perf) we asked to stop; SIGKILL it after `timeout` s."""
    try:
        return proc.wait(timeout)
    except subprocess.TimeoutExpired:
        log(f"  {what} (pid {proc.pid}) did not stop within {timeout} s; SIGKILL")
        proc.kill()
        return proc.wait(10)


def tail(path, n=15):
    try:
        with open(path, errors="replace") as f:
            return f.readlines()[-n:]
    except OSError:
        return []


def pct(values, p):
    """Nearest-rank percentile (p in 0..100) of a non-empty list."""
    v = sorted(values)
    k = max(0, min(len(v) - 1, int(round(p / 100.0 * len(v) + 0.5)) - 1))
    return v[k]


def dist(values_ns):
    """Summary of a list of durations in ns, in ms."""
    if not values_ns:
        return None
    ms = [x / 1e6 for x in values_ns]
    return {
        "n": len(ms),
        "min": round(min(ms), 3),
        "p50": round(pct(ms, 50), 3),
        "p90": round(pct(ms, 90), 3),
        "p99": round(pct(ms, 99), 3),
        "max": round(max(ms), 3),
        "mean": round(statistics.fmean(ms), 3),
    }


def agent_names(n):
    return [f"a{i:05d}" for i in range(1, n + 1)]


class Inotify:
    """inotify through ctypes: lets the driver block instead of polling."""

    IN_MODIFY = 0x2
    IN_CLOSE_WRITE = 0x8
    IN_MOVED_TO = 0x80
    IN_CREATE = 0x100

    def __init__(self):
        self.libc = ctypes.CDLL(None, use_errno=True)
        self.fd = self.libc.inotify_init1(os.O_NONBLOCK | os.O_CLOEXEC)
        if self.fd < 0:
            raise OSError(ctypes.get_errno(), "inotify_init1")

    def add(self, path, mask):
        wd = self.libc.inotify_add_watch(self.fd, os.fsencode(path), mask)
        if wd < 0:
            raise OSError(ctypes.get_errno(), f"inotify_add_watch {path}")

    def wait(self, timeout):
        r, _, _ = select.select([self.fd], [], [], max(0.0, timeout))
        if r:
            try:
                while os.read(self.fd, 65536):
                    pass
            except BlockingIOError:
                pass
        return bool(r)

    def until(self, pred, timeout, poll=0.05):
        """Wait until pred() is true (checked at each event, and every `poll` s)."""
        end = time.monotonic() + timeout
        while True:
            v = pred()
            if v:
                return v
            left = end - time.monotonic()
            if left <= 0:
                return None
            self.wait(min(left, poll))

    def close(self):
        os.close(self.fd)


# ---- /proc ---------------------------------------------------------------------


def proc_cpu(pid):
    """(utime + stime) of the whole process (all threads), in seconds."""
    with open(f"/proc/{pid}/stat") as f:
        s = f.read()
    fields = s[s.rindex(")") + 2 :].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def proc_status(pid):
    out = {}
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            k, _, v = line.partition(":")
            out[k] = v.strip()
    return out


def proc_mem_kib(pid):
    s = proc_status(pid)
    return {
        "VmRSS_kib": int(s["VmRSS"].split()[0]),
        "VmHWM_kib": int(s["VmHWM"].split()[0]),
        "threads": int(s["Threads"]),
    }


def proc_threads(pid):
    """Per thread: name, utime+stime ticks, voluntary and involuntary context switches."""
    out = {}
    base = f"/proc/{pid}/task"
    for tid in os.listdir(base):
        try:
            with open(f"{base}/{tid}/stat") as f:
                s = f.read()
            comm = s[s.index("(") + 1 : s.rindex(")")]
            fields = s[s.rindex(")") + 2 :].split()
            st = {}
            with open(f"{base}/{tid}/status") as f:
                for line in f:
                    k, _, v = line.partition(":")
                    st[k] = v.strip()
            out[tid] = {
                "comm": comm,
                "ticks": int(fields[11]) + int(fields[12]),
                "vol": int(st["voluntary_ctxt_switches"]),
                "invol": int(st["nonvoluntary_ctxt_switches"]),
            }
        except (FileNotFoundError, ProcessLookupError, ValueError):
            pass
    return out


def cpu_times():
    with open("/proc/stat") as f:
        v = [int(x) for x in f.readline().split()[1:]]
    idle = v[3] + v[4]  # idle + iowait
    return sum(v), idle


def busy_since(t0):
    total, idle = cpu_times()
    dt = total - t0[0]
    return round(1 - (idle - t0[1]) / dt, 3) if dt > 0 else 0.0


def wait_quiet(max_wait, threshold=0.2, need=3):
    """Wait (up to max_wait s) until the machine has been nearly idle for `need`
    one-second windows: other work on a 2-core box moves every figure here.
    Returns (seconds waited, busy fraction of the last window)."""
    start = time.monotonic()
    quiet = 0
    busy = 0.0
    while True:
        t0 = cpu_times()
        time.sleep(1.0)
        busy = busy_since(t0)
        quiet = quiet + 1 if busy < threshold else 0
        if quiet >= need or time.monotonic() - start >= max_wait:
            return round(time.monotonic() - start, 1), busy


# ---- roots, configs, daemons ---------------------------------------------------


class Bench:
    def __init__(self, args, name):
        self.args = args
        self.bin = os.path.abspath(args.bin)
        self.fake = os.path.abspath(args.fake_agent)
        self.dir = os.path.join(os.path.abspath(args.work), name)
        if os.path.exists(self.dir):
            shutil.rmtree(self.dir)
        os.makedirs(self.dir)
        self.root = os.path.join(self.dir, "root")
        self.config = os.path.join(self.dir, "config.toml")
        self.stamps = os.path.join(self.dir, "stamps.txt")
        self.proc = None
        self.sock = None
        self.logf = None

    def write_config(self, names, max_concurrent=4, timeout="60s"):
        lines = [
            f'state_root = "{self.root}"',
            "",
            "[daemon]",
            f"max_concurrent_sessions = {max_concurrent}",
            'shutdown_grace = "30s"',
            "",
            "[defaults]",
            f'command = ["{self.fake}", "{self.stamps}", "{{agent}}", "{{session_id}}"]',
            f'timeout = "{timeout}"',
            'kill_grace = "5s"',
            'wake_on_inbox = "any"',
            'inbox_debounce = "0s"',
            "",
        ]
        for n in names:
            lines += ["[[agent]]", f'name = "{n}"', ""]
        with open(self.config, "w") as f:
            f.write("\n".join(lines))

    def inbox(self, agent):
        return os.path.join(self.root, agent, "inbox")

    def start(self, log_name="daemon.log", env_extra=None, wrap=None):
        """Start the daemon; returns once READY=1 arrives. Timings in the result dict."""
        sock_path = os.path.join(self.dir, "notify.sock")
        if os.path.exists(sock_path):
            os.unlink(sock_path)
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind(sock_path)
        env = dict(os.environ)
        for k in ("JOURNAL_STREAM", "WATCHDOG_USEC", "WATCHDOG_PID", "LISTEN_FDS", "LISTEN_PID"):
            env.pop(k, None)
        env["NOTIFY_SOCKET"] = sock_path
        env.setdefault("AGENT_STATE_LOG", "info")
        env.update(env_extra or {})
        self.logf = open(os.path.join(self.dir, log_name), "ab")
        argv = [self.bin, "--config", self.config, "daemon"]
        if wrap:
            argv = wrap + argv
        t0_rt = time.time_ns()
        t0 = time.monotonic_ns()
        self.proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=self.logf, stderr=self.logf, env=env)
        if self.args.pids:
            with open(self.args.pids, "a") as f:
                f.write(f"{self.proc.pid}\n")
        # The notify socket is read for the daemon's whole life, by a thread:
        # the daemon sends STATUS= at every change on a blocking datagram
        # socket, and a unix datagram queue holds only
        # net.unix.max_dgram_qlen (10) messages, so a listener that stops
        # reading after READY=1 blocks the daemon's main loop in sendmsg().
        self.notify_count = 0
        self.notify_log = []
        self.ready_ns = None
        ready_evt = threading.Event()
        sock = self.sock

        def reader():
            sock.settimeout(0.5)
            while self.sock is sock:
                try:
                    data = sock.recv(65536)
                except socket.timeout:
                    continue
                except OSError:
                    return
                self.notify_count += 1
                if len(self.notify_log) < 10000:
                    self.notify_log.append((time.monotonic_ns(), data))
                if self.ready_ns is None and b"READY=1" in data.split(b"\n"):
                    self.ready_ns = time.monotonic_ns()
                    ready_evt.set()

        self.reader = threading.Thread(target=reader, daemon=True)
        self.reader.start()
        deadline = time.monotonic() + self.args.start_timeout
        while not ready_evt.wait(0.5):
            if self.proc.poll() is not None:
                raise BenchFailed(f"the daemon exited with {self.proc.returncode} before READY=1")
            if time.monotonic() > deadline:
                raise BenchFailed(f"no READY=1 within --start-timeout ({self.args.start_timeout:g} s)")
        ready = self.ready_ns
        hb = os.path.join(self.root, ".daemon", "daemon.json")
        hb_ns = os.stat(hb).st_mtime_ns - t0_rt if os.path.exists(hb) else None
        return {"ready_ms": (ready - t0) / 1e6, "heartbeat_mtime_ms": hb_ns / 1e6 if hb_ns is not None else None}

    @property
    def pid(self):
        return self.proc.pid

    def heartbeat(self):
        try:
            with open(os.path.join(self.root, ".daemon", "daemon.json")) as f:
                return json.load(f)
        except (FileNotFoundError, ValueError):
            return None

    def stop(self, timeout=120):
        if self.proc is None:
            return None
        rc = None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                rc = self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                log(f"daemon {self.proc.pid} did not stop within {timeout}s; SIGKILL")
                self.proc.kill()
                rc = self.proc.wait(30)
        else:
            rc = self.proc.returncode
        self.proc = None
        if self.sock:
            sock, self.sock = self.sock, None
            self.reader.join(2)
            sock.close()
        if self.logf:
            self.logf.close()
        return rc

    def write_tmp(self, agent, name, fsync):
        tmp_dir = os.path.join(self.inbox(agent), ".tmp")
        path = os.path.join(tmp_dir, name)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o660)
        os.write(fd, MSG)
        if fsync:
            os.fsync(fd)
        os.close(fd)
        return path


def read_stamps(path, offset):
    """New complete lines of the fake agent's stamp file from `offset`."""
    try:
        with open(path, "rb") as f:
            f.seek(offset)
            data = f.read()
    except FileNotFoundError:
        return [], offset
    end = data.rfind(b"\n") + 1
    out = []
    for line in data[:end].decode().splitlines():
        agent, sid, rt, mono, pid = line.split()
        out.append({"agent": agent, "sid": sid, "rt": int(rt), "mono": int(mono), "pid": int(pid)})
    return out, offset + end


LOG_TS = re.compile(r"^(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)(\.\d+)?Z\s+(\w+)\s+(.*)$")


def parse_log_ts(line):
    m = LOG_TS.match(line)
    if not m:
        return None
    import calendar

    secs = calendar.timegm(time.strptime(m.group(1), "%Y-%m-%dT%H:%M:%S"))
    frac = m.group(2) or ".0"
    ns = secs * 1_000_000_000 + int(round(float("0" + frac) * 1e9))
    return ns, m.group(3), m.group(4)


def log_events(path):
    """'session X started' and 'session process started' lines with their times (realtime ns)."""
    started = {}
    spawned = {}
    counts = {"WARN": 0, "ERROR": 0}
    with open(path, errors="replace") as f:
        for line in f:
            p = parse_log_ts(line)
            if not p:
                continue
            ns, level, rest = p
            if level in counts:
                counts[level] += 1
            m = re.match(r"session (\S+) started \(.*agent=(\S+)", rest)
            if m:
                started[(m.group(2), m.group(1))] = ns
                continue
            m = re.match(r"session process started pid=(\d+)", rest)
            if m:
                spawned[int(m.group(1))] = ns
    return started, spawned, counts


# ---- 1. wake latency -------------------------------------------------------------


FLOOD_AGENT = "flooded"


def make_flood(inbox, n, out):
    """What a hostile member of the inbox group can do: `n` empty wake
    requests and `n` junk files in one inbox, as fast as it can."""
    t0 = time.monotonic()
    out["made_from_ns"] = time.monotonic_ns()
    for i in range(n):
        for name in (f".wake-flood-{i:07d}", f"junk-{i:07d}.txt"):
            os.close(os.open(os.path.join(inbox, name), os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o640))
    out["made_to_ns"] = time.monotonic_ns()
    out["made_s"] = round(time.monotonic() - t0, 2)


def flood_drained_rt(log_path):
    """When the daemon last said the flooded agent's wake requests were all
    served and removed (realtime ns of the log line), or None."""
    last = None
    with open(log_path, errors="replace") as f:
        for line in f:
            if "are served and removed" in line and FLOOD_AGENT in line:
                p = parse_log_ts(line)
                if p:
                    last = p[0]
    return last


def cmd_latency(args):
    b = Bench(args, args.name or "latency")
    names = agent_names(args.agents)
    # --flood: one more agent, not woken by the benchmark, whose inbox is
    # flooded: --flood-when during: while the others' wakes are measured;
    # before: before the daemon starts (the steady state: the inbox holds
    # every file when the measurement starts).
    b.write_config(names + ([FLOOD_AGENT] if args.flood else []), max_concurrent=4)
    env = {"AGENT_STATE_LOG": "debug"}
    if args.preload:
        env["LD_PRELOAD"] = os.path.abspath(args.preload)
    for kv in args.env or []:
        k, _, v = kv.partition("=")
        env[k] = v
    flood = {}
    steady = bool(args.flood) and args.flood_when == "before"
    if steady:
        subprocess.run([b.bin, "--config", b.config, "bootstrap"], check=True, stdout=subprocess.DEVNULL)
        make_flood(b.inbox(FLOOD_AGENT), args.flood, flood)
        os.sync()
    started_info = b.start(env_extra=env)
    if steady:
        flood["ready_ms"] = round(started_info["ready_ms"], 1)
    ino = Inotify()
    try:
        ino.add(b.dir, Inotify.IN_MODIFY | Inotify.IN_CLOSE_WRITE | Inotify.IN_CREATE)
        ino.add(os.path.join(b.root, ".daemon"), Inotify.IN_MOVED_TO)
        for a in names:
            os.makedirs(os.path.join(b.inbox(a), ".tmp"), exist_ok=True)
            os.makedirs(os.path.join(b.inbox(a), "processed"), exist_ok=True)
            ino.add(os.path.join(b.inbox(a), "processed"), Inotify.IN_MOVED_TO)
        time.sleep(0.5)
        tracer = None
        if args.strace_counts:
            # Counting run: strace slows every syscall, so its latencies are not the figures.
            # STRACE_TT=1: every call with its time (-tt -T) in strace.txt instead, to
            # read the critical path of one wake (KEEP=1 keeps it); no counts then.
            how = (["-tt", "-T", "-o", os.path.join(b.dir, "strace.txt")] if os.environ.get("STRACE_TT") == "1"
                   else ["-c", "-o", os.path.join(b.dir, "strace-c.txt")])
            tracer = subprocess.Popen(["strace", "-f", *how,
                                       "-p", str(b.pid)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            time.sleep(1.0)
        cpu0 = proc_cpu(b.pid)
        loop_tid = str(b.pid)
        threads0 = proc_threads(b.pid)
        offset = 0
        samples = []
        expected = {}
        total = args.warmup + args.wakes
        flooder = None
        perf = None
        for i in range(total):
            if args.perf and i == args.warmup:
                perf = subprocess.Popen(["perf", "record", "-F", "999", "--call-graph", "dwarf,16384", "-o",
                                         os.path.join(b.dir, "perf-latency.data"), "-p", str(b.pid)],
                                        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                time.sleep(1.0)
            if args.flood and not steady and i == args.warmup:
                flooder = threading.Thread(target=make_flood, args=(b.inbox(FLOOD_AGENT), args.flood, flood),
                                           daemon=True)
                flooder.start()
            agent = names[i % len(names)]
            name = f"lat{i:06d}.json"
            expected.setdefault(agent, []).append(name)
            tmp = b.write_tmp(agent, name, fsync=True)
            dst = os.path.join(b.inbox(agent), name)
            t_rt = time.time_ns()
            t_mono = time.monotonic_ns()
            os.rename(tmp, dst)
            got = []

            def stamped():
                nonlocal offset, got
                new, offset = read_stamps(b.stamps, offset)
                got += [x for x in new if x["agent"] != FLOOD_AGENT]
                return bool(got)

            if not ino.until(stamped, 30, poll=0.05):
                raise BenchFailed(f"wake {i} ({agent}): no session started within 30 s")
            s = got[0]
            if len(got) != 1 or s["agent"] != agent:
                raise BenchFailed(f"wake {i} ({agent}): unexpected sessions {got}")
            processed = os.path.join(b.inbox(agent), "processed", name)

            def ended():
                if not os.path.exists(processed):
                    return False
                hb = b.heartbeat()
                return (hb is not None and not [r for r in hb["running"] if r["agent"] != FLOOD_AGENT]
                        and not [w for w in hb["waiting"] if w != FLOOD_AGENT])

            if not ino.until(ended, 30, poll=0.05):
                raise BenchFailed(f"wake {i} ({agent}): session {s['sid']} did not end within 30 s "
                                  f"(message not in processed/, or daemon.json still shows it running)")
            t_end = time.monotonic_ns()
            if i >= args.warmup:
                samples.append(
                    {"agent": agent, "sid": s["sid"], "pid": s["pid"], "t_rt": t_rt, "t_mono": t_mono,
                     "lat": s["mono"] - t_mono, "agent_rt": s["rt"], "cycle": t_end - t_mono}
                )
            if args.gap > 0:
                time.sleep(args.gap)
            if (i + 1) % 200 == 0:
                log(f"  latency: {i + 1}/{total}, last {samples[-1]['lat'] / 1e6:.2f} ms" if samples else f"  {i + 1}")
        if perf:
            perf.send_signal(signal.SIGINT)
            wait_or_kill(perf, 120, "perf record")
        cpu1 = proc_cpu(b.pid)
        threads1 = proc_threads(b.pid)
        mem = proc_mem_kib(b.pid)
        notify = b.notify_count
        if flooder is not None or steady:
            if flooder is not None:
                flood["done_before_last_wake"] = not flooder.is_alive()
                flooder.join(600)
            # Every request is served and removed; the junk stays.
            inbox = b.inbox(FLOOD_AGENT)

            def drained():
                return not any(n.startswith(".wake-") for n in os.listdir(inbox))

            t0 = time.monotonic()
            if not ino.until(drained, 120, poll=0.5):
                raise BenchFailed(f"the {args.flood} wake requests in {inbox} were not removed within 120 s")
            flood["drained_after_last_wake_s"] = round(time.monotonic() - t0, 2)

        if tracer:
            tracer.send_signal(signal.SIGINT)
            wait_or_kill(tracer, 30, "strace")
    finally:
        ino.close()
        t_stop = time.monotonic()
        rc = b.stop()
        stop_s = round(time.monotonic() - t_stop, 2)
    check, _ = verify_delivery(b, expected)
    started, spawned, counts = log_events(os.path.join(b.dir, "daemon.log"))
    to_started, started_to_agent, to_spawned, spawned_to_agent = [], [], [], []
    for s in samples:
        t_start = started.get((s["agent"], s["sid"]))
        if t_start is not None:
            to_started.append(t_start - s["t_rt"])
            started_to_agent.append(s["agent_rt"] - t_start)
        t_sp = spawned.get(s["pid"])
        if t_sp is not None:
            to_spawned.append(t_sp - s["t_rt"])
            spawned_to_agent.append(s["agent_rt"] - t_sp)
    lat = [s["lat"] for s in samples]
    n10 = max(1, len(lat) // 10)
    result = {
        "bench": "latency",
        "label": args.label or ("strace" if args.strace_counts else "nosync" if args.preload else "default"),
        "agents": args.agents,
        "wakes": len(samples),
        "gap_s": args.gap,
        "latency_ms": dist(lat),
        "first_10pct_p50_ms": round(pct(lat[:n10], 50) / 1e6, 3),
        "last_10pct_p50_ms": round(pct(lat[-n10:], 50) / 1e6, 3),
        "over_20ms": sum(1 for x in lat if x > 20e6),
        "breakdown_ms": {
            "rename_to_session_started_log": dist(to_started),
            "session_started_log_to_agent_main": dist(started_to_agent),
            "rename_to_spawn_returned_log": dist(to_spawned),
            "spawn_returned_log_to_agent_main": dist(spawned_to_agent),
        },
        "cycle_ms": dist([s["cycle"] for s in samples]),
        "daemon_cpu_s": round(cpu1 - cpu0, 2),
        "daemon_cpu_ms_per_wake": round((cpu1 - cpu0) * 1000 / max(1, total), 3),
        # The loop is the main thread (a current-thread runtime): its CPU is
        # what a wake waits behind; the rest is the watcher and the blocking
        # threads (ends recorded, flooded inboxes listed, requests removed).
        "daemon_loop_cpu_ms_per_wake": round(
            (threads1.get(loop_tid, {}).get("ticks", 0) - threads0.get(loop_tid, {}).get("ticks", 0))
            * 1000 / CLK_TCK / max(1, total), 3),
        "daemon_other_threads_cpu_s": round(
            (cpu1 - cpu0) - (threads1.get(loop_tid, {}).get("ticks", 0)
                             - threads0.get(loop_tid, {}).get("ticks", 0)) / CLK_TCK, 2),
        "daemon_mem": mem,
        "notify_datagrams": notify,
        "log_warn_error": counts,
        "daemon_exit": rc,
        "check": check,
        "dir": b.dir,
    }
    if args.flood:
        all_stamps, _ = read_stamps(b.stamps, 0)
        flood["when"] = args.flood_when
        # The wakes measured while the flood was being made, while wake
        # requests were left in the flooded inbox (until the daemon said they
        # were all served and removed), and after: the junk files stay.
        drained = flood_drained_rt(os.path.join(b.dir, "daemon.log"))
        made = (flood.pop("made_from_ns", None), flood.pop("made_to_ns", None))
        phases = {"while_made": [], "requests_left": [], "after": []}
        for s in samples:
            if not steady and made[0] is not None and s["t_mono"] < (made[1] or 1 << 62):
                phases["while_made"].append(s["lat"])
            elif drained is None or s["t_rt"] < drained:
                phases["requests_left"].append(s["lat"])
            else:
                phases["after"].append(s["lat"])
        flood["phases"] = {k: {"wakes": len(v), "latency_ms": dist(v) if v else None} for k, v in phases.items()}
        flood["files_each"] = args.flood
        flood["sessions_of_flooded_agent"] = sum(1 for x in all_stamps if x["agent"] == FLOOD_AGENT)
        flood["sigterm_to_exit_s"] = stop_s
        result["flood"] = flood
    if args.strace_counts and os.environ.get("STRACE_TT") != "1":
        result["syscalls_per_wake"] = strace_counts(os.path.join(b.dir, "strace-c.txt"), total)
    with open(os.path.join(b.dir, "samples.json"), "w") as f:
        json.dump(samples, f)
    return result


def one_wake(b, ino, names_state, agent, name):
    """Rename one message into AGENT's inbox of B; wait for its session to start
    and end (message in processed/, daemon.json shows no clean agent running).
    Returns (t_rt, t_mono, latency ns)."""
    tmp = b.write_tmp(agent, name, fsync=True)
    dst = os.path.join(b.inbox(agent), name)
    t_rt = time.time_ns()
    t_mono = time.monotonic_ns()
    os.rename(tmp, dst)
    got = []

    def stamped():
        nonlocal got
        new, names_state[b.dir] = read_stamps(b.stamps, names_state[b.dir])
        got += [x for x in new if x["agent"] != FLOOD_AGENT]
        return bool(got)

    if not ino.until(stamped, 30, poll=0.05):
        raise BenchFailed(f"{b.dir}: {name} ({agent}): no session started within 30 s")
    if len(got) != 1 or got[0]["agent"] != agent:
        raise BenchFailed(f"{b.dir}: {name} ({agent}): unexpected sessions {got}")
    processed = os.path.join(b.inbox(agent), "processed", name)

    def ended():
        if not os.path.exists(processed):
            return False
        hb = b.heartbeat()
        return (hb is not None and not [r for r in hb["running"] if r["agent"] != FLOOD_AGENT]
                and not [w for w in hb["waiting"] if w != FLOOD_AGENT])

    if not ino.until(ended, 30, poll=0.05):
        raise BenchFailed(f"{b.dir}: {name} ({agent}): session did not end within 30 s")
    return t_rt, t_mono, got[0]["mono"] - t_mono


def paired_ratio(clean, flooded, p, resamples=1000, seed=1):
    """p-th percentile of FLOODED / that of CLEAN, and a 95% bootstrap interval
    resampling the pairs (wake i of each side was taken at the same moment)."""
    import random
    if not clean or not flooded:
        return None
    n = min(len(clean), len(flooded))
    clean, flooded = clean[:n], flooded[:n]
    r = pct(flooded, p) / max(1, pct(clean, p))
    rng = random.Random(seed)
    rs = []
    for _ in range(resamples):
        idx = [rng.randrange(n) for _ in range(n)]
        rs.append(pct([flooded[i] for i in idx], p) / max(1, pct([clean[i] for i in idx], p)))
    rs.sort()
    return {"ratio": round(r, 3), "ci95": [round(rs[int(0.025 * resamples)], 3), round(rs[int(0.975 * resamples) - 1], 3)],
            "flooded_slower_in_pct_of_pairs": round(100 * sum(1 for a, c in zip(flooded, clean) if a > c) / n, 1)}


def cmd_paired(args):
    """Two daemons of the same binary at once, identical configs; the flooded
    one's FLOOD_AGENT inbox holds --flood wake requests + as many junk files
    before it starts. Wakes alternate between them (the side going first
    alternates too), each waited to its end, so both series see the same
    machine at the same moments."""
    sides = {"clean": Bench(args, (args.name or "paired") + "-clean"),
             "flooded": Bench(args, (args.name or "paired") + "-flooded")}
    names = agent_names(args.agents)
    wrap = {"clean": None, "flooded": None}
    if args.pin:
        # --pin: each daemon on its own CPU (0 and 1), so the flooded one's
        # threads cannot take the clean one's CPU; the benchmark itself floats.
        wrap = {"clean": ["taskset", "-c", "0"], "flooded": ["taskset", "-c", "1"]}
    flood = {}
    for k, b in sides.items():
        b.write_config(names + [FLOOD_AGENT], max_concurrent=4)
        subprocess.run([b.bin, "--config", b.config, "bootstrap"], check=True, stdout=subprocess.DEVNULL)
    make_flood(sides["flooded"].inbox(FLOOD_AGENT), args.flood, flood)
    flood.pop("made_from_ns", None)
    flood.pop("made_to_ns", None)
    os.sync()
    ready = {}
    ino = Inotify()
    samples = {"clean": [], "flooded": []}
    cpu = {}
    expected = {"clean": {}, "flooded": {}}
    try:
        for k, b in sides.items():
            ready[k] = round(b.start(env_extra={"AGENT_STATE_LOG": "debug"}, wrap=wrap[k])["ready_ms"], 1)
            ino.add(b.dir, Inotify.IN_MODIFY | Inotify.IN_CLOSE_WRITE | Inotify.IN_CREATE)
            ino.add(os.path.join(b.root, ".daemon"), Inotify.IN_MOVED_TO)
            for a in names:
                os.makedirs(os.path.join(b.inbox(a), ".tmp"), exist_ok=True)
                os.makedirs(os.path.join(b.inbox(a), "processed"), exist_ok=True)
                ino.add(os.path.join(b.inbox(a), "processed"), Inotify.IN_MOVED_TO)
        time.sleep(0.5)
        offsets = {b.dir: 0 for b in sides.values()}
        total = args.warmup + args.wakes
        for i in range(total):
            if i == args.warmup:
                cpu = {k: (proc_cpu(b.pid), proc_threads(b.pid)) for k, b in sides.items()}
            agent = names[i % len(names)]
            name = f"lat{i:06d}.json"
            order = ("clean", "flooded") if i % 2 == 0 else ("flooded", "clean")
            for k in order:
                expected[k].setdefault(agent, []).append(name)
                t_rt, t_mono, lat = one_wake(sides[k], ino, offsets, agent, name)
                if i >= args.warmup:
                    samples[k].append({"i": i, "t_rt": t_rt, "lat": lat})
                if args.gap > 0:
                    time.sleep(args.gap)
            if (i + 1) % 200 == 0:
                log(f"  paired: {i + 1}/{total}")
        cpu1 = {k: (proc_cpu(b.pid), proc_threads(b.pid)) for k, b in sides.items()}
        pids = {k: b.pid for k, b in sides.items()}
        inbox = sides["flooded"].inbox(FLOOD_AGENT)

        def drained():
            return not any(n.startswith(".wake-") for n in os.listdir(inbox))

        t0 = time.monotonic()
        if not ino.until(drained, 120, poll=0.5):
            raise BenchFailed(f"the {args.flood} wake requests in {inbox} were not removed within 120 s")
        flood["drained_after_last_wake_s"] = round(time.monotonic() - t0, 2)
    finally:
        ino.close()
        rc = {k: b.stop() for k, b in sides.items()}
    checks = {k: verify_delivery(b, expected[k])[0] for k, b in sides.items()}
    # Phases by the flooded daemon's clock: while its inbox still held wake
    # requests (until it logged them all served and removed), and after (the
    # junk stays). Pair i of the clean side goes to the same phase as pair i.
    drained_rt = flood_drained_rt(os.path.join(sides["flooded"].dir, "daemon.log"))
    phase_of = {s["i"]: ("requests_left" if drained_rt is None or s["t_rt"] < drained_rt else "after")
                for s in samples["flooded"]}
    phases = {}
    for ph in ("requests_left", "after", "all"):
        per = {k: [s["lat"] for s in samples[k] if ph == "all" or phase_of[s["i"]] == ph] for k in sides}
        phases[ph] = {"wakes": len(per["flooded"]),
                      "clean_ms": dist(per["clean"]) if per["clean"] else None,
                      "flooded_ms": dist(per["flooded"]) if per["flooded"] else None,
                      "p50": paired_ratio(per["clean"], per["flooded"], 50),
                      "p99": paired_ratio(per["clean"], per["flooded"], 99)}
    n = max(1, args.wakes)
    cpu_per_wake = {}
    for k, b in sides.items():
        if k in cpu:
            tid = str(pids[k])
            loop = (cpu1[k][1].get(tid, {}).get("ticks", 0) - cpu[k][1].get(tid, {}).get("ticks", 0)) / CLK_TCK
            cpu_per_wake[k] = {"daemon_ms": round((cpu1[k][0] - cpu[k][0]) * 1000 / n, 3),
                               "loop_ms": round(loop * 1000 / n, 3)}
    return {"bench": "paired", "label": args.label or f"paired flood ({'pinned' if args.pin else 'unpinned'})",
            "agents": args.agents, "wakes": args.wakes, "gap_s": args.gap, "pinned": bool(args.pin),
            "files_each": args.flood, "ready_ms": ready, "flood": flood, "phases": phases,
            "cpu_per_wake": cpu_per_wake, "daemon_exit": rc, "checks": checks,
            "dir": [b.dir for b in sides.values()]}


class SseClients:
    """N open `/events` streams of a daemon's web view, read by one thread
    (select over their sockets); counts each stream's session events."""

    def __init__(self, port, n):
        self.socks = []
        for _ in range(n):
            c = socket.create_connection(("127.0.0.1", port), timeout=10)
            c.sendall(b"GET /events HTTP/1.1\r\nHost: bench\r\nAccept: text/event-stream\r\n\r\n")
            c.setblocking(False)
            self.socks.append(c)
        self.bufs = {c.fileno(): b"" for c in self.socks}
        self.closed = 0
        self.stop = False
        self.thread = threading.Thread(target=self.read, daemon=True)
        self.thread.start()

    def read(self):
        live = list(self.socks)
        while not self.stop and live:
            r, _, _ = select.select(live, [], [], 0.2)
            for c in r:
                try:
                    data = c.recv(65536)
                except (BlockingIOError, InterruptedError):
                    continue
                except OSError:
                    data = b""
                if not data:
                    live.remove(c)
                    self.closed += 1
                    continue
                self.bufs[c.fileno()] += data

    def count(self, needle):
        return [b.count(needle) for b in self.bufs.values()]

    def close(self):
        self.stop = True
        self.thread.join(2)
        for c in self.socks:
            c.close()


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def cmd_web(args):
    """Wake latency with --clients SSE streams open on the web view vs none
    (issue 25): two daemons of the same binary at once, identical configs
    with `[web]` on, one with the streams connected; wakes alternate between
    them (as in `paired`), each waited to its end. Checks that every stream
    saw every session of its daemon start and end, exactly once."""
    sides = {"none": Bench(args, (args.name or "web") + "-none"),
             "sse": Bench(args, (args.name or "web") + "-sse")}
    names = agent_names(args.agents)
    ports = {}
    for k, b in sides.items():
        b.write_config(names, max_concurrent=4)
        ports[k] = free_port()
        with open(b.config, "a") as f:
            f.write(f'\n[web]\nlisten = "127.0.0.1:{ports[k]}"\n')
        subprocess.run([b.bin, "--config", b.config, "bootstrap"], check=True, stdout=subprocess.DEVNULL)
    ready = {}
    ino = Inotify()
    samples = {"none": [], "sse": []}
    expected = {"none": {}, "sse": {}}
    clients = None
    cpu = {}
    try:
        for k, b in sides.items():
            ready[k] = round(b.start()["ready_ms"], 1)
            ino.add(b.dir, Inotify.IN_MODIFY | Inotify.IN_CLOSE_WRITE | Inotify.IN_CREATE)
            ino.add(os.path.join(b.root, ".daemon"), Inotify.IN_MOVED_TO)
            for a in names:
                os.makedirs(os.path.join(b.inbox(a), ".tmp"), exist_ok=True)
                os.makedirs(os.path.join(b.inbox(a), "processed"), exist_ok=True)
                ino.add(os.path.join(b.inbox(a), "processed"), Inotify.IN_MOVED_TO)
        clients = SseClients(ports["sse"], args.clients)
        # Every stream is open (its first chunk, ": stream", arrived).
        if not ino.until(lambda: all(c >= 1 for c in clients.count(b": stream")), 30, poll=0.05):
            raise BenchFailed(f"{args.clients} event streams did not all open within 30 s: {clients.count(b': stream')}")
        # Idle, the streams open on one side: what N readers cost with nothing
        # happening (before issue 25's shared reader, each stream polled the
        # journals itself).
        i0 = {k: proc_cpu(b.pid) for k, b in sides.items()}
        t0 = time.monotonic()
        time.sleep(args.idle)
        idle = {k: round((proc_cpu(b.pid) - i0[k]) * 1000 / (time.monotonic() - t0), 1) for k, b in sides.items()}
        offsets = {b.dir: 0 for b in sides.values()}
        total = args.warmup + args.wakes
        for i in range(total):
            if i == args.warmup:
                cpu = {k: proc_cpu(b.pid) for k, b in sides.items()}
            agent = names[i % len(names)]
            name = f"lat{i:06d}.json"
            order = ("none", "sse") if i % 2 == 0 else ("sse", "none")
            for k in order:
                expected[k].setdefault(agent, []).append(name)
                t_rt, t_mono, lat = one_wake(sides[k], ino, offsets, agent, name)
                if i >= args.warmup:
                    samples[k].append({"i": i, "t_rt": t_rt, "lat": lat})
                if args.gap > 0:
                    time.sleep(args.gap)
            if (i + 1) % 200 == 0:
                log(f"  web: {i + 1}/{total}")
        cpu1 = {k: proc_cpu(b.pid) for k, b in sides.items()}
        # The streams: every session's start and end, once each (the last
        # end may still be on its way: wait for it, bounded).
        want = total

        def all_seen():
            return all(c >= want for c in clients.count(b'"kind":"session_end"'))

        ino.until(all_seen, 10, poll=0.1)
        starts = clients.count(b'"kind":"session_start"')
        ends = clients.count(b'"kind":"session_end"')
        sse_check = {"ok": all(c == want for c in starts) and all(c == want for c in ends) and clients.closed == 0,
                     "streams": args.clients, "sessions": want, "closed": clients.closed,
                     "session_start_seen": sorted(set(starts)), "session_end_seen": sorted(set(ends))}
    finally:
        if clients:
            clients.close()
        ino.close()
        rc = {k: b.stop() for k, b in sides.items()}
    checks = {k: verify_delivery(b, expected[k])[0] for k, b in sides.items()}
    lat = {k: [s["lat"] for s in v] for k, v in samples.items()}
    n = max(1, args.wakes)
    return {"bench": "web", "label": args.label or f"{args.clients} SSE clients vs none",
            "agents": args.agents, "wakes": args.wakes, "gap_s": args.gap, "clients": args.clients,
            "ready_ms": ready,
            "latency_ms": {k: dist(v) for k, v in lat.items()},
            "sse_over_none": {"p50": paired_ratio(lat["none"], lat["sse"], 50),
                              "p99": paired_ratio(lat["none"], lat["sse"], 99)},
            "cpu_per_wake_ms": {k: round((cpu1[k] - cpu[k]) * 1000 / n, 3) for k in cpu},
            "idle_cpu_ms_per_s": idle, "idle_s": args.idle,
            "daemon_exit": rc, "checks": checks, "sse_check": sse_check,
            "dir": [b.dir for b in sides.values()]}


def strace_counts(path, per):
    """Calls per syscall from an `strace -c` table, divided by `per`."""
    out = {}
    with open(path) as f:
        for line in f:
            parts = line.split()
            # % time, seconds, usecs/call, calls, [errors,] syscall
            if len(parts) >= 5 and parts[-1].isidentifier() and parts[0][0].isdigit() and parts[-1] != "total":
                try:
                    calls = int(parts[3])
                except ValueError:
                    continue
                out[parts[-1]] = round(calls / per, 2)
    return dict(sorted(out.items(), key=lambda kv: -kv[1]))


# ---- 1b. agent-state wake --wait -------------------------------------------------


def cmd_wakecli(args):
    b = Bench(args, "wakecli")
    names = agent_names(args.agents)
    b.write_config(names, max_concurrent=4)
    b.start()
    ino = Inotify()
    walls, to_agent, cli_after_agent = [], [], []
    try:
        ino.add(os.path.join(b.root, ".daemon"), Inotify.IN_MOVED_TO)
        time.sleep(0.5)
        offset = 0
        for i in range(args.warmup + args.wakes):
            agent = names[i % len(names)]
            t0 = time.monotonic_ns()
            try:
                r = subprocess.run([b.bin, "--config", b.config, "wake", agent, "--wait", "10s"],
                                   stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=30)
            except subprocess.TimeoutExpired:
                raise BenchFailed(f"wake {i} ({agent}): `agent-state wake --wait 10s` did not exit within 30 s")
            t1 = time.monotonic_ns()
            if r.returncode != 0:
                raise BenchFailed(f"wake {i} ({agent}): `agent-state wake --wait` exited {r.returncode}: "
                                  f"{r.stderr.decode(errors='replace').strip()}")
            new, offset2 = read_stamps(b.stamps, offset)
            deadline = time.monotonic() + 10
            while not new and time.monotonic() < deadline:
                time.sleep(0.001)
                new, offset2 = read_stamps(b.stamps, offset)
            offset = offset2
            if not new:
                raise BenchFailed(f"wake {i} ({agent}): `wake --wait` returned but the agent never ran")

            def ended():
                hb = b.heartbeat()
                return hb is not None and not hb["running"] and not hb["waiting"]

            if not ino.until(ended, 30):
                raise BenchFailed(f"wake {i} ({agent}): the session did not end within 30 s")
            if i >= args.warmup:
                walls.append(t1 - t0)
                to_agent.append(new[0]["mono"] - t0)
                cli_after_agent.append(t1 - new[0]["mono"])
            time.sleep(args.gap)
        mem = proc_mem_kib(b.pid)
    finally:
        ino.close()
        rc = b.stop()
    return {
        "bench": "wakecli",
        "agents": args.agents,
        "wakes": len(walls),
        "cli_wall_ms": dist(walls),
        "cli_start_to_agent_main_ms": dist(to_agent),
        "agent_main_to_cli_exit_ms": dist(cli_after_agent),
        "daemon_mem": mem,
        "daemon_exit": rc,
        "dir": b.dir,
    }


# ---- 2. burst ----------------------------------------------------------------------


def dir_names(path):
    try:
        return [e.name for e in os.scandir(path)]
    except FileNotFoundError:
        return []


def cmd_burst(args):
    b = Bench(args, "burst")
    names = agent_names(args.agents)
    b.write_config(names, max_concurrent=args.max_concurrent)
    # Bootstrap without the daemon, then write every message into inbox/.tmp/
    # (not watched: the watch is on inbox/ only, not recursive) before the
    # daemon starts, so the timed part is only renames and the daemon's work.
    subprocess.run([b.bin, "--config", b.config, "bootstrap"], check=True, stdout=subprocess.DEVNULL)
    t = time.monotonic()
    expected = {}
    for a in names:
        os.makedirs(os.path.join(b.inbox(a), ".tmp"), exist_ok=True)
        expected[a] = [f"m{a}-{j:05d}.json" for j in range(args.per_agent)]
        for n in expected[a]:
            b.write_tmp(a, n, fsync=False)
    os.sync()
    log(f"  burst: wrote {args.agents * args.per_agent} messages to inbox/.tmp/ in {time.monotonic() - t:.1f} s")
    total = args.agents * args.per_agent
    env = {}
    if args.preload:
        # A diagnosis, not the burst: nosync.so shows what the syncs cost.
        env["LD_PRELOAD"] = os.path.abspath(args.preload)
    wrap = None
    b.start(env_extra=env, wrap=wrap)
    pid = b.pid
    time.sleep(1.0)
    perf = None
    if args.perf:
        perf = subprocess.Popen(["perf", "record", "-F", "99" if args.perf == 2 else "499"] + (["--call-graph", "dwarf,16384"] if args.perf == 2 else ["-g"]) + [ "-o", os.path.join(b.dir, "perf.data"),
                                 "-p", str(pid)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        time.sleep(1.0)
    strace = None
    if args.strace:
        # Counts only (-c): every system call of every thread of the daemon during the
        # burst, per message in the result. Slows the daemon; the rate of such a run
        # is not the burst's.
        strace = subprocess.Popen(["strace", "-f"] + (["-c"] if args.strace == 1 else ["-tt"]) + ["-o", os.path.join(b.dir, "strace.txt"), "-p", str(pid)],
                                  stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        time.sleep(1.0)
    cpu0 = proc_cpu(pid)
    timeline = []
    processed_dirs = [os.path.join(b.inbox(a), "processed") for a in names]

    # Rename everything in, round-robin over the agents, as fast as one process can.
    order = [(a, expected[a][j]) for j in range(args.per_agent) for a in names]
    t_first_rt = time.time_ns()
    t_first = time.monotonic()
    for a, n in order:
        ib = b.inbox(a)
        os.rename(os.path.join(ib, ".tmp", n), os.path.join(ib, n))
    t_renamed = time.monotonic()
    log(f"  burst: {total} renames in {t_renamed - t_first:.2f} s")

    done = 0
    timed_out = False
    max_hwm = 0
    while True:
        done = sum(len(dir_names(d)) for d in processed_dirs)
        el = time.monotonic() - t_first
        try:
            mem = proc_mem_kib(pid)
            max_hwm = max(max_hwm, mem["VmHWM_kib"])
            cpu = proc_cpu(pid) - cpu0
        except FileNotFoundError:
            break
        timeline.append({"t": round(el, 2), "processed": done, "cpu_s": round(cpu, 2), "rss_kib": mem["VmRSS_kib"]})
        if len(timeline) % 10 == 1:
            log(f"  burst: t={el:6.1f}s processed {done}/{total}  daemon cpu {cpu:.1f}s  rss {mem['VmRSS_kib']} KiB")
        if done >= total:
            break
        if el > args.timeout:
            timed_out = True
            break
        if b.proc.poll() is not None:
            break
        time.sleep(args.poll)
    # Let the last sessions end (their messages are moved before the session is recorded).
    ino_deadline = time.monotonic() + 30
    while time.monotonic() < ino_deadline and not timed_out:
        hb = b.heartbeat()
        if hb and not hb["running"] and not hb["waiting"]:
            break
        time.sleep(0.05)
    cpu_used = proc_cpu(pid) - cpu0
    mem = proc_mem_kib(pid)
    if perf:
        perf.send_signal(signal.SIGINT)
        wait_or_kill(perf, 120, "perf record")
    syscalls = None
    if strace:
        strace.send_signal(signal.SIGINT)
        wait_or_kill(strace, 120, "strace")
        syscalls = strace_counts(os.path.join(b.dir, "strace.txt"), total) if args.strace == 1 else "strace.txt"
    rc = b.stop()

    # The end: the last rename into any processed/ (directory mtimes).
    last_processed_rt = max(os.stat(d).st_mtime_ns for d in processed_dirs if os.path.isdir(d))
    elapsed = (last_processed_rt - t_first_rt) / 1e9

    check, journal = verify_delivery(b, expected)
    if timed_out:
        check["ok"] = False
    sessions, outcomes, per_session = journal["sessions"], journal["outcomes"], journal["per_session"]
    _, _, counts = log_events(os.path.join(b.dir, "daemon.log"))
    with open(os.path.join(b.dir, "timeline.json"), "w") as f:
        json.dump(timeline, f)
    result = {
        "bench": "burst",
        "agents": args.agents,
        "per_agent": args.per_agent,
        "messages": total,
        "max_concurrent": args.max_concurrent,
        "rename_s": round(t_renamed - t_first, 3),
        "rename_per_s": round(total / max(1e-9, t_renamed - t_first)),
        "first_rename_to_last_processed_s": round(elapsed, 3),
        "msgs_per_s": round(done / elapsed, 1) if elapsed > 0 else None,
        "processed": done,
        "timed_out": timed_out,
        "sessions": sessions,
        "messages_per_session": {"min": min(per_session), "p50": pct(per_session, 50), "max": max(per_session)} if per_session else None,
        "outcomes": outcomes,
        "daemon_cpu_s": round(cpu_used, 2),
        "daemon_VmHWM_kib": max(max_hwm, mem["VmHWM_kib"]),
        "check": check,
        "log_warn_error": counts,
        "daemon_exit": rc,
        "dir": b.dir,
        "preload": args.preload,
    }
    if syscalls is not None:
        result["syscalls_per_message"] = syscalls
    return result


def verify_delivery(b, expected):
    """The exactly-once check: every message of `expected` ({agent: [file names]})
    is in its agent's processed/ exactly once, nothing else is there, nothing is
    left in inbox/, .claimed/ or rejected/, and every message id appears in
    exactly one session_start `messages` of the agent's journal.
    Returns (check, journal stats)."""
    missing = extra = left_inbox = left_claimed = rejected = 0
    examples = []
    for a in expected:
        ib = b.inbox(a)
        got = set(dir_names(os.path.join(ib, "processed")))
        want = set(expected[a])
        missing += len(want - got)
        extra += len(got - want)
        if got != want and len(examples) < 5:
            examples.append({"agent": a, "missing": sorted(want - got)[:3], "extra": sorted(got - want)[:3]})
        left_inbox += sum(1 for n in dir_names(ib) if n.endswith(".json"))
        for sd in dir_names(os.path.join(ib, ".claimed")):
            left_claimed += len(dir_names(os.path.join(ib, ".claimed", sd)))
        rejected += len(dir_names(os.path.join(ib, "rejected")))
    # ... and claimed by exactly one session (the journal's session_start `messages`).
    claims = {}
    sessions = 0
    outcomes = {}
    per_session = []
    for a in expected:
        try:
            with open(os.path.join(b.root, a, "journal.jsonl")) as f:
                for line in f:
                    try:
                        e = json.loads(line)
                    except ValueError:
                        continue
                    ev = e.get("event")
                    if ev == "session_start":
                        sessions += 1
                        ms = e.get("messages", [])
                        per_session.append(len(ms))
                        for m in ms:
                            claims[(a, m)] = claims.get((a, m), 0) + 1
                    elif ev in ("session_end", "error", "timeout"):
                        k = e.get("outcome", ev) if ev == "session_end" else ev
                        outcomes[k] = outcomes.get(k, 0) + 1
        except FileNotFoundError:
            pass
    claimed_twice = sum(1 for v in claims.values() if v > 1)
    never_claimed = sum(1 for a in expected for n in expected[a] if (a, n[:-5]) not in claims)
    ok = (missing == 0 and extra == 0 and left_inbox == 0 and left_claimed == 0
          and rejected == 0 and claimed_twice == 0 and never_claimed == 0)
    check = {"ok": ok, "messages": sum(len(v) for v in expected.values()), "missing": missing,
             "extra_or_duplicate": extra, "left_in_inbox": left_inbox, "left_in_claimed": left_claimed,
             "rejected": rejected, "claimed_twice": claimed_twice, "never_claimed": never_claimed,
             "examples": examples}
    return check, {"sessions": sessions, "outcomes": outcomes, "per_session": per_session}


def check_text(c):
    if "streams" in c:
        return (f"{'OK' if c['ok'] else 'FAILED'} ({c['streams']} streams, {c['sessions']} sessions each; "
                f"starts seen {c['session_start_seen']}, ends seen {c['session_end_seen']}, closed {c['closed']})")
    return (f"{'OK' if c['ok'] else 'FAILED'} (missing {c['missing']}, dup/extra {c['extra_or_duplicate']}, "
            f"inbox {c['left_in_inbox']}, claimed {c['left_in_claimed']}, rejected {c['rejected']}, "
            f"twice {c['claimed_twice']}, never claimed {c['never_claimed']})")


# ---- 2b. the burst's floor ---------------------------------------------------------


def cmd_floor(args):
    """The burst without the daemon: floor.c does only the inbox protocol's own
    system calls (the sender's rename; list, read, rename into .claimed/, rename
    into processed/, a sync of each directory per batch), with 1 and 2 worker
    processes. What no daemon on this disk can beat, whatever its code."""
    b = Bench(args, "floor")
    names = agent_names(args.agents)
    runs = []
    for workers in [int(w) for w in args.workers.split(",")]:
        if os.path.exists(b.root):
            shutil.rmtree(b.root)
        for a in names:
            os.makedirs(os.path.join(b.inbox(a), ".tmp"))
            for j in range(args.per_agent):
                b.write_tmp(a, f"m{j:05d}.json", fsync=False)
        os.sync()
        out = subprocess.run([os.path.abspath(args.floor), b.root, str(args.agents), str(args.per_agent), str(workers)],
                             capture_output=True, text=True, timeout=args.timeout)
        if out.returncode != 0:
            raise BenchFailed(f"floor with {workers} worker(s) failed: {out.stderr.strip()}")
        r = json.loads(out.stdout)
        got = sum(len(dir_names(os.path.join(b.inbox(a), "processed"))) for a in names)
        if got != args.agents * args.per_agent:
            raise BenchFailed(f"floor with {workers} worker(s): {got} messages in processed/, not {args.agents * args.per_agent}")
        r["msgs_per_s"] = round(got / r["seconds"], 1)
        log(f"  floor: {workers} worker(s): {r['msgs_per_s']:.0f} msgs/s ({r['seconds']} s; the sender alone {r['sender_seconds']} s)")
        runs.append(r)
    shutil.rmtree(b.root, ignore_errors=True)
    return {"bench": "floor", "agents": args.agents, "per_agent": args.per_agent,
            "messages": args.agents * args.per_agent, "runs": runs,
            "best_msgs_per_s": max(r["msgs_per_s"] for r in runs), "dir": b.dir}


# ---- 3. start-up and RSS --------------------------------------------------------------


def cmd_startup(args):
    b = Bench(args, f"startup-{args.agents}")
    names = agent_names(args.agents)
    b.write_config(names, max_concurrent=4)
    runs = {}
    for which in ("first", "second"):
        log(f"  startup {args.agents} agents: {which} start")
        os.sync()
        r = b.start(log_name=f"daemon-{which}.log")
        r["cpu_s"] = round(proc_cpu(b.pid), 3)
        r["mem_at_ready"] = proc_mem_kib(b.pid)
        time.sleep(args.settle)
        r["mem_settled"] = proc_mem_kib(b.pid)
        hb = b.heartbeat()
        r["agents_in_heartbeat"] = len(hb["agents"]) if hb else None
        with open(os.path.join(b.dir, f"daemon-{which}.log"), errors="replace") as f:
            r["log_warn_error"] = sum(1 for l in f if " WARN " in l or " ERROR " in l)
        if which == "second":
            # SIGHUP: the reload re-bootstraps and rescans every agent.
            t0 = time.monotonic_ns()
            os.kill(b.pid, signal.SIGHUP)
            deadline = time.monotonic() + args.start_timeout
            reloaded = None
            while reloaded is None and time.monotonic() < deadline:
                for t, data in list(b.notify_log):
                    if t > t0 and b"READY=1" in data.split(b"\n"):
                        reloaded = t
                        break
                time.sleep(0.01)
            if reloaded is None:
                raise BenchFailed(f"no READY=1 after SIGHUP within --start-timeout ({args.start_timeout:g} s)")
            r["reload_ms"] = round((reloaded - t0) / 1e6, 1)
        if which == "second" and args.wakes_after:
            perf = None
            if args.perf:
                perf = subprocess.Popen(["perf", "record", "-F", "999", "--call-graph", "dwarf,16384", "-o",
                                         os.path.join(b.dir, "perf-wakes.data"), "-p", str(b.pid)],
                                        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                time.sleep(1.0)
            r["wakes_after"] = small_latency(b, names, args.wakes_after)
            if perf:
                perf.send_signal(signal.SIGINT)
                wait_or_kill(perf, 120, "perf record")
            r["mem_after_wakes"] = proc_mem_kib(b.pid)
        t = time.monotonic()
        r["exit"] = b.stop()
        r["stop_s"] = round(time.monotonic() - t, 3)
        runs[which] = r
    floor = tree_floor(b.root, os.path.join(b.dir, "floor-root"))
    log(f"  startup {args.agents} agents: the first start's floor (the same tree made by this script) "
        f"{floor['seconds']:.2f} s")
    return {
        "bench": "startup",
        "agents": args.agents,
        "first": runs["first"],
        "first_start_floor": floor,
        "second": runs["second"],
        "inotify_max_user_watches": int(open("/proc/sys/fs/inotify/max_user_watches").read()),
        "dir": b.dir,
    }


def tree_floor(src, dst):
    """The first start's floor (issue 21): the directories and files the first
    start left under SRC (every agent's), made again under DST by this script
    alone (mkdir; open O_CREAT|O_EXCL, write the same bytes, close) and made
    durable with one syncfs(2). Most of a first start is the file system
    allocating inodes (on an ext4 without a journal, slower for minutes after a
    mass delete), which no daemon can avoid; the ratio first start / floor is
    the daemon's own share, measured on the same disk minutes apart. The
    floor's own CPU is Python's, so it errs high (the ratio low)."""
    plan = []
    for dirpath, dirnames, filenames in os.walk(src):
        rel = os.path.relpath(dirpath, src)
        plan.append((os.path.normpath(os.path.join(dst, rel)), None))
        for f in filenames:
            p = os.path.join(dirpath, f)
            try:
                with open(p, "rb") as fh:
                    data = fh.read()
            except OSError:
                continue
            plan.append((os.path.join(dst, rel, f), data))
    if os.path.exists(dst):
        shutil.rmtree(dst)
    os.sync()
    libc = ctypes.CDLL(None, use_errno=True)
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC
    r0 = resource.getrusage(resource.RUSAGE_SELF)
    t0 = time.monotonic()
    for path, data in plan:
        if data is None:
            os.mkdir(path, 0o755)
        else:
            fd = os.open(path, flags, 0o644)
            if data:
                os.write(fd, data)
            os.close(fd)
    fd = os.open(dst, os.O_RDONLY | os.O_DIRECTORY)
    try:
        libc.syncfs(fd)
    finally:
        os.close(fd)
    t1 = time.monotonic()
    r1 = resource.getrusage(resource.RUSAGE_SELF)
    dirs = sum(1 for _, d in plan if d is None)
    return {"seconds": round(t1 - t0, 3), "dirs": dirs, "files": len(plan) - dirs,
            "cpu_user_s": round(r1.ru_utime - r0.ru_utime, 3), "cpu_sys_s": round(r1.ru_stime - r0.ru_stime, 3)}


def small_latency(b, names, n):
    """A few sequential wakes on a running daemon (used at 10,000 agents)."""
    ino = Inotify()
    ino.add(b.dir, Inotify.IN_MODIFY | Inotify.IN_CLOSE_WRITE | Inotify.IN_CREATE)
    ino.add(os.path.join(b.root, ".daemon"), Inotify.IN_MOVED_TO)
    offset = os.path.getsize(b.stamps) if os.path.exists(b.stamps) else 0
    lat = []
    cpu0 = proc_cpu(b.pid)
    step = max(1, len(names) // n)
    expected = {}
    try:
        for i in range(n):
            agent = names[(i * step) % len(names)]
            os.makedirs(os.path.join(b.inbox(agent), ".tmp"), exist_ok=True)
            name = f"lat{i:06d}.json"
            expected.setdefault(agent, []).append(name)
            tmp = b.write_tmp(agent, name, fsync=True)
            t0 = time.monotonic_ns()
            os.rename(tmp, os.path.join(b.inbox(agent), name))
            got = []

            def stamped():
                nonlocal offset, got
                new, offset = read_stamps(b.stamps, offset)
                got += new
                return bool(got)

            if not ino.until(stamped, 30):
                raise BenchFailed(f"wake {i} ({agent}): no session started within 30 s")
            lat.append(got[0]["mono"] - t0)
            processed = os.path.join(b.inbox(agent), "processed", name)

            def ended():
                if not os.path.exists(processed):
                    return False
                hb = b.heartbeat()
                return hb is not None and not hb["running"] and not hb["waiting"]

            if not ino.until(ended, 30, poll=0.01):
                raise BenchFailed(f"wake {i} ({agent}): the session did not end within 30 s "
                                  f"(message not in processed/, or daemon.json still shows it running)")
            time.sleep(0.05)
    finally:
        ino.close()
    d = dist(lat)
    d["daemon_cpu_ms_per_wake"] = round((proc_cpu(b.pid) - cpu0) * 1000 / n, 2)
    d["check"], _ = verify_delivery(b, expected)
    return d


# ---- 4. idle ------------------------------------------------------------------------------


def cmd_idle(args):
    b = Bench(args, "idle")
    names = agent_names(args.agents)
    b.write_config(names, max_concurrent=4)
    b.start()
    try:
        time.sleep(args.settle)
        pid = b.pid
        th0 = proc_threads(pid)
        cpu0 = proc_cpu(pid)
        time.sleep(args.seconds)
        cpu1 = proc_cpu(pid)
        th1 = proc_threads(pid)
        threads = []
        for tid, t1 in sorted(th1.items()):
            t0 = th0.get(tid, {"ticks": 0, "vol": 0, "invol": 0})
            threads.append({"tid": tid, "comm": t1["comm"], "cpu_ticks": t1["ticks"] - t0["ticks"],
                            "voluntary_switches": t1["vol"] - t0["vol"], "involuntary_switches": t1["invol"] - t0["invol"],
                            "new": tid not in th0})
        gone = [tid for tid in th0 if tid not in th1]
        result = {
            "bench": "idle",
            "agents": args.agents,
            "seconds": args.seconds,
            "cpu_s": round(cpu1 - cpu0, 3),
            "clk_tck": CLK_TCK,
            "threads": threads,
            "threads_gone": gone,
            "wakeups": sum(t["voluntary_switches"] + t["involuntary_switches"] for t in threads),
            "mem": proc_mem_kib(pid),
            "dir": b.dir,
        }
        if args.strace and shutil.which("strace"):
            out = os.path.join(b.dir, "strace-c.txt")
            trace = os.path.join(b.dir, "strace.txt")
            log(f"  idle: strace -f for {args.seconds} s")
            # One strace with a line per call (-tt -T), counted here: in an idle
            # minute there should be almost nothing to count.
            st = subprocess.Popen(["strace", "-f", "-tt", "-T", "-o", trace, "-p", str(pid)],
                                  stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            time.sleep(args.seconds)
            st.send_signal(signal.SIGINT)
            wait_or_kill(st, 30, "strace")
            calls = {}
            lines = []
            with open(trace, errors="replace") as f:
                for line in f:
                    lines.append(line.rstrip())
                    if "resumed>" in line:
                        continue
                    m = re.match(r"^(\d+)\s+(\d\d:\d\d:\d\d\.\d+)\s+(\w+)\(", line)
                    if m:
                        calls[m.group(3)] = calls.get(m.group(3), 0) + 1
            with open(out, "w") as f:
                json.dump(calls, f, indent=1)
            result["strace_calls"] = calls
            result["strace_lines"] = len(lines)
            result["strace_first_lines"] = lines[:12]
    finally:
        rc = b.stop()
    result["daemon_exit"] = rc
    return result


# ---- summary -------------------------------------------------------------------------------


def once(check):
    """The exactly-once verdict in a summary row (results from before the check say so)."""
    if check is None:
        return "not checked"
    return "OK" if check["ok"] else check_text(check)


def failed_checks(result):
    """The exactly-once checks of a result that failed, as (where, check)."""
    out = []
    if result.get("check") and not result["check"]["ok"]:
        out.append((result["bench"], result["check"]))
    for k, c in (result.get("checks") or {}).items():
        if c and not c["ok"]:
            out.append((f"{result['bench']} {k}", c))
    if result.get("sse_check") and not result["sse_check"]["ok"]:
        out.append((f"{result['bench']} event streams", result["sse_check"]))
    for w in ("first", "second"):
        wa = (result.get(w) or {}).get("wakes_after") or {}
        if wa.get("check") and not wa["check"]["ok"]:
            out.append((f"{result['bench']} {w} start, wakes after", wa["check"]))
    return out


def cmd_summary(args):
    rows = []
    loaded = []
    for path in args.results:
        try:
            with open(path) as f:
                loaded.append(json.load(f))
        except (FileNotFoundError, ValueError):
            continue
    order = {"latency": 0, "wakecli": 1, "burst": 2, "floor": 2.5, "startup": 3, "idle": 4}
    labels = {"default": 0, "nosync": 1, "strace": 3}
    loaded.sort(key=lambda r: (order.get(r["bench"], 9), labels.get(r.get("label"), 2), r.get("agents", 0)))
    for r in loaded:
        k = r["bench"]
        if k == "latency" and r.get("syscalls_per_wake"):
            sc = r["syscalls_per_wake"]
            top = ", ".join(f"{n} {sc[n]:g}" for n in ("fsync", "fdatasync", "renameat", "rename", "openat", "read", "statx", "getdents64") if n in sc)
            rows.append((f"syscalls per wake (strace -f -c, {r['wakes']} wakes)",
                         f"{top}; all: {sum(sc.values()):.0f} (one wake = begin + run + end); "
                         f"exactly once: {once(r.get('check'))}"))
        elif k == "latency":
            l = r["latency_ms"]
            bd = r["breakdown_ms"]["rename_to_session_started_log"]
            fl = r.get("flood")
            flooded = ""
            if fl:
                ph = "; ".join(f"{k.replace('_', ' ')}: {v['wakes']} wakes"
                               + (f", p50 {v['latency_ms']['p50']:.2f} p99 {v['latency_ms']['p99']:.2f} "
                                  f"max {v['latency_ms']['max']:.2f}" if v["latency_ms"] else "")
                               for k, v in fl.get("phases", {}).items() if v["wakes"])
                flooded = (f"; flood ({fl.get('when', 'during')}) made in {fl.get('made_s', '?')} s"
                           + (f", READY {fl['ready_ms']} ms after the start" if "ready_ms" in fl else "")
                           + f", requests drained {fl['drained_after_last_wake_s']} s after the last wake, "
                           f"{fl['sessions_of_flooded_agent']} session(s) of the flooded agent, "
                           f"SIGTERM->exit {fl['sigterm_to_exit_s']} s; {ph}")
            rows.append((f"wake latency ({r['label']}, {r['wakes']} wakes, {r['agents']} agents)",
                         f"p50 {l['p50']:.2f} ms, p90 {l['p90']:.2f}, p99 {l['p99']:.2f}, max {l['max']:.2f}; "
                         f">20 ms: {r['over_20ms']}; rename->'started' log p50 {bd['p50'] if bd else '?'} ms; "
                         f"daemon CPU {r['daemon_cpu_ms_per_wake']} ms/wake"
                         + (f" (loop thread {r['daemon_loop_cpu_ms_per_wake']})" if "daemon_loop_cpu_ms_per_wake" in r else "")
                         + f"; exactly once: {once(r.get('check'))}"
                         + flooded))
        elif k == "paired":
            def side(v):
                return f"p50 {v['p50']:.2f} p99 {v['p99']:.2f} max {v['max']:.2f}" if v else "-"

            def ratio(x):
                return f"{x['ratio']:.2f} [{x['ci95'][0]:.2f}, {x['ci95'][1]:.2f}]" if x else "-"

            ph = "; ".join(f"{n.replace('_', ' ')} ({v['wakes']} pairs): clean {side(v['clean_ms'])}, "
                           f"flooded {side(v['flooded_ms'])}; flooded/clean p50 {ratio(v['p50'])}, "
                           f"p99 {ratio(v['p99'])}"
                           for n, v in r["phases"].items() if v["wakes"])
            cpu = "; ".join(f"{n} daemon CPU {c['daemon_ms']} ms/wake (loop {c['loop_ms']})"
                            for n, c in r.get("cpu_per_wake", {}).items())
            rows.append((f"flood, paired ({r['files_each']} requests + {r['files_each']} junk; "
                         f"{'pinned' if r.get('pinned') else 'unpinned'}; {r['wakes']} wakes each)",
                         f"{ph}; {cpu}; load {' '.join(r.get('loadavg_before', []))}; exactly once: "
                         + ", ".join(f"{n} {once(c)}" for n, c in r["checks"].items())))
        elif k == "web":
            def side(v):
                return f"p50 {v['p50']:.2f} p99 {v['p99']:.2f} max {v['max']:.2f}" if v else "-"

            def ratio(x):
                return f"{x['ratio']:.2f} [{x['ci95'][0]:.2f}, {x['ci95'][1]:.2f}]" if x else "-"

            l, r2 = r["latency_ms"], r["sse_over_none"]
            cpu = ", ".join(f"{n} {c} ms" for n, c in r.get("cpu_per_wake_ms", {}).items())
            cpu += "; idle daemon CPU " + ", ".join(f"{n} {c} ms/s" for n, c in r.get("idle_cpu_ms_per_s", {}).items())
            rows.append((f"wake latency, {r['clients']} SSE clients vs none, paired ({r['wakes']} wakes each)",
                         f"none {side(l['none'])}; sse {side(l['sse'])}; sse/none p50 {ratio(r2['p50'])}, "
                         f"p99 {ratio(r2['p99'])}; daemon CPU/wake {cpu}; streams: {check_text(r['sse_check'])}; "
                         f"exactly once: " + ", ".join(f"{n} {once(c)}" for n, c in r["checks"].items())))
        elif k == "wakecli":
            rows.append((f"agent-state wake --wait ({r['wakes']})",
                         f"CLI wall p50 {r['cli_wall_ms']['p50']:.1f} ms, p99 {r['cli_wall_ms']['p99']:.1f}; "
                         f"CLI start->agent p50 {r['cli_start_to_agent_main_ms']['p50']:.1f} ms, "
                         f"p99 {r['cli_start_to_agent_main_ms']['p99']:.1f}"))
        elif k == "burst":
            c = r["check"]
            rows.append((f"burst {r['messages']} msgs / {r['agents']} agents, max_concurrent {r['max_concurrent']}",
                         f"{r['msgs_per_s']} msgs/s end to end ({r['first_rename_to_last_processed_s']} s; renames "
                         f"{r['rename_s']} s); {r['sessions']} sessions; exactly once: {check_text(c)}"
                         f"{' TIMED OUT' if r['timed_out'] else ''}; daemon CPU {r['daemon_cpu_s']} s, "
                         f"VmHWM {r['daemon_VmHWM_kib'] / 1024:.1f} MiB"))
        elif k == "floor":
            rows.append((f"burst floor, {r['messages']} msgs / {r['agents']} agents, no daemon (floor.c)",
                         "; ".join(f"{x['workers']} worker(s): {x['msgs_per_s']:.0f} msgs/s ({x['seconds']} s, "
                                   f"sender alone {x['sender_seconds']} s)" for x in r["runs"])))
        elif k == "startup":
            for w in ("first", "second"):
                s = r[w]
                extra = ""
                if s.get("wakes_after"):
                    wa = s["wakes_after"]
                    extra = (f"; {wa['n']} wakes after: p50 {wa['p50']:.2f} ms, p99 {wa['p99']:.2f}, "
                             f"exactly once: {once(wa.get('check'))}")
                if s.get("reload_ms") is not None:
                    extra += f"; SIGHUP reload: READY again in {s['reload_ms']:.0f} ms"
                rows.append((f"start-up, {r['agents']} agents, {w} start",
                             f"READY in {s['ready_ms']:.0f} ms (CPU {s['cpu_s']} s); VmRSS "
                             f"{s['mem_settled']['VmRSS_kib'] / 1024:.1f} MiB, VmHWM "
                             f"{s['mem_settled']['VmHWM_kib'] / 1024:.1f} MiB{extra}"))
        elif k == "idle":
            sc = r.get("strace_calls")
            st = ""
            if sc is not None:
                st = "; strace: " + (", ".join(f"{k} {v}" for k, v in sorted(sc.items())) or "no syscalls")
            rows.append((f"idle, {r['agents']} agents, {r['seconds']} s",
                         f"CPU {r['cpu_s'] * 1000:.0f} ms; context switches (all threads) {r['wakeups']}{st}"))
    w = max((len(a) for a, _ in rows), default=10)
    busy = [f"{r['bench']}{'/' + r['label'] if r.get('label') else ''}{'/' + str(r.get('agents')) if r['bench'] == 'startup' else ''}"
            f" ({r['system_busy']['before']:.0%})"
            for r in loaded if (r.get("system_busy") or {}).get("before") and r["system_busy"]["before"] >= 0.2]
    if busy:
        print("\nWARNING: the machine was busy (other processes) when these started: " + ", ".join(busy))
    print()
    print(f"{'benchmark'.ljust(w)} | result")
    print(f"{'-' * w}-|-{'-' * 60}")
    for a, b in rows:
        print(f"{a.ljust(w)} | {b}")


def cmd_table(args):
    """The issue's benchmark table from the JSON files of one run (bench/table.sh):
    each figure beside its floor (what it is compared with, measured in the same
    run), the ratio of the two, the target and whether it is met. CPU figures
    (the daemon's user+sys per wake, from /proc/PID/stat before and after) are
    printed beside the wall times: a busy machine inflates the wall time, much
    less the CPU a wake costs. QUICK=1 (small sizes): the targets are for the
    full sizes, so none is judged."""
    res = {}
    for path in args.results:
        try:
            with open(path) as f:
                r = json.load(f)
        except (FileNotFoundError, ValueError):
            continue
        if "ratio_median" in r:
            res["hooks"] = r
        elif r.get("bench") == "latency" and r.get("label") == "default":
            res["latency"] = r
        elif r.get("bench") == "burst":
            res["burst"] = r
        elif r.get("bench") == "floor":
            res["floor"] = r
        elif r.get("bench") == "startup":
            res.setdefault("startup", {})[r["agents"]] = r
    quick = os.environ.get("QUICK") == "1"
    missing = "(not run)"
    rows = []  # (figure, measured, floor, ratio, target)

    def judged(ok, target):
        if ok is None:
            return target
        if quick:
            return f"{target} (QUICK sizes: not judged)"
        return f"{target}: {'met' if ok else 'NOT met'}"

    def cpu(d, key="daemon_cpu_ms_per_wake"):
        v = (d or {}).get(key)
        return f"; daemon CPU {v:.2f} ms/wake" if v is not None else ""

    l = res.get("latency")
    if l:
        p99 = l["latency_ms"]["p99"]
        rows.append(("wake latency, rename -> agent running, p50 / p99",
                     f"{l['latency_ms']['p50']:.1f} / {p99:.1f} ms ({l['wakes']} wakes, {l['agents']} agents"
                     f"{cpu(l)}; exactly once {once(l.get('check'))})",
                     "-", "-", judged(p99 < 5, "p99 < 5 ms")))
    else:
        rows.append(("wake latency, rename -> agent running, p50 / p99", missing, "-", "-", "p99 < 5 ms"))
    b = res.get("burst")
    fl = res.get("floor")
    ratio = b["msgs_per_s"] / fl["best_msgs_per_s"] if b and fl and b.get("msgs_per_s") else None
    rows.append((f"burst, {b['messages'] if b else '?'} messages / {b['agents'] if b else '?'} agents",
                 (f"{b['msgs_per_s'] / 1000:.1f}k msg/s (daemon CPU {b['daemon_cpu_s'] * 1e6 / b['messages']:.0f} us/msg;"
                  f" exactly once {once(b['check'])})") if b and b.get("msgs_per_s") else missing,
                 (f"{fl['best_msgs_per_s'] / 1000:.1f}k msg/s: floor.c, no daemon ("
                  + ", ".join(f"{x['workers']} worker(s) {x['msgs_per_s'] / 1000:.1f}k" for x in fl["runs"]) + ")")
                 if fl else missing,
                 f"{ratio:.2f}" if ratio is not None else "-",
                 judged(None if ratio is None else ratio >= 0.8, ">= 0.80 of the floor")))
    st = res.get("startup", {})
    big = st[max(st)] if st else None
    small = st[min(st)] if len(st) > 1 else None
    n = f"{big['agents']} agents" if big else "? agents"
    if big:
        fi, sec = big["first"], big["second"]
        ff = big.get("first_start_floor")
        rows.append((f"first start, {n} (bootstrap of every agent)",
                     f"{fi['ready_ms'] / 1000:.1f} s (daemon CPU {fi.get('cpu_s', float('nan')):.1f} s)",
                     (f"{ff['seconds']:.1f} s: its {ff['dirs'] + ff['files']} files and directories made by a script"
                      f" (its CPU {ff['cpu_user_s'] + ff['cpu_sys_s']:.1f} s)") if ff else "(not measured)",
                     f"{fi['ready_ms'] / 1000 / ff['seconds']:.2f}" if ff and ff["seconds"] > 0 else "-",
                     judged(fi["ready_ms"] < 10000, "< 10 s")))
        rows.append((f"start-up, {n}, second start",
                     f"{sec['ready_ms'] / 1000:.2f} s (daemon CPU {sec.get('cpu_s', float('nan')):.2f} s)", "-", "-",
                     judged(sec["ready_ms"] < 1000, "< 1 s")))
        rss = sec["mem_settled"]["VmRSS_kib"] / 1024
        rows.append((f"RSS, {n}", f"{rss:.0f} MiB at READY + 2 s"
                     + (f", {sec['mem_after_wakes']['VmRSS_kib'] / 1024:.0f} MiB after the wakes"
                        if sec.get("mem_after_wakes") else ""), "-", "-", judged(rss < 64, "< 64 MiB")))
        rows.append((f"SIGHUP reload, {n}", f"{sec['reload_ms'] / 1000:.2f} s", "-", "-",
                     judged(sec["reload_ms"] < 500, "< 0.5 s")))
        wa = sec.get("wakes_after")
        swa = small["second"].get("wakes_after") if small else None
        ratio = wa["p99"] / swa["p99"] if wa and swa and swa["p99"] > 0 else None
        cratio = (wa["daemon_cpu_ms_per_wake"] / swa["daemon_cpu_ms_per_wake"]
                  if wa and swa and swa.get("daemon_cpu_ms_per_wake") else None)
        rows.append((f"wakes after start at {n}, p50 / p99",
                     (f"{wa['p50']:.1f} / {wa['p99']:.1f} ms{cpu(wa)} ({wa['n']} wakes;"
                      f" exactly once {once(wa.get('check'))})") if wa else missing,
                     (f"{swa['p50']:.1f} / {swa['p99']:.1f} ms{cpu(swa)}: the same at {small['agents']} agents")
                     if swa else missing,
                     (f"p99 {ratio:.2f}" + (f", CPU {cratio:.2f}" if cratio is not None else ""))
                     if ratio is not None else "-",
                     judged(None if ratio is None else ratio <= 1.2 and (cratio or 0) <= 1.2,
                            "p99 and CPU <= 1.2x")))
    else:
        for k in ("first start", "start-up, second start", "RSS", "SIGHUP reload", "wakes after start"):
            rows.append((k, missing, "-", "-", "-"))
    h = res.get("hooks")
    fm = (h or {}).get("floor_median_ms") or {}
    starts = fm.get("rust: 2x agent-state --version")
    syncs = (h or {}).get("syncs_ms")
    if h:
        rust = h["median_ms"]["rust"]
        cpu_ms = (h.get("cpu_ms") or {}).get("rust")
        floor = starts + syncs if starts is not None and syncs is not None else None
        ratio = rust / floor if floor else None
        rows.append(("hook pair `session begin` + `end`",
                     f"{rust:.2f} ms" + (f" (CPU {cpu_ms:.2f} ms)" if cpu_ms is not None else "")
                     + f"; Python {h['median_ms']['python']:.1f} ms ({h['ratio_median']['python']:.1f}x),"
                     f" precompiled {h['ratio_median']['python-pyc']:.1f}x; medians of {h['pairs']} pairs;"
                     f" same files: {'yes' if h['equivalent'] else 'NO'}",
                     (f"{floor:.2f} ms: two starts {starts:.2f} + the syncs {syncs:.2f}") if floor else "(not measured)",
                     f"{ratio:.2f}" if ratio else "-",
                     judged(None if ratio is None else ratio <= 1.3, "<= 1.3x the floor")))
    else:
        rows.append(("hook pair `session begin` + `end`", missing, "-", "-", "<= 1.3x the floor"))
    head = ("figure", "measured", "floor", "ratio", "target")
    w = [max(len(str(r[i])) for r in rows + [head]) for i in range(5)]
    print("| " + " | ".join(head[i].ljust(w[i]) for i in range(5)) + " |")
    print("|" + "|".join("-" * (w[i] + 2) for i in range(5)) + "|")
    for r in rows:
        print("| " + " | ".join(str(r[i]).ljust(w[i]) for i in range(5)) + " |")


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--bin", default="target/release/agent-state")
    p.add_argument("--fake-agent", default="fake_agent")
    p.add_argument("--work", default="/var/tmp")
    p.add_argument("--pids")
    p.add_argument("--start-timeout", type=float, default=900)
    p.add_argument("--max-seconds", type=int, default=3600,
                   help="fail the benchmark (and stop its daemon) if it has not completed after this long; 0 = no bound")
    p.add_argument("--quiet-wait", type=float, default=0,
                   help="wait up to this many seconds for the machine to be idle before measuring")
    sub = p.add_subparsers(dest="cmd", required=True)

    s = sub.add_parser("latency")
    s.add_argument("--wakes", type=int, default=1000)
    s.add_argument("--warmup", type=int, default=20)
    s.add_argument("--agents", type=int, default=100)
    s.add_argument("--gap", type=float, default=0.02)
    s.add_argument("--preload")
    s.add_argument("--strace-counts", type=int, default=0)
    s.add_argument("--env", action="append", help="K=V for the daemon's environment (e.g. SLOWSYNC_US=1000)")
    s.add_argument("--label")
    s.add_argument("--name")
    s.add_argument("--flood", type=int, default=0,
                   help="make this many wake requests and as many junk files in another agent's inbox "
                        "(see --flood-when)")
    s.add_argument("--flood-when", choices=("during", "before"), default="during",
                   help="during: while the wakes are measured; before: before the daemon starts "
                        "(the steady state: the inbox holds them all when the measurement starts)")
    s.add_argument("--perf", type=int, default=0,
                   help="1: perf record --call-graph dwarf of the daemon during the measured wakes "
                        "(perf-latency.data, keep it with KEEP=1)")

    s = sub.add_parser("paired", help="flooded vs clean daemon at once, wakes alternating (issue 20)")
    s.add_argument("--wakes", type=int, default=1000)
    s.add_argument("--warmup", type=int, default=20)
    s.add_argument("--agents", type=int, default=100)
    s.add_argument("--gap", type=float, default=0.02)
    s.add_argument("--flood", type=int, default=100000)
    s.add_argument("--pin", type=int, default=0, help="1: taskset the clean daemon to CPU 0, the flooded one to CPU 1")
    s.add_argument("--label")
    s.add_argument("--name")

    s = sub.add_parser("web", help="wake latency with N SSE clients on the web view vs none, paired (issue 25)")
    s.add_argument("--wakes", type=int, default=1000)
    s.add_argument("--warmup", type=int, default=20)
    s.add_argument("--agents", type=int, default=100)
    s.add_argument("--gap", type=float, default=0.02)
    s.add_argument("--clients", type=int, default=20)
    s.add_argument("--idle", type=float, default=10, help="seconds of idle CPU measured with the streams open")
    s.add_argument("--label")
    s.add_argument("--name")

    s = sub.add_parser("wakecli")
    s.add_argument("--wakes", type=int, default=200)
    s.add_argument("--warmup", type=int, default=5)
    s.add_argument("--agents", type=int, default=100)
    s.add_argument("--gap", type=float, default=0.02)

    s = sub.add_parser("burst")
    s.add_argument("--agents", type=int, default=100)
    s.add_argument("--per-agent", type=int, default=1000)
    s.add_argument("--max-concurrent", type=int, default=4)
    s.add_argument("--timeout", type=float, default=600)
    s.add_argument("--poll", type=float, default=0.5)
    s.add_argument("--perf", type=int, default=0)
    s.add_argument("--preload", help="LD_PRELOAD for the daemon (nosync.so: what the syncs cost)")
    s.add_argument("--strace", type=int, default=0, help="1: strace -f -c of the daemon (calls per message); 2: every call, in strace.txt")

    s = sub.add_parser("floor")
    s.add_argument("--agents", type=int, default=100)
    s.add_argument("--per-agent", type=int, default=1000)
    s.add_argument("--workers", default="1,2")
    s.add_argument("--floor", required=True, help="floor.c, compiled")
    s.add_argument("--timeout", type=float, default=600)

    s = sub.add_parser("startup")
    s.add_argument("--agents", type=int, required=True)
    s.add_argument("--settle", type=float, default=2.0)
    s.add_argument("--wakes-after", type=int, default=0)
    s.add_argument("--perf", type=int, default=0)

    s = sub.add_parser("idle")
    s.add_argument("--agents", type=int, default=100)
    s.add_argument("--seconds", type=int, default=60)
    s.add_argument("--settle", type=float, default=5.0)
    s.add_argument("--strace", type=int, default=1)

    s = sub.add_parser("summary")
    s.add_argument("results", nargs="*")

    s = sub.add_parser("table")
    s.add_argument("results", nargs="*")

    for sp in sub.choices.values():
        if sp.prog.endswith(("summary", "table")):
            continue
        sp.add_argument("--out", required=True)

    args = p.parse_args()
    # SIGTERM (run.sh's trap) unwinds through the `finally`s, which stop the daemon.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    if args.cmd == "summary":
        return cmd_summary(args)
    if args.cmd == "table":
        return cmd_table(args)
    fn = {"latency": cmd_latency, "paired": cmd_paired, "web": cmd_web, "wakecli": cmd_wakecli, "burst": cmd_burst, "floor": cmd_floor,
          "startup": cmd_startup, "idle": cmd_idle}[args.cmd]
    name = getattr(args, "name", None) or args.cmd
    # Every wait in here has its own bound; this one bounds the whole benchmark
    # (quiet wait included), so that nothing can hang a CI run.
    if args.max_seconds > 0:
        def overtime(*_):
            raise BenchFailed(f"did not complete within --max-seconds ({args.max_seconds} s)")

        signal.signal(signal.SIGALRM, overtime)
        signal.alarm(args.max_seconds)
    try:
        result = measure(args, fn)
    except BenchFailed as e:
        signal.alarm(0)
        log(f"bench.py {name}: FAILED: {e}")
        bench_dir = os.path.join(os.path.abspath(args.work), name)
        logs = sorted(n for n in dir_names(bench_dir) if n.startswith("daemon") and n.endswith(".log"))
        if logs:
            log(f"  last lines of {os.path.join(bench_dir, logs[-1])}:")
            for line in tail(os.path.join(bench_dir, logs[-1])):
                log("  | " + line.rstrip())
        sys.exit(1)
    signal.alarm(0)
    with open(args.out, "w") as f:
        json.dump(result, f, indent=1)
    print(json.dumps(result, indent=1))
    bad = failed_checks(result)
    for where, c in bad:
        log(f"bench.py {name}: FAILED: exactly-once check of {where}: {check_text(c)}; see {args.out}")
    if bad:
        sys.exit(1)


def measure(args, fn):
    waited, busy0 = (0, None)
    if args.quiet_wait > 0:
        waited, busy0 = wait_quiet(args.quiet_wait)
        if busy0 is not None and busy0 >= 0.2:
            log(f"  the machine is still busy ({busy0:.0%} CPU) after waiting {waited:.0f} s; measuring anyway")
    load0 = open("/proc/loadavg").read().split()[:3]
    t0 = cpu_times()
    result = fn(args)
    result["system_busy"] = {"waited_for_quiet_s": waited, "before": busy0, "during": busy_since(t0),
                             "note": "fraction of all CPUs busy (any process, this benchmark included)"}
    result["loadavg_before"] = load0
    result["loadavg_after"] = open("/proc/loadavg").read().split()[:3]
    result["machine"] = {"cpus": os.cpu_count(), "kernel": os.uname().release}
    return result


if __name__ == "__main__":
    main()
