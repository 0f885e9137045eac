/*
 * prio: a thread's nice value (prio.h). setpriority(PRIO_PROCESS, tid) is per thread on
 * Linux (the POSIX per-process meaning does not hold there), which is what this relies on.
 */
#include "prio.h"

#include <errno.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

int
prio_thread_nice(int by)
{
    id_t tid = (id_t)syscall(SYS_gettid);
    int now;

    errno = 0;
    now = getpriority(PRIO_PROCESS, tid);
    if (now == -1 && errno != 0) {
        return -errno;
    }
    if (setpriority(PRIO_PROCESS, tid, now + by) != 0) {
        return -errno;
    }
    return 0;
}
