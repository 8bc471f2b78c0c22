#!/usr/bin/env python3
"""How precisely can anything be paced on this machine? Two figures, no daemon involved.

1. Timer wake-up lateness: how late a sleep of 100 µs / 1 ms / 2.5 ms returns, with the
   timer slack at 1 ns (as `serve --timing realtime` sets it). The pacing timer's margin
   (`serve --spin-us` .. `--spin-max-us`) has to cover this.
2. Memory stalls: a 4 KiB copy into a random page of an already-touched 1 GiB buffer,
   one every 250 µs (the rate of a QD1 write stream). On a bare-metal host such a copy
   takes about a microsecond; on some virtual machines a few percent of them take
   100–300 µs of CPU time (the hypervisor backing the page), and a daemon that writes
   the guest's data to its image will see the same stalls in its completions.

Usage: ci/machine-jitter.py [--seconds S]
"""

import argparse
import ctypes
import mmap
import os
import random
import time

PR_SET_TIMERSLACK = 29


def quantiles(values):
    v = sorted(values)
    n = len(v)
    return v[n // 2], v[min(n - 1, int(n * 0.99))], v[-1]


def timer_lateness(seconds):
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_TIMERSLACK, 1, 0, 0, 0) != 0:
        print("(could not set the timer slack; figures include the default 50 µs)")
    for period in (100e-6, 1e-3, 2.5e-3):
        late = []
        end = time.monotonic() + seconds / 3
        while time.monotonic() < end:
            t = time.perf_counter()
            time.sleep(period)
            late.append((time.perf_counter() - t - period) * 1e6)
        p50, p99, mx = quantiles(late)
        print(f"sleep {period * 1e6:6.0f} µs: late p50 {p50:6.1f}  p99 {p99:6.1f}  "
              f"max {mx:7.1f} µs  ({len(late)} sleeps)")


def memory_stalls(seconds):
    size = 1 << 30
    buf = mmap.mmap(-1, size)
    for off in range(0, size, 4096):
        buf[off] = 1
    data = os.urandom(4096)
    took, stalls = [], []
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        off = random.randrange(size // 4096) * 4096
        cpu = time.thread_time_ns()
        t = time.perf_counter_ns()
        buf[off:off + 4096] = data
        wall = time.perf_counter_ns() - t
        cpu = time.thread_time_ns() - cpu
        took.append(wall / 1e3)
        if wall > 30_000:
            stalls.append(cpu / 1e3)
        spin_until = time.perf_counter() + 250e-6
        while time.perf_counter() < spin_until:
            pass
    p50, p99, mx = quantiles(took)
    share = 100.0 * len(stalls) / len(took)
    print(f"4 KiB copy into a touched random page, every 250 µs: p50 {p50:.1f}  "
          f"p99 {p99:.1f}  max {mx:.1f} µs; over 30 µs: {len(stalls)} of {len(took)} "
          f"({share:.2f}%)")
    if stalls:
        print(f"  CPU time of those copies: median {sorted(stalls)[len(stalls) // 2]:.0f} µs "
              "(spent running, not waiting: the thread was stalled on the memory itself)")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=4.0, help="length of each part")
    args = ap.parse_args()
    print(f"# machine jitter ({time.strftime('%Y-%m-%d')}, {os.cpu_count()} CPUs)")
    timer_lateness(args.seconds)
    memory_stalls(args.seconds)


if __name__ == "__main__":
    main()
