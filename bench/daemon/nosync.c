/*
 * LD_PRELOAD shim for the latency breakdown only: fsync(2), fdatasync(2),
 * syncfs(2) and sync(2) return at once without flushing. Running the daemon
 * with it shows how much of a wake is spent waiting for the disk. Never use
 * it for anything but measuring: it throws away the daemon's durability.
 */
#include <unistd.h>
int fsync(int fd) { (void)fd; return 0; }
int fdatasync(int fd) { (void)fd; return 0; }
int syncfs(int fd) { (void)fd; return 0; }
void sync(void) {}
