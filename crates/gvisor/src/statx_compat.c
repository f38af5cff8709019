/*
 * Preloaded (/etc/ld.so.preload) into glibc programs in gvisor sandboxes.
 *
 * gVisor before 2023 refuses statx() whose flags carry AT_NO_AUTOMOUNT
 * (EINVAL), and Debian 12's runsc is such a build; coreutils 9 passes the
 * flag on every call, so `ls -l`, `stat`, `cp -a` and `du` fail with
 * "Invalid argument" in every sandbox. The flag only asks the kernel not
 * to trigger an automount, and a sandbox has no automounts: this statx
 * drops it and otherwise is the system call. Programs that are static or
 * not linked with glibc do not load it (musl has no ld.so.preload).
 */
#define _GNU_SOURCE
#include <fcntl.h>
#include <sys/syscall.h>
#include <unistd.h>

struct statx;

int statx(int dirfd, const char *path, int flags, unsigned int mask, struct statx *buf)
{
    return syscall(SYS_statx, dirfd, path, flags & ~AT_NO_AUTOMOUNT, mask, buf);
}
