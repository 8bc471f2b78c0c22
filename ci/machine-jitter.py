#!/usr/bin/env python3
"""How precisely can anything be paced on this machine? Four measurements, no daemon involved.

1. Timer wake-up lateness: how late a sleep of 100 µs / 1 ms / 2.5 ms returns, with the
   timer slack at 1 ns (as `serve --timing realtime` sets it). The pacing timer's margin
   (`serve --spin-us` .. `--spin-max-us`) has to cover this.
2. Memory stalls: a 4 KiB copy into a random page of an already-touched 1 GiB buffer,
   one every 250 µs (the rate of a QD1 write stream). On a bare-metal host such a copy
   takes about a microsecond; on some virtual machines a few percent of them take
   100–300 µs of CPU time (the hypervisor backing the page), and a daemon that writes
   the guest's data to its image will see the same stalls in its completions.

3. Eventfd wake-up of a sleeping process: one process blocks on an eventfd, the other
   spins for a gap (25 µs, about a 4 KiB round trip with `--timing off`; 250 µs, about
   a paced 4 KiB write on generic-emmc45; 2.7 ms and 8 ms, a paced 128 KiB read and
   write) and then signals it; the figure is from the signal to the sleeper running
   again. A client that sleeps on its completions (as
   blkbench's "sleeps" rows do) pays this on every request, and pays more after the
   longer waits pacing gives it: that difference belongs to the machine, not the daemon.

4. Time taken from a spinning thread: one process per CPU reads the clock in a loop (as
   the daemon spins out its completions and a polling client spins on its ring) and
   records every gap between two readings longer than 5 µs: the CPU was taken from it
   (an interrupt, another task, the hypervisor). Printed per CPU: the gaps over 20 µs
   per second, and the share of instants at which the thread is off its CPU and stays
   off for more than 20 µs more. Anything due at such an instant (a paced completion
   the daemon spins out, or the polling client's look at its ring) is more than 20 µs
   late. When that share is near or over 1% on either CPU, no daemon can hold a p99
   within 20 µs on this machine.

With --cpu-latency-us N the run holds a CPU latency request (Linux PM QoS,
/dev/cpu_dma_latency, root): idle CPUs keep out of idle states slower to leave than N µs (0:
they poll). Run once without and once with 0, part 3 shows how much of a wake-up is the
idle CPU's way out of its idle state (on a virtual machine, the hypervisor's).

Usage: ci/machine-jitter.py [--seconds S] [--gaps US,...] [--cpu-latency-us N]
"""

import argparse
import ctypes
import mmap
import os
import pickle
import random
import struct
import sys
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


def wake_latency(seconds, gaps):
    for gap_us in gaps:
        ready = os.eventfd(0, os.EFD_NONBLOCK)  # sleeper -> signaller: about to block
        go = os.eventfd(0)  # signaller -> sleeper
        stamp = mmap.mmap(-1, 8)  # shared: when the signal was sent
        results_r, results_w = os.pipe()
        pid = os.fork()
        if pid == 0:
            late = []
            while True:
                os.eventfd_write(ready, 1)
                os.eventfd_read(go)
                woke = time.perf_counter_ns()
                sent = int.from_bytes(stamp[:8], "little")
                if sent == 0:
                    break
                late.append((woke - sent) / 1e3)
            with os.fdopen(results_w, "wb") as f:
                pickle.dump(late, f)
            os._exit(0)
        os.close(results_w)
        end = time.monotonic() + seconds / 2
        while True:
            while True:  # spin until the sleeper is about to block
                try:
                    os.eventfd_read(ready)
                    break
                except BlockingIOError:
                    pass
            if time.monotonic() >= end:
                stamp[:8] = (0).to_bytes(8, "little")
                os.eventfd_write(go, 1)
                break
            spin_until = time.perf_counter_ns() + gap_us * 1000
            while time.perf_counter_ns() < spin_until:
                pass
            stamp[:8] = time.perf_counter_ns().to_bytes(8, "little")
            os.eventfd_write(go, 1)
        with os.fdopen(results_r, "rb") as f:
            late = pickle.load(f)
        os.waitpid(pid, 0)
        for fd in (ready, go):
            os.close(fd)
        p50, p99, mx = quantiles(late)
        print(f"eventfd wake-up after {gap_us:4d} µs asleep: p50 {p50:6.1f}  p99 {p99:6.1f}  "
              f"max {mx:7.1f} µs  ({len(late)} wake-ups)")


