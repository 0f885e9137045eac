/*
 * clock: the process's clocks in milliseconds, for every layer.
 *
 * clock_ms is the monotonic clock (deadlines, timeouts, rates); clock_coarse_ms
 * the coarse monotonic clock, cheap enough for every store access (recency),
 * with the tick's resolution (a few ms); clock_wall_ms the wall clock (times
 * written to disk or shown to people), clock_wall_coarse_ms its coarse form.
 * All are thread safe and never fail.
 */
#ifndef CLOCK_H
#define CLOCK_H

#include <stdint.h>
#include <time.h>

static inline uint64_t
clock_ts_ms(clockid_t id)
{
    struct timespec ts;

    clock_gettime(id, &ts);
    return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

static inline uint64_t
clock_ms(void)
{
    return clock_ts_ms(CLOCK_MONOTONIC);
}

static inline uint64_t
clock_coarse_ms(void)
{
#ifdef CLOCK_MONOTONIC_COARSE
    return clock_ts_ms(CLOCK_MONOTONIC_COARSE);
#else
    return clock_ts_ms(CLOCK_MONOTONIC);
#endif
}

static inline uint64_t
clock_wall_ms(void)
{
    return clock_ts_ms(CLOCK_REALTIME);
}

static inline uint64_t
clock_wall_coarse_ms(void)
{
#ifdef CLOCK_REALTIME_COARSE
    return clock_ts_ms(CLOCK_REALTIME_COARSE);
#else
    return clock_ts_ms(CLOCK_REALTIME);
#endif
}

/* clock_ns: monotonic nanoseconds (latency measurement). */
static inline uint64_t
clock_ns(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

#endif
