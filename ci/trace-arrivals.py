#!/usr/bin/env python3
"""How long after a slot was freed does a `serve --trace` record the next arrival?

At a fixed queue depth QD a client resubmits as soon as a request completes, so the
i-th request (in arrival order) takes the slot the (i − QD)-th completion (in completion
order) freed. This prints the distribution of `arrival(i) − completion(i − QD)` in card
time, from the trace's data lines (docs/trace-format.md). With a client that polls and
resubmits at once, what is left is the time the daemon took to see the request: see
docs/performance.md, "Arrivals seen during the spin".

Usage: ci/trace-arrivals.py TRACE QD
"""

import sys


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__.strip().splitlines()[-1])
    path, qd = sys.argv[1], int(sys.argv[2])
    rows = []
    with open(path) as f:
        for line in f:
            fields = line.split()
            if line.startswith("#") or len(fields) < 5 or fields[1] not in ("R", "W"):
                continue
            rows.append((int(fields[0]), int(fields[4])))
    if len(rows) <= qd:
        sys.exit(f"{path}: {len(rows)} requests, not more than QD {qd}")
    arrivals = sorted(a for a, _ in rows)
    done = sorted(d for _, d in rows)
    waits = sorted((arrivals[i] - done[i - qd]) / 1000 for i in range(qd, len(arrivals)))

    def q(p):
        return waits[min(len(waits) - 1, int(p * len(waits)))]

    print(f"{path}: {len(waits)} requests at QD {qd}; arrival after the completion that "
          f"freed its slot: p50 {q(0.5):.1f}, p90 {q(0.9):.1f}, p99 {q(0.99):.1f}, "
          f"max {waits[-1]:.1f} µs")


if __name__ == "__main__":
    main()
