/*
 * LD_PRELOAD shim for a what-if: fsync(2) and fdatasync(2) do the real call,
 * then sleep SLOWSYNC_US microseconds (default 1000). It shows what the wake
 * latency would be on a disk where a sync costs that much more than here (this
 * VM's ext4 runs without a journal: a small-file fsync is about 0.2 ms; a
 * journaled ext4 or a network block device often takes 1-10 ms).
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdlib.h>
#include <time.h>

static long delay_us(void)
{
    static long d = -1;
    if (d < 0) {
        const char *s = getenv("SLOWSYNC_US");
        d = s && *s ? strtol(s, NULL, 10) : 1000;
    }
    return d;
}

static void pause_after_sync(void)
{
    long us = delay_us();
    struct timespec t = {us / 1000000, (us % 1000000) * 1000L};
    while (nanosleep(&t, &t) != 0)
        ;
}

int fsync(int fd)
{
    static int (*real)(int);
    if (!real)
        real = (int (*)(int))dlsym(RTLD_NEXT, "fsync");
    int r = real(fd);
    pause_after_sync();
    return r;
}

int fdatasync(int fd)
{
    static int (*real)(int);
    if (!real)
        real = (int (*)(int))dlsym(RTLD_NEXT, "fdatasync");
    int r = real(fd);
    pause_after_sync();
    return r;
}
