#!/usr/bin/env python3
"""Python baseline for the `agent-state session begin|end` hooks (benchmark only).

    baseline.py --config CFG session begin AGENT [--type T] [--branch B] [--model M]
                [--timeout DUR] [--research-question Q] [--belief-targeted X]
                [--disconfirmation-target X] [--sources-expected N]
    baseline.py --config CFG session end AGENT [--session ID] [--sources-archived N]
                [--branch B] [--summary S] [--next-priority P] [--handoff-notes H]

Does on disk what crates/store/src/hooks.rs begin()/end() do on the path the benchmark takes
(no session running at begin, a running one at end), with the same files and the
same JSON shapes:

* the whole hook runs under flock(LOCK_EX) on {agent}/.lock;
* begin takes the session's instance id (rio-001, rio-002, ...): under
  flock(LOCK_EX) on {root}/.daemon/counters.lock (created 0600), the agent's
  counter in {root}/.daemon/counters.json is incremented (a missing one starts
  above the highest instance in the agent's journal) and written back like the
  other state files (crates/store/src/state/counters.rs next_instance);
* journal.jsonl: one line per event, one write(2) on an O_APPEND fd, fdatasync
  (and a directory fsync when the journal was empty), a leading newline if the
  last line is torn (crates/store/src/state/journal.rs append_lines);
* session.json, report.json, metrics.json, counters.json: read, modify, then
  temp file (O_EXCL, 0600) + write + fchmod 0644 + fsync + rename + fsync of
  the directory (crates/store/src/state/atomic.rs write_file). session.json and report.json
  are staged (temp file written and fsynced) before the journal line and
  renamed in after it (crates/store/src/state/atomic.rs Staged, crates/store/src/hooks.rs begin and
  finish_with);
* begin lists inbox/ for messages to claim and moves them to
  inbox/.claimed/{session}/; end lists the claimed ones before the journal
  line, moves them to inbox/processed/ after it and removes the claimed
  directory (crates/store/src/inbox.rs claim/claimed/acknowledge);
* the owner lock: begin creates sessions/{id}.owner (0644), takes flock(LOCK_EX)
  on it before the journal line and hands it to a detached keeper that holds
  it until the script exits or the lock file goes; end removes the file after
  its renames (crates/store/src/owner.rs acquire/spawn_keeper/keep/release). Rust's keeper
  is an exec of `agent-state session keep`; this one is a fork;
* metrics.json: lifetime counters incremented for the event, and a session's
  end is counted once (counted_session); at end the rolling 30-day window is
  recomputed by reading the whole journal; a plain session start changes no
  counter and the file is read but not rewritten (crates/store/src/state/metrics.rs apply).

Not implemented (never reached by the benchmark): joining a running session,
recovering a stale one, message validation/rejection/expiry, tasks from task
messages, --pr/--tokens-used/--cost-usd/--outcome, setting aside a corrupt
counters.json. A running session at begin is refused with exit 75.
"""

import fcntl
import json
import math
import os
import re
import select
import sys
import tomllib
from datetime import datetime, timedelta, timezone

STATE_FILE_MODE = 0o644
ROLLING_WINDOW = timedelta(days=30)

SESSION_KEYS = [
    "agent", "session_id", "started_at", "ended_at", "type", "domain", "branch",
    "status", "model", "timeout_seconds", "research_question", "belief_targeted",
    "disconfirmation_target", "sources_archived", "sources_expected",
    "tokens_used", "cost_usd", "errors", "handoff_notes",
]
SESSION_OPTIONAL = ["pr_number", "reason", "owner_pid", "owner_start", "instance", "messages"]
REPORT_KEYS = ["agent", "updated_at", "status", "summary", "current_task",
               "last_session", "blocked_by", "next_priority"]
REPORT_OPTIONAL = ["current_session", "instance", "next_wake_at", "error", "lifecycle"]
LAST_SESSION_KEYS = ["id", "started_at", "ended_at", "outcome", "sources_archived",
                     "branch", "pr_number"]
