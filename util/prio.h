/*
 * prio: the calling thread's scheduling priority (its nice value; Linux gives each thread
 * its own), for the daemon's threads set apart from the event loops: a job that must never
 * make a request wait (the pool's rebalance walk and the connections it sends through) runs
 * at a higher nice, so a loop that wakes with a request takes the CPU from it at once; the
 * SSD writer at a lower one, so that it keeps the disk busy on a loaded host.
 *
 * Plain system calls on the calling thread: no state, safe from any thread.
 */
#ifndef PRIO_H
#define PRIO_H

/*
 * prio_thread_nice: add by to the calling thread's nice value (by > 0 lowers its priority,
 * which any thread may do; by < 0 raises it, which needs CAP_SYS_NICE or RLIMIT_NICE). The
 * result is clamped by the kernel to 19. Returns 0, or -errno (nothing changed).
 */
int prio_thread_nice(int by);

#endif