SPIN_GAP_NS = 5_000  # a gap between two clock readings longer than this is recorded
LOST_US = 20.0  # the p99 target's 20 µs


def _spin_gaps(cpu, seconds, out_w):
    """Child: spin on `cpu` for `seconds`, sending (start_ns, length_ns) of each gap."""
    try:
        os.sched_setaffinity(0, {cpu})
    except OSError:
        pass
    gaps = []
    now = time.perf_counter_ns
    last = start = now()
    end = start + int(seconds * 1e9)
    while last < end:
        t = now()
        if t - last > SPIN_GAP_NS:
            gaps.append((last, t - last))
        last = t
    with os.fdopen(out_w, "wb") as f:
        pickle.dump((start, end, gaps), f)
    os._exit(0)


def spin_off_cpu(seconds):
    """One spinner per CPU for `seconds`: per CPU, the gaps over LOST_US per second, the
    longest gap (µs), and the share (%) of instants at which the thread was off its CPU
    with more than LOST_US still to go (anything due then is that late)."""
    children = []
    for cpu in sorted(os.sched_getaffinity(0)):
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:
            os.close(r)
            _spin_gaps(cpu, seconds, w)
        os.close(w)
        children.append((cpu, pid, r))
    out = []
    for cpu, pid, r in children:
        with os.fdopen(r, "rb") as f:
            start, end, gaps = pickle.load(f)
        os.waitpid(pid, 0)
        span = max(1, end - start)
        # Each gap holds (length - LOST_US) instants that are more than LOST_US late.
        late_ns = sum(max(0, length - LOST_US * 1000) for _, length in gaps)
        out.append({"cpu": cpu,
                    "over_per_s": sum(1 for _, n in gaps if n > LOST_US * 1000) / (span / 1e9),
                    "longest_us": max((n for _, n in gaps), default=0) / 1e3,
                    "late_pct": 100.0 * late_ns / span})
    return out


def spin_losses(seconds):
    for c in spin_off_cpu(seconds):
        print(f"spinning on CPU {c['cpu']}: gaps over {LOST_US:.0f} µs {c['over_per_s']:.0f}/s "
              f"(longest {c['longest_us']:.0f} µs); instants more than {LOST_US:.0f} µs "
              f"before the thread runs again: {c['late_pct']:.2f}%")


def hold_cpu_latency(us):
    """Hold a CPU latency request of `us` µs (/dev/cpu_dma_latency) until this process
    exits; returns its descriptor, or None when `us` is None (no request)."""
    if us is None:
        return None
    try:
        fd = os.open("/dev/cpu_dma_latency", os.O_WRONLY)
        os.write(fd, struct.pack("=i", us))
    except OSError as e:
        sys.exit(f"--cpu-latency-us: /dev/cpu_dma_latency: {e} (needs root)")
    return fd


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=4.0, help="length of each part")
    ap.add_argument("--gaps", default="25,250,2700,8000",
                    help="µs the sleeper waits before each signal, separated by commas")
    ap.add_argument("--cpu-latency-us", type=int, default=None,
                    help="hold a CPU latency request of this many µs for the run "
                         "(/dev/cpu_dma_latency, root); 0: idle CPUs poll")
    args = ap.parse_args()
    held = ""
    if hold_cpu_latency(args.cpu_latency_us) is not None:
        held = f", a CPU latency request of {args.cpu_latency_us} µs held"
    print(f"# machine jitter ({time.strftime('%Y-%m-%d')}, {os.cpu_count()} CPUs{held})")
    timer_lateness(args.seconds)
    memory_stalls(args.seconds)
    wake_latency(args.seconds, [int(g) for g in args.gaps.split(",")])
    spin_losses(args.seconds)


if __name__ == "__main__":
    main()