LIFETIME_KEYS = [
    "sessions_total", "sessions_completed", "sessions_timeout", "sessions_error",
    "sources_archived", "claims_proposed", "claims_accepted", "claims_challenged",
    "claims_rejected", "disconfirmation_attempts", "disconfirmation_hits",
    "cross_agent_flags_sent", "cross_agent_flags_received",
]
ROLLING_KEYS = ["sessions", "sources_archived", "claims_proposed",
                "acceptance_rate", "avg_sources_per_session", "error_rate"]
STATUS_FOR_TYPE = {"research": "researching", "ad-hoc": "researching",
                   "extract": "extracting", "evaluate": "evaluating"}


class Fail(Exception):
    def __init__(self, message, code):
        super().__init__(message)
        self.code = code


# ---- time ------------------------------------------------------------------

def fmt_ts(t):
    return t.strftime("%Y-%m-%dT%H:%M:%SZ")


def parse_ts(text):
    t = datetime.fromisoformat(text)
    if t.tzinfo is None:
        raise ValueError(text)
    return t.astimezone(timezone.utc).replace(microsecond=0)


def parse_duration(text):
    t = text.strip()
    if t.isdigit():
        return int(t)
    units = {"s": 1, "sec": 1, "m": 60, "min": 60, "h": 3600, "hr": 3600, "d": 86400}
    parts = re.findall(r"(\d+)\s*([a-z]+)", t)
    if not parts or re.sub(r"(\d+)\s*([a-z]+)|\s", "", t):
        return None
    total = 0
    for n, u in parts:
        if u not in units:
            return None
        total += int(n) * units[u]
    return total or None


# ---- config ----------------------------------------------------------------

def load_agent(config_path, name):
    with open(config_path, "rb") as f:
        cfg = tomllib.load(f)
    root = cfg.get("state_root")
    if not isinstance(root, str) or not root:
        raise Fail(f"{config_path}: state_root is missing", 78)
    root = os.path.join(os.path.dirname(os.path.abspath(config_path)), root)
    defaults = cfg.get("defaults", {})
    for a in cfg.get("agent", []):
        if a.get("name") == name:
            if a.get("kind") == "human":
                raise Fail(f"{name} is a human mailbox (kind = \"human\"): it has no sessions", 64)
            merged = {**defaults, **a}
            timeout = parse_duration(str(merged.get("timeout", "90m")))
            if timeout is None:
                raise Fail(f"{config_path}: bad timeout", 78)
            return root, os.path.join(root, name), {
                "domain": a.get("domain"),
                "model": merged.get("model", "sonnet"),
                "timeout": timeout,
                "session_type": merged.get("session_type", "research"),
            }
    raise Fail(f"unknown agent {name!r}", 67)


# ---- files -----------------------------------------------------------------

def open_lock_file(path, mode):
    """crates/store/src/state/lock.rs open_lock_file: read-only, created with `mode` if missing."""
    try:
        return os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        pass
    os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC, mode))
    return os.open(path, os.O_RDONLY | os.O_CLOEXEC)


def lock(agent_dir):
    if not os.path.isdir(agent_dir):
        raise Fail(f"{agent_dir} is not bootstrapped", 66)
    fd = open_lock_file(os.path.join(agent_dir, ".lock"), 0o600)
    st = os.fstat(fd)
    if st.st_mode & 0o777 != 0o600 and st.st_uid == os.geteuid():
        os.fchmod(fd, 0o600)  # only the service user (and root) may hold it
    fcntl.flock(fd, fcntl.LOCK_EX)
    return fd  # released when the process exits


def read_json(path):
    try:
        with open(path, "rb") as f:
            data = f.read()
    except FileNotFoundError:
        return None
    try:
        return json.loads(data)
    except ValueError as e:
        raise Fail(f"{path} is corrupt: {e} (the baseline does not rebuild it)", 65)


def fsync_dir(path):
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_all(fd, data):
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def stage_file(path, data, mode=STATE_FILE_MODE):
    """temp file (O_EXCL) → write → fchmod → fsync; commit() renames it in."""
    d, name = os.path.split(path)
    while True:
        tmp = os.path.join(d, f".{name}.{os.urandom(4).hex()}.tmp")
        try:
            fd = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
            break
        except FileExistsError:
            continue
    try:
        write_all(fd, data)
        os.fchmod(fd, mode)
        os.fsync(fd)
    except BaseException:
        os.close(fd)
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    os.close(fd)
    return tmp, path


