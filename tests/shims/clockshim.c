/*
 * A test-only LD_PRELOAD library that shifts a process's wall clock.
 *
 * CLOCK_REALTIME (and its coarse variant), gettimeofday() and time() return
 * the real time plus an offset in milliseconds read from the first 8 bytes
 * (little-endian int64) of the file named by CLOCKSHIM_FILE, mapped shared:
 * a test steps the clock of a running server by rewriting those 8 bytes.
 * Monotonic clocks are left alone.
 *
 * Why not libfaketime: Debian's redis-server hangs at start-up under it (the
 * system jemalloc reads the clock while libfaketime initialises inside that
 * call). This library never allocates and never calls dlsym: it reads the
 * real clocks with raw system calls.
 */
#define _GNU_SOURCE
#include <fcntl.h>
#include <stdint.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

static const volatile int64_t *offset_ms;
static const int64_t no_offset = 0;

static int64_t offset(void) {
    if (offset_ms == NULL) {
        const volatile int64_t *p = &no_offset;
        const char *path = getenv("CLOCKSHIM_FILE");
        if (path != NULL) {
            int fd = open(path, O_RDONLY | O_CLOEXEC);
            if (fd >= 0) {
                void *m = mmap(NULL, sizeof(int64_t), PROT_READ, MAP_SHARED, fd, 0);
                close(fd);
                if (m != MAP_FAILED) p = m;
            }
        }
        offset_ms = p;
    }
    return *offset_ms;
}

static void shift(struct timespec *ts) {
    int64_t ns = (int64_t)ts->tv_sec * 1000000000 + ts->tv_nsec + offset() * 1000000;
    ts->tv_sec = ns / 1000000000;
    ts->tv_nsec = ns % 1000000000;
    if (ts->tv_nsec < 0) {
        ts->tv_nsec += 1000000000;
        ts->tv_sec -= 1;
    }
}

int clock_gettime(clockid_t clk, struct timespec *ts) {
    int r = (int)syscall(SYS_clock_gettime, clk, ts);
    if (r == 0 && (clk == CLOCK_REALTIME || clk == CLOCK_REALTIME_COARSE)) shift(ts);
    return r;
}

int gettimeofday(struct timeval *tv, void *tz) {
    struct timespec ts;
    int r = clock_gettime(CLOCK_REALTIME, &ts);
    if (r == 0 && tv != NULL) {
        tv->tv_sec = ts.tv_sec;
        tv->tv_usec = ts.tv_nsec / 1000;
    }
    (void)tz;
    return r;
}

time_t time(time_t *t) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    if (t != NULL) *t = ts.tv_sec;
    return ts.tv_sec;
}
