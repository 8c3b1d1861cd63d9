/* A clock for one redis-server that a test can step and skew: every wall-clock reading the
 * server takes (gettimeofday, clock_gettime of a CLOCK_REALTIME kind, time) is
 *
 *     real + offset + (real - anchor) * rate_ppm / 1e6
 *
 * with offset, anchor and rate_ppm read from a file the test writes (FENCELOCK_CLOCK_FILE, 32
 * bytes of native int64s: offset_ns, seq, anchor_ns, rate_ppm). rate_ppm 0 is a clock running at
 * the true rate; 3000000 runs four times fast, -500000 at half speed. The test changes the rate
 * at a moment it makes the anchor, folding the skew so far into the offset, so that the clock
 * never jumps unless stepped. seq is a sequence lock: odd while the test writes the other three,
 * so that a reading never mixes two settings. Monotonic clocks are left alone, as a clock step
 * or a drifting oscillator leaves them.
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

struct setting {
    int64_t offset_ns;
    uint64_t seq;
    int64_t anchor_ns;
    int64_t rate_ppm;
};

static volatile struct setting *setting;
static int tried;

static void map(void) {
    if (tried) {
        return;
    }
    tried = 1;
    const char *path = getenv("FENCELOCK_CLOCK_FILE");
    if (!path) {
        return;
    }
    int fd = open(path, O_RDONLY);
    if (fd < 0) {
        return;
    }
    void *p = mmap(NULL, sizeof(struct setting), PROT_READ, MAP_SHARED, fd, 0);
    close(fd);
    if (p != MAP_FAILED) {
        setting = p;
    }
}

/* The shifted reading of `real_ns`. */
static int64_t shifted(int64_t real_ns) {
    map();
    if (!setting) {
        return real_ns;
    }
    int64_t offset = 0, anchor = 0, rate = 0;
    /* Bounded: a writer that died half-way leaves seq odd; then the last reading stands. */
    for (int tries = 0; tries < 100000; tries++) {
        uint64_t before = __atomic_load_n(&setting->seq, __ATOMIC_ACQUIRE);
        if (before & 1) {
            continue;
        }
        offset = setting->offset_ns;
        anchor = setting->anchor_ns;
        rate = setting->rate_ppm;
        __atomic_thread_fence(__ATOMIC_ACQUIRE);
        if (__atomic_load_n(&setting->seq, __ATOMIC_RELAXED) == before) {
            break;
        }
    }
    __int128 skew = rate == 0 ? 0 : (__int128)(real_ns - anchor) * rate / 1000000;
    return real_ns + offset + (int64_t)skew;
}

static void shift(struct timespec *ts) {
    int64_t ns = shifted((int64_t)ts->tv_sec * 1000000000 + ts->tv_nsec);
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
