/* The burst's floor: what the inbox protocol's own system calls cost on this
 * disk, with no daemon. A sender renames AGENTS x PER messages from each
 * agent's inbox/.tmp/ into inbox/ (round-robin, as bench.py burst does) while
 * WORKERS processes, each with its share of the agents, do for every message
 * only what the design requires: list the inbox, read the file, rename it
 * into inbox/.claimed/S/, sync both directories once per batch, rename it
 * into processed/, sync both once per batch. No journal, no prompt, no
 * session, no inotify (a worker that finds nothing yields and looks again).
 *
 *   floor ROOT AGENTS PER WORKERS   (ROOT/aNNNNN/inbox/.tmp/ filled first)
 *
 * Prints one JSON line: seconds from the first rename to the last message in
 * processed/, and the sender's own seconds. Build: gcc -O2 -o floor floor.c */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec / 1e9;
}

static void die(const char *what, const char *path) {
    fprintf(stderr, "floor: %s %s: %s\n", what, path, strerror(errno));
    exit(2);
}

static int opendir_fd(const char *path) {
    int fd = open(path, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0) die("opening", path);
    return fd;
}

/* One worker: agents w, w+workers, ... until each has PER in processed/. */
static void work(const char *root, int agents, int per, int workers, int w) {
    int mine = 0;
    for (int a = w; a < agents; a += workers) mine++;
    int *done = calloc(agents, sizeof(int));
    int left = mine, batch = 0;
    char path[4096], names[1024][64];
    char buf[65536];
    while (left > 0) {
        int found = 0;
        for (int a = w; a < agents; a += workers) {
            if (done[a] >= per) continue;
            snprintf(path, sizeof path, "%s/a%05d/inbox", root, a + 1);
            int in = opendir_fd(path);
            DIR *d = fdopendir(dup(in));
            struct dirent *e;
            int n = 0;
            while ((e = readdir(d)) && n < 1024) {
                size_t l = strlen(e->d_name);
                if (e->d_name[0] == '.' || l < 6 || strcmp(e->d_name + l - 5, ".json")) continue;
                snprintf(names[n++], 64, "%s", e->d_name);
            }
            closedir(d);
            if (n == 0) { close(in); continue; }
            found += n;
            char claimed[4200];
            snprintf(claimed, sizeof claimed, "%s/.claimed/s%d", path, batch++);
            if (mkdir(claimed, 0750) < 0) die("making", claimed);
            int cl = opendir_fd(claimed);
            for (int i = 0; i < n; i++) {
                int f = openat(in, names[i], O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
                if (f < 0) die("opening", names[i]);
                while (read(f, buf, sizeof buf) > 0) {}
                close(f);
                if (renameat(in, names[i], cl, names[i]) < 0) die("claiming", names[i]);
            }
            fsync(in);
            fsync(cl);
            char processed[4200];
            snprintf(processed, sizeof processed, "%s/processed", path);
            int pr = opendir_fd(processed);
            for (int i = 0; i < n; i++)
                if (renameat(cl, names[i], pr, names[i]) < 0) die("acknowledging", names[i]);
            fsync(pr);
            fsync(cl);
            rmdir(claimed);
            close(pr);
            close(cl);
            close(in);
            done[a] += n;
            if (done[a] >= per) left--;
        }
        if (!found) sched_yield();
    }
    exit(0);
}

int main(int argc, char **argv) {
    if (argc != 5) {
        fprintf(stderr, "usage: floor ROOT AGENTS PER WORKERS\n");
        return 64;
    }
    const char *root = argv[1];
    int agents = atoi(argv[2]), per = atoi(argv[3]), workers = atoi(argv[4]);
    char from[4096], to[4096];
    for (int a = 0; a < agents; a++) {
        snprintf(to, sizeof to, "%s/a%05d/inbox/.claimed", root, a + 1);
        mkdir(to, 0750);
        snprintf(to, sizeof to, "%s/a%05d/inbox/processed", root, a + 1);
        mkdir(to, 0750);
    }
    double t0 = now();
    pid_t kids[64];
    for (int w = 0; w < workers && w < 64; w++)
        if ((kids[w] = fork()) == 0) work(root, agents, per, workers, w);
    for (int j = 0; j < per; j++)
        for (int a = 0; a < agents; a++) {
            snprintf(from, sizeof from, "%s/a%05d/inbox/.tmp/m%05d.json", root, a + 1, j);
            snprintf(to, sizeof to, "%s/a%05d/inbox/m%05d.json", root, a + 1, j);
            if (rename(from, to) < 0) die("sending", from);
        }
    double sent = now();
    int failed = 0;
    for (int w = 0; w < workers && w < 64; w++) {
        int st;
        waitpid(kids[w], &st, 0);
        failed |= !WIFEXITED(st) || WEXITSTATUS(st) != 0;
    }
    double end = now();
    printf("{\"seconds\": %.3f, \"sender_seconds\": %.3f, \"workers\": %d, \"failed\": %s}\n",
           end - t0, sent - t0, workers, failed ? "true" : "false");
    return failed ? 1 : 0;
}
