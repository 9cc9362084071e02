/* A clock shifter for the tests (LD_PRELOAD): the wall clock a server sees
 * (CLOCK_REALTIME through clock_gettime, gettimeofday and time) runs
 * ahead of or behind the real one by the milliseconds stored, as a little-
 * endian int64, in the file named by LEASE_CLOCK_SHIFT_FILE. The test
 * changes the file while the server runs: a clock step. The monotonic clock
 * is left alone.
 *
 * Nothing here allocates or calls into libc's time functions: it reads the
 * real clock with syscall() and maps the file with raw system calls, so it
 * works under jemalloc, where libfaketime hangs the server at start. */
#define _GNU_SOURCE
#include <fcntl.h>
#include <stdint.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

static volatile int64_t *shift_ms;
static volatile int tried;

static int64_t shift(void) {
    if (!tried) {
        tried = 1;
        const char *path = getenv("LEASE_CLOCK_SHIFT_FILE");
        if (path) {
            long fd = syscall(SYS_openat, AT_FDCWD, path, O_RDONLY);
            if (fd >= 0) {
                void *m = (void *)syscall(SYS_mmap, 0, 4096, PROT_READ, MAP_SHARED, fd, 0);
                if (m != MAP_FAILED) shift_ms = m;
                syscall(SYS_close, fd);
            }
        }
    }
    return shift_ms ? *shift_ms : 0;
}

static void shifted(clockid_t clk, struct timespec *ts) {
    syscall(SYS_clock_gettime, clk, ts);
    int64_t ns = (int64_t)ts->tv_sec * 1000000000 + ts->tv_nsec + shift() * 1000000;
    ts->tv_sec = ns / 1000000000;
    ts->tv_nsec = ns % 1000000000;
}

int clock_gettime(clockid_t clk, struct timespec *ts) {
    if (clk == CLOCK_REALTIME || clk == CLOCK_REALTIME_COARSE) {
        shifted(clk, ts);
        return 0;
    }
    return (int)syscall(SYS_clock_gettime, clk, ts);
}

int gettimeofday(struct timeval *tv, void *tz) {
    (void)tz;
    struct timespec ts;
    shifted(CLOCK_REALTIME, &ts);
    if (tv) {
        tv->tv_sec = ts.tv_sec;
        tv->tv_usec = ts.tv_nsec / 1000;
    }
    return 0;
}

time_t time(time_t *t) {
    struct timespec ts;
    shifted(CLOCK_REALTIME, &ts);
    if (t) *t = ts.tv_sec;
    return ts.tv_sec;
}
