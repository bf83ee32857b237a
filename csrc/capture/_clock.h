/* clock_ns(): the time of an event row, in ns on time.perf_counter_ns()'s clock (CLOCK_MONOTONIC
 * on Linux), which every other row of a log is stamped with, for the C recorders
 * (_bfcnative.c), which call it with the GIL held (it guards the state below).
 *
 * Reading CLOCK_MONOTONIC costs 50-60 ns on this project's machines (a VM), the time stamp
 * counter 16-25 ns; a recorded allocate+free pair reads the clock twice against ~350 ns of
 * work. So where the kernel itself keeps CLOCK_MONOTONIC on an invariant TSC (its clocksource
 * is "tsc" and CPUID says the counter is invariant), clock_ns() reads the counter and converts:
 *
 *     ns = anchor_ns + (tsc - anchor_tsc) * ns_per_tick
 *
 * in integers: ns_per_tick is held as mult = round(ns_per_tick * 2^32), and the product of the
 * ticks since the anchor (at most span_ticks, ~10 ms of them) and mult is taken in 128 bits and
 * shifted back, exact to well under 1 ns (through a double, an unsigned 64-bit integer's
 * conversion alone took ~8 instructions). span_ticks is 0 unless converting, so the fast path's
 * one comparison also sends every other state to the slow one (clock_slow).
 *
 * An anchor is a pair (the clock, the midpoint of the narrowest of five pairs of counter reads
 * around it; none when even that is wider than ANCHOR_TICKS). ns_per_tick is measured from an
 * earlier anchor, the rate base, at least CALIBRATE_NS and up to RATE_NS back (so it follows
 * the kernel's own slewing of CLOCK_MONOTONIC, and an anchor's uncertainty is divided by up to
 * 100 ms), and a new anchor is taken once the counter has gone twice as far as the rate was
 * measured over, or RECALIBRATE_NS. Until the first CALIBRATE_NS have passed, and whenever the
 * counter goes back, the clock itself is read. Invariants: the values returned never decrease
 * (last_ns); they differ from the clock by about an anchor's uncertainty (half its pair's width,
 * ~25 ns here) (tests/test_recorder.py compares them). Elsewhere (no invariant TSC, not x86-64 Linux, or
 * GPUVIZ_TSC=0 in the environment when the module is first used) clock_ns() reads the clock
 * (perf_counter_ns(), as the anchors do). */
#ifndef GPUVIZ_CLOCK_H
#define GPUVIZ_CLOCK_H

#ifndef Py_PYTHON_H
#error "include Python.h first"
#endif
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define CALIBRATE_NS 10000000LL   /* the shortest interval the rate is measured over: 10 ms */
#define RECALIBRATE_NS 10000000LL /* a new anchor after 10 ms at most */
#define RATE_NS 100000000LL       /* the rate is measured over up to 100 ms */
#define ANCHOR_TICKS 4000         /* the widest pair of counter reads around a clock read */

static int64_t perf_counter_ns(void) { /* time.perf_counter_ns() */
#if PY_VERSION_HEX >= 0x030D0000
    PyTime_t t;
    (void)PyTime_PerfCounterRaw(&t);
    return (int64_t)t;
#else
    return (int64_t)_PyTime_GetPerfCounter();
#endif
}

#if defined(__x86_64__) && defined(__linux__)
#include <cpuid.h>
#include <x86intrin.h>

static struct {
    int state; /* 0: not checked yet, -1: read the clock, 1: calibrating, 2: converting */
    uint64_t anchor_tsc, rate_tsc;
    uint64_t span_ticks; /* converting: ticks past the anchor it extrapolates to; 0 otherwise */
    uint64_t mult;       /* round(ns_per_tick * 2^32) */
    int64_t anchor_ns, rate_ns, last_ns;
} gv_clock;

