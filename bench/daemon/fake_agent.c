/*
 * The benchmark's session command: records when it started, prints one line
 * and exits.
 *
 *   fake_agent STAMP_FILE {agent} {session_id}
 *
 * The very first thing main() does is read CLOCK_REALTIME and CLOCK_MONOTONIC;
 * then it appends one line to STAMP_FILE with a single write(2) on an
 * O_APPEND descriptor (atomic for a line this short, so concurrent sessions
 * never interleave):
 *
 *   AGENT SESSION_ID REALTIME_NS MONOTONIC_NS PID
 *
 * Only then does it print one line on stdout ("fake_agent: AGENT SESSION_ID
 * done"): a session that prints nothing is a failure to the daemon
 * (SESSION_EMPTY_OUTPUT, retried), so a silent fake agent would never let a
 * message reach processed/. The line comes after the stamp, so the measured
 * latency does not include it.
 *
 * It does not read its stdin (the prompt): the daemon's runner copes with a
 * child that never reads it (tested in src/daemon/runner.rs). It exits 0, so
 * the session completes and its claimed messages move to inbox/processed/.
 * FAKE_AGENT_SLEEP_MS=N (in the daemon's environment) makes it sleep first.
 *
 * Built statically when the toolchain allows it, so there is no dynamic
 * loader between exec and main(). C, not a shell script: `sh -c 'date ...'`
 * adds 1-3 ms of start-up (two execs) and its own noise to what we measure.
 */
#define _GNU_SOURCE
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

int main(int argc, char **argv)
{
    struct timespec rt, mono;
    clock_gettime(CLOCK_REALTIME, &rt);
    clock_gettime(CLOCK_MONOTONIC, &mono);
    if (argc < 4)
        return 64;
    char line[1024];
    int n = snprintf(line, sizeof line, "%s %s %lld %lld %d\n", argv[2], argv[3],
                     (long long)rt.tv_sec * 1000000000LL + rt.tv_nsec,
                     (long long)mono.tv_sec * 1000000000LL + mono.tv_nsec, (int)getpid());
    if (n <= 0 || n >= (int)sizeof line)
        return 65;
    int fd = open(argv[1], O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0644);
    if (fd < 0 || write(fd, line, (size_t)n) != n)
        return 74;
    close(fd);
    n = snprintf(line, sizeof line, "fake_agent: %s %s done\n", argv[2], argv[3]);
    if (n <= 0 || n >= (int)sizeof line || write(STDOUT_FILENO, line, (size_t)n) != n)
        return 74;
    const char *sleep_ms = getenv("FAKE_AGENT_SLEEP_MS");
    if (sleep_ms && *sleep_ms) {
        long ms = strtol(sleep_ms, NULL, 10);
        struct timespec d = {ms / 1000, (ms % 1000) * 1000000L};
        nanosleep(&d, NULL);
    }
    return 0;
}
