/*
 * A test-only LD_PRELOAD library that shifts a process's wall clock.
 *
 * CLOCK_REALTIME (and its coarse variant), gettimeofday() and time() return
 * the real time plus an offset in milliseconds read from the first 8 bytes
 * (little-endian int64) of the file named by CLOCKSHIM_FILE, mapped shared:
 * a test steps the clock of a running server by rewriting those 8 bytes.
 * Monotonic clocks are left alone, unless the clock is frozen.
 *
 * Frozen: while the 8 bytes after the offset (a little-endian int64, the
 * freeze's number) are not zero, the wall clocks and the monotonic clocks
 * read what they read at the first look after that number was written: a
 * bench holds a server's time still while it counts instructions, so work
 * that depends on how much wall time a step took under valgrind (a lease's
 * deadline slots) repeats. Thawed (zeroed), both clocks jump forward
 * together, so the wall clock minus the monotonic one is unchanged and
 * nothing sees a clock step.
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

/* The file's words: the offset (ms), and the freeze's number (0: not frozen). */
enum { OFFSET, FREEZE, WORDS };

static const volatile int64_t *words;
static const int64_t no_words[WORDS] = {0};

static const volatile int64_t *file_words(void) {
    if (words == NULL) {
        const volatile int64_t *p = no_words;
        const char *path = getenv("CLOCKSHIM_FILE");
        if (path != NULL) {
            int fd = open(path, O_RDONLY | O_CLOEXEC);
            if (fd >= 0) {
                void *m = mmap(NULL, WORDS * sizeof(int64_t), PROT_READ, MAP_SHARED, fd, 0);
                close(fd);
                if (m != MAP_FAILED) p = m;
            }
        }
        words = p;
    }
    return words;
}

static int64_t offset(void) { return file_words()[OFFSET]; }

/* The clocks as the current freeze found them, and its number. */
static struct timespec frozen_realtime, frozen_monotonic;
static int64_t frozen_number;

static int is_wall(clockid_t clk) { return clk == CLOCK_REALTIME || clk == CLOCK_REALTIME_COARSE; }

static int is_monotonic(clockid_t clk) {
    return clk == CLOCK_MONOTONIC || clk == CLOCK_MONOTONIC_COARSE || clk == CLOCK_MONOTONIC_RAW ||
           clk == CLOCK_BOOTTIME;
}

/* The frozen (unshifted) reading of `clk`, if the clock is frozen and `clk`
 * is one the freeze holds. */
static int frozen(clockid_t clk, struct timespec *ts) {
    int64_t number = file_words()[FREEZE];
    if (number == 0 || !(is_wall(clk) || is_monotonic(clk))) return 0;
    if (__atomic_load_n(&frozen_number, __ATOMIC_ACQUIRE) != number) {
        syscall(SYS_clock_gettime, CLOCK_REALTIME, &frozen_realtime);
        syscall(SYS_clock_gettime, CLOCK_MONOTONIC, &frozen_monotonic);
        __atomic_store_n(&frozen_number, number, __ATOMIC_RELEASE);
    }
    *ts = is_wall(clk) ? frozen_realtime : frozen_monotonic;
    return 1;
}

static void shift(struct timespec *ts) {
    if (offset() == 0) return;
    int64_t ns = (int64_t)ts->tv_sec * 1000000000 + ts->tv_nsec + offset() * 1000000;
    ts->tv_sec = ns / 1000000000;
    ts->tv_nsec = ns % 1000000000;
    if (ts->tv_nsec < 0) {
        ts->tv_nsec += 1000000000;
        ts->tv_sec -= 1;
    }
}

int clock_gettime(clockid_t clk, struct timespec *ts) {
    if (frozen(clk, ts)) {
        if (is_wall(clk)) shift(ts);
        return 0;
    }
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