def commit(staged):
    """rename → fsync(dir) (crates/store/src/state/atomic.rs Staged::commit)."""
    tmp, path = staged
    try:
        os.rename(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    fsync_dir(os.path.dirname(path))


def commit_all(staged):
    """rename each → fsync each directory once (atomic.rs commit_all)."""
    dirs = []
    for tmp, path in staged:
        try:
            os.rename(tmp, path)
        except BaseException:
            try:
                os.unlink(tmp)
            except OSError:
                pass
            raise
        d = os.path.dirname(path)
        if d not in dirs:
            dirs.append(d)
    for d in dirs:
        fsync_dir(d)


def write_file(path, data, mode=STATE_FILE_MODE):
    """temp file (O_EXCL) → write → fchmod → fsync → rename → fsync(dir)."""
    commit(stage_file(path, data, mode))


def json_bytes(value):
    return (json.dumps(value, indent=2, ensure_ascii=False) + "\n").encode()


def write_json(path, value):
    write_file(path, json_bytes(value))


def stage_json(path, value):
    return stage_file(path, json_bytes(value))


def journal_append(agent_dir, entry):
    path = os.path.join(agent_dir, "journal.jsonl")
    line = (json.dumps(entry, separators=(",", ":"), ensure_ascii=False) + "\n").encode()
    fd = os.open(path, os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o644)
    try:
        size = os.fstat(fd).st_size
        if size > 0 and os.pread(fd, 1, size - 1) != b"\n":
            line = b"\n" + line
        write_all(fd, line)
        os.fdatasync(fd)
    finally:
        os.close(fd)
    if size == 0:
        fsync_dir(agent_dir)


def read_journal(agent_dir):
    entries = []
    try:
        f = open(os.path.join(agent_dir, "journal.jsonl"), "rb")
    except FileNotFoundError:
        return entries
    with f:
        for raw in f:
            text = raw.decode("utf-8", "replace").rstrip("\r\n")
            if not text.strip():
                continue
            try:
                e = json.loads(text)
                if isinstance(e, dict):
                    e["_ts"] = parse_ts(e["ts"])
                    entries.append(e)
            except (ValueError, KeyError, TypeError):
                pass  # torn or unreadable: skipped, as the Rust reader does
    return entries


# ---- documents in the Rust field order -----------------------------------------

def ordered(doc, keys, optional=(), defaults=None):
    doc = doc if isinstance(doc, dict) else {}
    defaults = defaults or {}
    out = {k: doc.get(k, defaults.get(k)) for k in keys}
    for k in optional:
        if doc.get(k) not in (None, []):
            out[k] = doc[k]
    for k, v in doc.items():
        if k not in out and k not in optional:
            out[k] = v
    return out


def session_doc(s):
    return ordered(s, SESSION_KEYS, SESSION_OPTIONAL, {"type": "research", "errors": []})


def report_doc(r):
    r = ordered(r, REPORT_KEYS, REPORT_OPTIONAL, {"status": "idle"})
    if isinstance(r["last_session"], dict):
        r["last_session"] = ordered(r["last_session"], LAST_SESSION_KEYS, ["reason"])
    return r


def metrics_doc(m):
    m = ordered(m, ["agent", "updated_at", "lifetime", "rolling_30d"], ["counted_session"])
    m["lifetime"] = ordered(m["lifetime"], LIFETIME_KEYS, defaults=dict.fromkeys(LIFETIME_KEYS, 0))
    m["rolling_30d"] = ordered(m["rolling_30d"], ROLLING_KEYS,
                               defaults={"sessions": 0, "sources_archived": 0, "claims_proposed": 0,
                                         "acceptance_rate": 0.0, "avg_sources_per_session": 0.0,
                                         "error_rate": 0.0})
    return m


# ---- metrics (crates/store/src/state/metrics.rs) -----------------------------------------

def count(lifetime, e):
    ev = e.get("event")
    if ev == "session_start" and e.get("disconfirmation_target") is not None:
        lifetime["disconfirmation_attempts"] += 1
    elif ev == "session_updated" and e.get("disconfirmation_target_added"):
        lifetime["disconfirmation_attempts"] += 1
    elif ev == "session_end":
        lifetime["sessions_total"] += 1
        lifetime["sessions_completed"] += 1
        lifetime["sources_archived"] += e.get("sources_archived") or 0
        lifetime["cross_agent_flags_received"] += e.get("flags_received", 0)
    elif ev == "timeout":
        lifetime["sessions_total"] += 1
        lifetime["sessions_timeout"] += 1
    elif ev == "error":
        lifetime["sessions_total"] += 1
        lifetime["sessions_error"] += 1
    elif ev == "record":
        for k in ("claims_proposed", "claims_accepted", "claims_challenged",
                  "claims_rejected", "disconfirmation_hits"):
            lifetime[k] += e.get(k, 0)
    elif ev == "message_sent" and e.get("type") == "flag":
        lifetime["cross_agent_flags_sent"] += 1


def ratio(a, b):
    return 0.0 if b == 0 else math.floor(a / b * 10000 + 0.5) / 10000


def rolling(entries, now):
    since = now - ROLLING_WINDOW
    ended, failed, sources, proposed, accepted = set(), set(), 0, 0, 0
    for e in entries:
        if not since <= e["_ts"] <= now:
            continue
        ev = e.get("event")
        if ev == "session_end":
            ended.add(e.get("session_id"))
            sources += e.get("sources_archived") or 0
        elif ev in ("timeout", "error"):
            ended.add(e.get("session_id"))
            failed.add(e.get("session_id"))
        elif ev == "record":
            proposed += e.get("claims_proposed", 0)
            accepted += e.get("claims_accepted", 0)
    return {"sessions": len(ended), "sources_archived": sources, "claims_proposed": proposed,
            "acceptance_rate": ratio(accepted, proposed),
            "avg_sources_per_session": ratio(sources, len(ended)),
            "error_rate": ratio(len(failed), len(ended))}


def apply_metrics(agent_dir, name, entry, now):
    staged = stage_metrics(agent_dir, name, entry, now)
    if staged is not None:
        commit(staged)


def stage_metrics(agent_dir, name, entry, now):
    """metrics.rs stage(): the new metrics.json staged, or None if unchanged."""
    path = os.path.join(agent_dir, "metrics.json")
    raw = read_json(path)
    m = metrics_doc(raw or {"agent": name})
    before = dict(m["lifetime"])
    m["agent"] = name
    ended = entry["session_id"] if entry["event"] in ("session_end", "error", "timeout") else None
    if ended is None or ended != m.get("counted_session"):  # an end is counted once
        count(m["lifetime"], entry)
    if ended is not None:
        m["counted_session"] = ended
    window_changes = entry["event"] in ("session_end", "error", "timeout", "record")
    if m["lifetime"] == before and not window_changes and raw is not None:
        return None  # a plain session start changes no counter: no write (as in Rust)
    if window_changes:
        fresh = rolling(read_journal(agent_dir), now)
        extra = {k: v for k, v in m["rolling_30d"].items() if k not in ROLLING_KEYS}
        m["rolling_30d"] = {**fresh, **extra}
    m["updated_at"] = fmt_ts(now)
    return stage_json(path, metrics_doc(m))


# ---- inbox (crates/store/src/inbox.rs, simplified: no validation) ------------------------

def claim(agent_dir, session_id):
    inbox = os.path.join(agent_dir, "inbox")
    try:
        names = sorted(n for n in os.listdir(inbox)
                       if not n.startswith(".") and n.endswith(".json") and len(n) > 5)
    except FileNotFoundError:
        return []
    if not names:
        return []
    claimed_dir = os.path.join(inbox, ".claimed", session_id)
    os.makedirs(claimed_dir, 0o2770, exist_ok=True)
    ids = []
    for n in names:
        msg = read_json(os.path.join(inbox, n)) or {}
        os.rename(os.path.join(inbox, n), os.path.join(claimed_dir, n))
        ids.append(msg.get("id") or n[:-5])
    fsync_dir(inbox)
    fsync_dir(claimed_dir)
    return ids


def claimed(agent_dir, session_id):
    """The session's claimed messages: [(file name, message)], not moved yet."""
    claimed_dir = os.path.join(agent_dir, "inbox", ".claimed", session_id)
    try:
        names = [n for n in os.listdir(claimed_dir)
                 if not n.startswith(".") and n.endswith(".json") and len(n) > 5]
    except FileNotFoundError:
        return []
    return [(n, read_json(os.path.join(claimed_dir, n)) or {}) for n in names]


def acknowledge(agent_dir, session_id, messages):
    """After the journal line: claimed messages → processed/, claimed dir removed."""
    inbox = os.path.join(agent_dir, "inbox")
    claimed_dir = os.path.join(inbox, ".claimed", session_id)
    processed_dir = os.path.join(inbox, "processed")
    if messages:
        os.makedirs(processed_dir, 0o2770, exist_ok=True)
    for n, _ in messages:
        os.rename(os.path.join(claimed_dir, n), os.path.join(processed_dir, n))
    if messages:
        fsync_dir(processed_dir)
        fsync_dir(claimed_dir)
    try:
        os.rmdir(claimed_dir)
        fsync_dir(os.path.join(inbox, ".claimed"))
    except OSError:
        pass


# ---- instance ids (crates/store/src/state/counters.rs next_instance) ----------------------

def highest_instance(agent_dir, name):
    """The highest `{name}-N` instance of the journal's session starts, else 0."""
    prefix, best = f"{name}-", 0
    for e in read_journal(agent_dir):
        inst = e.get("instance") if e.get("event") == "session_start" else None
        if isinstance(inst, str) and inst.startswith(prefix) and inst[len(prefix):].isdigit():
            best = max(best, int(inst[len(prefix):]))
    return best


def next_instance(root, agent_dir, name):
    d = os.path.join(root, ".daemon")
    if not os.path.isdir(d):
        os.makedirs(d, 0o750, exist_ok=True)
        os.chmod(d, 0o750)
    fd = open_lock_file(os.path.join(d, "counters.lock"), 0o600)
    st = os.fstat(fd)
    if st.st_mode & 0o777 != 0o600 and st.st_uid == os.geteuid():
        os.fchmod(fd, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        path = os.path.join(d, "counters.json")
        doc = read_json(path)
        doc = doc if isinstance(doc, dict) else {}
        # Seed 000's flat map (agent -> count); the nested shape earlier
        # versions wrote is read too and written back flat.
        counters, extra = {}, {}
        if isinstance(doc.get("counters"), dict):
            for k, v in doc.pop("counters").items():
                if isinstance(v, int) and not isinstance(v, bool) and v >= 0:
                    counters[k] = v
        for k, v in doc.items():
            if isinstance(v, int) and not isinstance(v, bool) and v >= 0:
                counters[k] = max(counters.get(k, 0), v)
            else:
                extra[k] = v
        n = counters.get(name) or highest_instance(agent_dir, name)
        counters[name] = n + 1
        # serde: the other keys in file order, then the counters sorted
        write_json(path, {**extra, **dict(sorted(counters.items()))})
    finally:
        os.close(fd)  # releases the lock
    return f"{name}-{n + 1:03}"


# ---- hooks -----------------------------------------------------------------

def new_session_id(agent_dir, last, now):
    base = now.strftime("%Y%m%d-%H%M%S")
    claimed_root = os.path.join(agent_dir, "inbox", ".claimed")

    def taken(i):
        return last == i or os.path.exists(os.path.join(claimed_root, i))

    if not taken(base) and not last.startswith(base + "-"):
        return base
    suffix = last[len(base) + 1:] if last.startswith(base + "-") else ""
    n = (int(suffix) if suffix.isdigit() else 1) + 1
    while taken(f"{base}-{n}"):
        n += 1
    return f"{base}-{n}"


def text(v):
    return v.strip() or None if v is not None else None


def proc_stat_field(pid, n):
    with open(f"/proc/{pid}/stat") as f:
        stat = f.read()
    return int(stat[stat.rindex(")") + 1:].split()[n])


def owner_pid():
    """crates/store/src/hooks.rs Owner::parent: the parent, walking up through forked
    subshells (same exe and cmdline) to the session script itself."""
    env = os.environ.get("AGENT_STATE_OWNER_PID")
    if env and env.strip().lstrip("-").isdigit():
        return int(env)
    pid = os.getppid()

    def same_program(a, b):
        try:
            ea, eb = os.readlink(f"/proc/{a}/exe"), os.readlink(f"/proc/{b}/exe")
            with open(f"/proc/{a}/cmdline", "rb") as fa, open(f"/proc/{b}/cmdline", "rb") as fb:
                return ea == eb and fa.read() == fb.read()
        except OSError:
            return False

    while True:
        try:
            up = proc_stat_field(pid, 1)
        except (OSError, ValueError, IndexError):
            break
        if up <= 1 or not same_program(pid, up):
            break
        pid = up
    return pid


def process_start(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            stat = f.read()
        return int(stat[stat.rindex(")") + 1:].split()[19])
    except (OSError, ValueError, IndexError):
        return None


def acquire_owner_lock(agent_dir, session_id, owner, start):
    """crates/store/src/owner.rs acquire: sessions/{id}.owner (0644, one name), flock(LOCK_EX|LOCK_NB),
    who holds it written in for people. Returns the fd, or None (Rust notes that and goes on)."""
    sessions = os.path.join(agent_dir, "sessions")
    try:
        os.mkdir(sessions, 0o750)
    except FileExistsError:
        pass
    path = os.path.join(sessions, f"{session_id}.owner")
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
    try:
        if os.fstat(fd).st_nlink != 1:
            raise OSError(f"{path} has more than one name (a hard link)")
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as e:
        os.close(fd)
        print(f"baseline: note: session {session_id} has no owner lock ({e})", file=sys.stderr)
        return None
    os.ftruncate(fd, 0)
    start_text = "null" if start is None else str(start)
    os.write(fd, f'{{"session_id":"{session_id}","owner_pid":{owner},"owner_start":{start_text}}}\n'.encode())
    return fd


def spawn_keeper(fd, owner, start):
    """crates/store/src/owner.rs spawn_keeper + keep: a detached process (no stdio, its own session)
    holds the owner lock until the owner exits (pidfd) or the session's end removes the
    lock file. Rust execs `agent-state session keep`; Python forks, its cheapest way."""
    if start is None:
        os.close(fd)
        return
    if os.fork():
        os.close(fd)  # the keeper shares the open file: its lock stays
        return
    try:
        # Like Rust's exec: the lock on fd 3, nothing else (the agent lock's fd
        # must not outlive this hook in the keeper).
        if fd != 3:
            os.dup2(fd, 3)
            fd = 3
        os.closerange(4, os.sysconf("SC_OPEN_MAX"))
        os.setsid()
        null = os.open("/dev/null", os.O_RDWR)
        for i in (0, 1, 2):
            os.dup2(null, i)
        if null > 2:
            os.close(null)
        os.chdir("/")
        try:
            pidfd = [os.pidfd_open(owner)]
        except OSError:
            pidfd = []
        # inotify is not in the standard library: the lock file is polled.
        while os.fstat(fd).st_nlink > 0 and process_start(owner) == start:
            if select.select(pidfd, [], [], 0.05)[0]:
                break
    finally:
        os._exit(0)


def release_owner_lock(agent_dir, session_id):
    """crates/store/src/owner.rs release: the session ended, its owner lock goes (a missing one is fine)."""
    try:
        os.unlink(os.path.join(agent_dir, "sessions", f"{session_id}.owner"))
    except FileNotFoundError:
        pass


def bad_count(errors, flag, raw, now):
    errors.append({"at": fmt_ts(now), "code": "BAD_ARGUMENT", "argument": flag, "value": raw,
                   "message": "not a whole number; the field was left unset"})


def begin(root, agent_dir, name, cfg, opts, now):
    lock(agent_dir)
    errors = []
    kind = text(opts.get("--type")) or cfg["session_type"]
    timeout = cfg["timeout"]
    if opts.get("--timeout") is not None:
        timeout = parse_duration(opts["--timeout"]) or timeout
    sources_expected = None
    if opts.get("--sources-expected") is not None:
        raw = opts["--sources-expected"]
        if raw.strip().isdigit():
            sources_expected = int(raw.strip())
        else:
            bad_count(errors, "--sources-expected", raw, now)

    path = os.path.join(agent_dir, "session.json")
    current = session_doc(read_json(path) or {"agent": name})
    if current["status"] == "running":
        raise Fail(f"{name}: session {current['session_id']} is running "
                   "(the baseline does not join or recover sessions)", 75)
    extra = {k: v for k, v in current.items() if k not in SESSION_KEYS and k not in SESSION_OPTIONAL}

    session_id = new_session_id(agent_dir, current["session_id"] or "", now)
    # A new session is a spawn: it gets an instance id (rio-047). Rust notes a
    # failure to take one and goes on without.
    try:
        instance = next_instance(root, agent_dir, name)
    except OSError as e:
        print(f"baseline: note: no instance id for this session: {e}", file=sys.stderr)
        instance = None
    messages = claim(agent_dir, session_id)
    model = text(opts.get("--model")) or cfg["model"]
    owner = owner_pid()
    entry = {"ts": fmt_ts(now), "event": "session_start", "session_id": session_id, "type": kind,
             "model": model, "branch": text(opts.get("--branch")), "timeout_seconds": timeout,
             "research_question": text(opts.get("--research-question")),
             "disconfirmation_target": text(opts.get("--disconfirmation-target")),
             "messages": messages, "owner_pid": owner, "instance": instance}
    entry = {k: v for k, v in entry.items() if v not in (None, [])}

    session = session_doc({
        "agent": name, "session_id": session_id, "started_at": fmt_ts(now), "ended_at": None,
        "type": kind, "domain": cfg["domain"], "branch": text(opts.get("--branch")),
        "status": "running", "model": model, "timeout_seconds": timeout,
        "research_question": text(opts.get("--research-question")),
        "belief_targeted": text(opts.get("--belief-targeted")),
        "disconfirmation_target": text(opts.get("--disconfirmation-target")),
        "sources_expected": sources_expected, "errors": errors,
        "owner_pid": owner, "owner_start": process_start(owner), "instance": instance,
        "messages": messages, **extra,
    })

    rpath = os.path.join(agent_dir, "report.json")
    report = report_doc(read_json(rpath) or {"agent": name})
    report.update(agent=name, status=STATUS_FOR_TYPE.get(kind, "researching"),
                  updated_at=fmt_ts(now))
    report["current_session"] = session_id
    report["instance"] = instance
    report["lifecycle"] = "alive"

    # Both files on disk before the journal line, renamed in after it.
    staged = [stage_json(path, session), stage_json(rpath, report_doc(report))]
    # The owner lock is taken before the session is recorded as running.
    owner_fd = acquire_owner_lock(agent_dir, session_id, owner, session["owner_start"])
    journal_append(agent_dir, entry)
    commit_all(staged)  # one directory fsync for both renames

    apply_metrics(agent_dir, name, entry, now)
    if owner_fd is not None:
        spawn_keeper(owner_fd, owner, session["owner_start"])
    print(session_id)
    return 65 if errors else 0


def end(agent_dir, name, opts, now):
    lock(agent_dir)
    errors = []
    sources = None
    if opts.get("--sources-archived") is not None:
        raw = opts["--sources-archived"]
        if raw.strip().isdigit():
            sources = int(raw.strip())
        else:
            bad_count(errors, "--sources-archived", raw, now)
    branch, summary = text(opts.get("--branch")), text(opts.get("--summary"))
    next_priority, handoff = text(opts.get("--next-priority")), text(opts.get("--handoff-notes"))

    path = os.path.join(agent_dir, "session.json")
    session = session_doc(read_json(path) or {"agent": name})
    sid = session["session_id"] or ""
    wanted = text(opts.get("--session") or os.environ.get("AGENT_STATE_SESSION_ID"))
    matches = wanted is None or wanted == sid
    running = session["status"] == "running"
    if running and not matches:
        raise Fail(f"{name}: session {wanted} is not running; the running session is {sid}", 66)
    if not running and matches and sid:
        print(f"agent-state: warning: {name}: session {sid} had already ended "
              f"({session['status'] or 'unrecorded'}); nothing changed", file=sys.stderr)
        return 0
    if not running:
        raise Fail(f"{name}: no session is running, so there is nothing to end", 66)

    duration = None
    if session["started_at"]:
        duration = int((now - parse_ts(session["started_at"])).total_seconds())
    rpath = os.path.join(agent_dir, "report.json")
    report = report_doc(read_json(rpath) or {"agent": name})
    messages = claimed(agent_dir, sid)  # moved to processed/ after the journal line
    processed = [m.get("id") or n[:-5] for n, m in messages]
    flags = sum(m.get("type", "flag") == "flag" for _, m in messages)
    entry = {"ts": fmt_ts(now), "event": "session_end", "session_id": sid, "outcome": "completed",
             "sources_archived": sources, "handoff": handoff, "summary": summary,
             "next_priority": next_priority, "branch": branch or session["branch"],
             "messages_processed": processed, "flags_received": flags,
             "duration_seconds": duration}
    # Rust: sources_archived always written; the others skipped when None,
    # messages_processed when empty, flags_received when 0.
    entry = {k: v for k, v in entry.items() if v is not None or k == "sources_archived"}
    if not processed:
        del entry["messages_processed"]
    if not flags:
        del entry["flags_received"]

    session["status"] = "completed"
    if sources is not None:
        session["sources_archived"] = sources
    if branch:
        session["branch"] = branch
    if handoff:
        session["handoff_notes"] = handoff
    session["ended_at"] = fmt_ts(now)
    session.pop("owner_pid", None)
    session.pop("owner_start", None)
    session["errors"] = (session["errors"] or []) + errors
    session = session_doc(session)

    report["status"] = "idle"
    if summary is None:
        summary = f"Session {sid} completed" + (
            f" — {session['sources_archived']} sources archived"
            if session["sources_archived"] is not None else "")
    report["summary"] = summary
    if next_priority:
        report["next_priority"] = next_priority
    report["agent"] = name
    report.pop("current_session", None)
    report["updated_at"] = fmt_ts(now)
    # Sleeping once it has an identity; hatching until then.
    has_identity = any(os.path.isfile(os.path.join(agent_dir, f)) for f in ("identity.md", "prompt.md"))
    report["lifecycle"] = "sleeping" if has_identity else "hatching"
    last_extra = report["last_session"] if isinstance(report["last_session"], dict) else {}
    last_extra = {k: v for k, v in last_extra.items() if k not in LAST_SESSION_KEYS and k != "reason"}
    report["last_session"] = {
        "id": sid, "started_at": session["started_at"], "ended_at": session["ended_at"],
        "outcome": "completed", "sources_archived": session["sources_archived"],
        "branch": session["branch"], "pr_number": session.get("pr_number"), **last_extra,
    }

    # Both files on disk before the journal line, renamed in after it; the
    # messages move to processed/ once the journal says the session ended.
    staged = [stage_json(path, session), stage_json(rpath, report_doc(report))]
    journal_append(agent_dir, entry)
    acknowledge(agent_dir, sid, messages)
    # (flag messages would be appended to memory.md here; none in the benchmark)
    # metrics.json staged with the others: three renames, one directory fsync.
    m = stage_metrics(agent_dir, name, entry, now)
    if m is not None:
        staged.append(m)
    commit_all(staged)
    release_owner_lock(agent_dir, sid)
    print(f"{sid} completed")
    return 65 if errors else 0


def main(argv):
    config = os.environ.get("AGENT_STATE_CONFIG", "/etc/agent-state/config.toml")
    if len(argv) >= 2 and argv[0] == "--config":
        config, argv = argv[1], argv[2:]
    if len(argv) < 3 or argv[0] != "session" or argv[1] not in ("begin", "end"):
        print(__doc__, file=sys.stderr)
        return 64
    hook, name, rest = argv[1], argv[2], argv[3:]
    if len(rest) % 2:
        print(f"{rest[-1]}: missing value", file=sys.stderr)
        return 64
    opts = dict(zip(rest[::2], rest[1::2]))
    now = datetime.now(timezone.utc).replace(microsecond=0)
    try:
        root, agent_dir, cfg = load_agent(config, name)
        if hook == "begin":
            return begin(root, agent_dir, name, cfg, opts, now)
        return end(agent_dir, name, opts, now)
    except Fail as e:
        print(f"baseline: error: {e}", file=sys.stderr)
        return e.code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
