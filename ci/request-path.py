#!/usr/bin/env python3
"""Where each request's time went, from a client's stamps and the daemon's trace of one run.

`serve --timing realtime --trace TRACE` says in a comment where its card time is on
CLOCK_MONOTONIC (`# clock: card time T ns is CLOCK_MONOTONIC M ns, scale S`), and
`blkbench --stamps-out STAMPS` writes each request as `submit_ns wake_ns seen_ns` on
the same clock, in completion order. Requests are paired in completion order (the
trace's lines sorted by their modelled completion), and each request's round trip is
split into:

- to the ring: from the client queueing it to the daemon seeing it (libblkio's submit
  path, and the daemon's look at the ring);
- card started late: how much later the card began it than it could have, had the daemon
  seen it the instant it was queued. The card does one request at a time, so it begins
  one at its arrival or at the previous completion, whichever is later: this is
  `max(arrival, previous due) − max(queued, previous due)`. At a queue depth above one the
  card is often still busy when a request arrives, and then a late look costs nothing;
- card: the modelled latency, arrival to due (the daemon's pacing);
- due → wake: from the instant the completion was due to the client's `ppoll` returning
  (the daemon's lateness, its eventfd write, and the machine waking the client);
- wake → seen: the client's own reaping (`read` of the eventfd, `do_io`);
- due → seen, for requests the client found without sleeping.

Usage: ci/request-path.py TRACE STAMPS [--json]
"""

import json
import math
import re
import sys

ANCHOR = re.compile(r"#\s*clock: card time (\d+) ns is CLOCK_MONOTONIC (\d+) ns, scale ([0-9.eE+-]+)")


def read_trace(path):
    """(anchor, [(arrival, due)]) in trace time; exactly one session (one anchor)."""
    anchors, rows = [], []
    with open(path) as f:
        for line in f:
            m = ANCHOR.match(line)
            if m:
                anchors.append((int(m.group(1)), int(m.group(2)), float(m.group(3))))
                continue
            fields = line.split("#")[0].split()
            if len(fields) == 5:
                rows.append((int(fields[0]), int(fields[4])))
    if len(anchors) != 1:
        sys.exit(f"{path}: {len(anchors)} clock lines; one session (one client) per trace, "
                 "and `serve --timing realtime`, are needed")
    return anchors[0], rows


def read_stamps(path):
    with open(path) as f:
        return [tuple(int(x) for x in line.split()) for line in f if line.strip()]


def quantiles(values):
    if not values:
        return None
    v = sorted(values)

    def q(p):
        # Nearest rank, as blkbench's own quantiles.
        return v[min(len(v) - 1, max(0, math.ceil(p * len(v)) - 1))] / 1000

    return {"n": len(v), "p50_us": q(0.5), "p99_us": q(0.99)}


def split(trace, stamps):
    (card0, mono0, scale), rows = read_trace(trace)
    stamped = read_stamps(stamps)
    if len(rows) != len(stamped):
        sys.exit(f"{trace} has {len(rows)} requests, {stamps} {len(stamped)}: not one run")

    def mono(t):
        return mono0 + (t - card0) * scale

    parts = {k: [] for k in ("to the ring", "card started late", "card", "due → wake", "wake → seen",
                             "due → seen, no sleep", "round trip", "round trip − card")}
    # The client sees completions in the order the daemon signalled them: by due time.
    previous_due = float("-inf")
    for (arrival, due), (submit, wake, seen) in zip(sorted(rows, key=lambda r: r[1]), stamped):
        a, d = mono(arrival), mono(due)
        parts["to the ring"].append(a - submit)
        parts["card started late"].append(max(a, previous_due) - max(submit, previous_due))
        previous_due = d
        parts["card"].append(d - a)
        if wake:
            parts["due → wake"].append(wake - d)
            parts["wake → seen"].append(seen - wake)
        else:
            parts["due → seen, no sleep"].append(seen - d)
        parts["round trip"].append(seen - submit)
        parts["round trip − card"].append(seen - submit - (d - a))
    # A request cannot reach the ring before the client queued it: pairs that say so
    # (beyond the clocks' few tens of nanoseconds) mean the two files are not one run.
    early = sum(1 for t in parts["to the ring"] if t < -1000)
    if early > len(stamped) // 100:
        sys.exit(f"{early} of {len(stamped)} requests reached the ring before the client "
                 f"queued them: {trace} and {stamps} do not pair up")
    return {k: quantiles(v) for k, v in parts.items()}


def main():
    args = [a for a in sys.argv[1:] if a != "--json"]
    if len(args) != 2:
        sys.exit(__doc__.strip().splitlines()[-1])
    result = split(*args)
    if "--json" in sys.argv:
        print(json.dumps(result))
        return
    for name, q in result.items():
        if q:
            print(f"{name:24} {q['n']:7d} requests  p50 {q['p50_us']:9.1f} µs  "
                  f"p99 {q['p99_us']:9.1f} µs")


if __name__ == "__main__":
    main()
