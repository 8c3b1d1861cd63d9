/* A clock for one redis-server that a test can step: every wall-clock reading the server takes
 * (gettimeofday, clock_gettime of a CLOCK_REALTIME kind, time) is the real one plus an offset
 * in nanoseconds that the test writes into a file (FENCELOCK_CLOCK_FILE: 8 bytes, a native
 * int64, written in place). Monotonic clocks are left alone, as a clock step leaves them.
 *
 * Loaded with LD_PRELOAD by tests/support/clock.rs. libfaketime would do, but it recurses into
 * itself under redis-server's jemalloc and aborts; this reads the real clock by system call and
 * allocates nothing. */
#define _GNU_SOURCE
#include <fcntl.h>
#include <stdint.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

static volatile int64_t *offset_ns;
static int tried;

static int64_t offset(void) {
    if (!tried) {
        tried = 1;
        const char *path = getenv("FENCELOCK_CLOCK_FILE");
        if (path) {
            int fd = open(path, O_RDONLY);
            if (fd >= 0) {
                void *p = mmap(NULL, sizeof(int64_t), PROT_READ, MAP_SHARED, fd, 0);
                close(fd);
                if (p != MAP_FAILED) {
                    offset_ns = p;
                }
            }
        }
    }
    return offset_ns ? *offset_ns : 0;
}

static void shift(struct timespec *ts) {
    int64_t ns = (int64_t)ts->tv_sec * 1000000000 + ts->tv_nsec + offset();
    ts->tv_sec = ns / 1000000000;
    ts->tv_nsec = ns % 1000000000;
    if (ts->tv_nsec < 0) {
        ts->tv_nsec += 1000000000;
        ts->tv_sec -= 1;
    }
}

int clock_gettime(clockid_t clk, struct timespec *ts) {
    int r = (int)syscall(SYS_clock_gettime, clk, ts);
    if (r == 0 && (clk == CLOCK_REALTIME || clk == CLOCK_REALTIME_COARSE)) {
        shift(ts);
    }
    return r;
}

int gettimeofday(struct timeval *tv, void *tz) {
    struct timespec ts;
    int r = (int)syscall(SYS_clock_gettime, CLOCK_REALTIME, &ts);
    if (r == 0 && tv) {
        shift(&ts);
        tv->tv_sec = ts.tv_sec;
        tv->tv_usec = ts.tv_nsec / 1000;
    }
    (void)tz;
    return r;
}

time_t time(time_t *out) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    if (out) {
        *out = ts.tv_sec;
    }
    return ts.tv_sec;
}