static int tsc_usable(void) {
    const char *env = getenv("GPUVIZ_TSC");
    if (env != NULL && strcmp(env, "0") == 0) return 0;
    unsigned int a, b, c, d;
    if (!__get_cpuid(0x80000007, &a, &b, &c, &d) || !(d & (1u << 8))) return 0; /* invariant TSC */
    FILE *f = fopen("/sys/devices/system/clocksource/clocksource0/current_clocksource", "r");
    if (f == NULL) return 0;
    char source[32] = {0};
    int ok = fgets(source, sizeof source, f) != NULL && strcmp(source, "tsc\n") == 0;
    fclose(f);
    return ok;
}

static int64_t clock_anchor(void) { /* read the clock, and anchor the counter to it */
    uint64_t tsc = 0, width = UINT64_MAX;
    int64_t now = 0;
    for (int attempt = 0; attempt < 5; attempt++) { /* the narrowest of a few pairs of counter reads */
        uint64_t before = __rdtsc();
        int64_t read = perf_counter_ns();
        uint64_t after = __rdtsc();
        if (after - before < width) {
            width = after - before;
            tsc = before + width / 2;
            now = read;
        }
    }
    if (width > ANCHOR_TICKS) return now; /* no anchor this time: the next read tries again */
    int64_t elapsed_ns = now - gv_clock.rate_ns;
    int64_t ticks = (int64_t)(tsc - gv_clock.rate_tsc);
    if (ticks <= 0 || (int64_t)(tsc - gv_clock.anchor_tsc) <= 0) { /* the counter went back: start again */
        gv_clock.state = 1;
        gv_clock.span_ticks = 0;
        gv_clock.anchor_tsc = gv_clock.rate_tsc = tsc;
        gv_clock.anchor_ns = gv_clock.rate_ns = now;
        return now;
    }
    if (elapsed_ns < CALIBRATE_NS) return now; /* keep measuring */
    double ns_per_tick = (double)elapsed_ns / (double)ticks;
    gv_clock.mult = (uint64_t)(ns_per_tick * 4294967296.0 + 0.5);
    /* extrapolate at most twice as far as the rate was measured over */
    double span_ns = elapsed_ns < RECALIBRATE_NS / 2 ? 2.0 * (double)elapsed_ns : (double)RECALIBRATE_NS;
    gv_clock.span_ticks = (uint64_t)(span_ns / ns_per_tick);
    gv_clock.state = 2;
    gv_clock.anchor_tsc = tsc;
    gv_clock.anchor_ns = now;
    if (elapsed_ns >= RATE_NS) { /* the rate from here on is measured from this anchor */
        gv_clock.rate_tsc = tsc;
        gv_clock.rate_ns = now;
    }
    return now;
}

/* Every state but converting within the span: the first read, the clock itself, a new anchor. */
static __attribute__((noinline)) int64_t clock_slow(void) {
    if (gv_clock.state < 0) return perf_counter_ns();
    if (gv_clock.state == 0) {
        if (!tsc_usable()) {
            gv_clock.state = -1;
            return perf_counter_ns();
        }
        gv_clock.state = 1; /* the first anchor */
        gv_clock.anchor_tsc = gv_clock.rate_tsc = __rdtsc();
        gv_clock.anchor_ns = gv_clock.rate_ns = perf_counter_ns();
        return gv_clock.anchor_ns;
    }
    return clock_anchor();
}

static inline int64_t clock_ns(void) {
    uint64_t ticks = __rdtsc() - gv_clock.anchor_tsc;
    int64_t ns;
    if (__builtin_expect(ticks < gv_clock.span_ticks, 1))
        ns = gv_clock.anchor_ns + (int64_t)(((unsigned __int128)ticks * gv_clock.mult) >> 32);
    else
        ns = clock_slow();
    if (ns < gv_clock.last_ns) ns = gv_clock.last_ns;
    gv_clock.last_ns = ns;
    return ns;
}

#else
static inline int64_t clock_ns(void) { return perf_counter_ns(); }
#endif

#endif
