#!/usr/bin/env python3
"""The simulator benchmark at two revisions, in one run: A/B rounds, medians and ratios.

    ci/bench-ab.py --base REV [--rounds 7] [--measurement-time 2] [--instructions]

Builds `cargo bench --bench simulator` at REV (in a temporary git worktree, with its own
target directory, removed afterwards) and at the working tree, then runs the two bench
binaries alternately, round after round, so that both see the same machine load. Prints
each benchmark's median throughput per side over the rounds, the ratio head / base of
the medians, and the lowest and highest ratio of one round's pair. On this project's
shared machines only such ratios mean anything (docs/performance.md), and a round can be
30% off the next: read the spread before the median.

`--instructions` also counts the instructions of the same work under callgrind (the
`simulate` command, 4 KiB requests, the benchmark's models and patterns): counts do not
depend on the machine's load, so they show a change of a percent the timings cannot.
"""

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile

THRPT = re.compile(
    r"^(?P<name>\S+)\s*\n?\s*time:.*?\n\s*thrpt:\s*\[\S+ \S+ (?P<mid>[\d.]+) (?P<unit>\S+) ",
    re.M,
)
UNITS = {"elem/s": 1.0, "Kelem/s": 1e3, "Melem/s": 1e6, "Gelem/s": 1e9}


def bench_binary(tree: str, target_dir: str) -> str:
    """Build the simulator benchmark in `tree` and return its executable."""
    env = dict(os.environ, CARGO_TARGET_DIR=target_dir)
    out = subprocess.run(
        ["cargo", "bench", "--bench", "simulator", "--no-run", "--message-format=json"],
        cwd=tree,
        env=env,
        check=True,
        stdout=subprocess.PIPE,
    ).stdout.decode()
    for line in out.splitlines():
        msg = json.loads(line)
        if msg.get("reason") == "compiler-artifact" and msg["target"]["name"] == "simulator":
            if msg.get("executable"):
                return msg["executable"]
    sys.exit(f"bench-ab: no simulator bench binary built in {tree}")


def release_binary(tree: str, target_dir: str) -> str:
    """Build the vhost-user-emmc binary in `tree` and return it."""
    env = dict(os.environ, CARGO_TARGET_DIR=target_dir)
    out = subprocess.run(
        ["cargo", "build", "--release", "-p", "vhost-user-emmc", "--message-format=json"],
        cwd=tree, env=env, check=True, stdout=subprocess.PIPE,
    ).stdout.decode()
    for line in out.splitlines():
        msg = json.loads(line)
        if msg.get("reason") == "compiler-artifact" and msg.get("executable") \
                and msg["target"]["name"] == "vhost-user-emmc":
            return msg["executable"]
    sys.exit(f"bench-ab: no vhost-user-emmc binary built in {tree}")


# The benchmark's work as `simulate` runs it: (model, workload), 4 KiB requests, QD1.
WORK = [(m, w) for m in ("ideal", "toshiba-mmc32g", "sandisk-sem32g")
        for w in ("rand-write", "seq-write", "rand-read")]


def instructions(binary: str, model: str, workload: str, count: int) -> int:
    """Instructions callgrind counts for one `simulate` run."""
    out = subprocess.run(
        ["valgrind", "--tool=callgrind", "--callgrind-out-file=/dev/null", binary,
         "simulate", "--model", model, "--workload", workload, "--count", str(count),
         "--span", "1G"],
        check=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
    ).stderr.decode()
    m = re.search(r"Collected : (\d+)", out)
    if not m:
        sys.exit(f"bench-ab: callgrind printed no count:\n{out}")
    return int(m.group(1))


def run_once(binary: str, measurement_time: float) -> dict:
    """One pass of every benchmark: name -> requests per second (criterion's median)."""
    out = subprocess.run(
        [binary, "--bench", "--noplot", "--warm-up-time", "1",
         "--measurement-time", str(measurement_time)],
        check=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    ).stdout.decode()
    found = {m["name"]: float(m["mid"]) * UNITS[m["unit"]] for m in THRPT.finditer(out)}
    if not found:
        sys.exit(f"bench-ab: no throughput in the output of {binary}:\n{out}")
    return found


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--base", required=True, help="git revision to compare against")
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--measurement-time", type=float, default=2.0)
    ap.add_argument("--instructions", action="store_true",
                    help="also count instructions under callgrind (needs valgrind)")
    ap.add_argument("--count", type=int, default=30000,
                    help="requests per callgrind run")
    args = ap.parse_args()
    top = subprocess.run(["git", "rev-parse", "--show-toplevel"], check=True,
                         stdout=subprocess.PIPE).stdout.decode().strip()
    scratch = tempfile.mkdtemp(prefix="bench-ab-")
    base_tree = os.path.join(scratch, "base")
    try:
        subprocess.run(["git", "worktree", "add", "--detach", base_tree, args.base],
                       cwd=top, check=True, stdout=subprocess.DEVNULL)
        print(f"== building the benchmark at {args.base} and at the working tree", flush=True)
        base_bin = bench_binary(base_tree, os.path.join(scratch, "target-base"))
        head_bin = bench_binary(top, os.path.join(top, "target"))
        counts = []
        if args.instructions:
            base_exe = release_binary(base_tree, os.path.join(scratch, "target-base"))
            head_exe = release_binary(top, os.path.join(top, "target"))
            for model, workload in WORK:
                print(f"== callgrind: {model} {workload}", flush=True)
                counts.append((model, workload,
                               instructions(base_exe, model, workload, args.count),
                               instructions(head_exe, model, workload, args.count)))
        runs = {"base": [], "head": []}
        for r in range(args.rounds):
            for side, binary in (("base", base_bin), ("head", head_bin)):
                print(f"== round {r + 1}/{args.rounds}: {side}", flush=True)
                runs[side].append(run_once(binary, args.measurement_time))
    finally:
        subprocess.run(["git", "worktree", "remove", "--force", base_tree], cwd=top,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        shutil.rmtree(scratch, ignore_errors=True)

    names = [n for n in runs["head"][0] if all(n in r for s in runs.values() for r in s)]
    print(f"\nrequests per second, median of {args.rounds} alternating rounds "
          f"(base = {args.base}, head = working tree)")
    print(f"{'benchmark':<34} {'base':>9} {'head':>9} {'head/base':>10} {'rounds':>13}")
    for n in names:
        b = statistics.median(r[n] for r in runs["base"])
        h = statistics.median(r[n] for r in runs["head"])
        pairs = [hr[n] / br[n] for br, hr in zip(runs["base"], runs["head"])]
        print(f"{n:<34} {b / 1e6:>8.2f}M {h / 1e6:>8.2f}M {h / b:>10.3f} "
              f"{min(pairs):>6.2f}-{max(pairs):.2f}")
    if counts:
        print(f"\ninstructions per request under callgrind ({args.count} requests of "
              f"4 KiB, QD1, `simulate`, bring-up included)")
        print(f"{'work':<34} {'base':>9} {'head':>9} {'head/base':>10}")
        for model, workload, b, h in counts:
            print(f"{model + ' ' + workload:<34} {b / args.count:>9.0f} "
                  f"{h / args.count:>9.0f} {h / b:>10.4f}")


if __name__ == "__main__":
    main()
