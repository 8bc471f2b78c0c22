#!/usr/bin/env python3
"""The simulator benchmark at two revisions, in one run: A/B rounds, medians and ratios.

    ci/bench-ab.py --base REV [--rounds 3] [--measurement-time 3]

Builds `cargo bench --bench simulator` at REV (in a temporary git worktree, with its own
target directory, removed afterwards) and at the working tree, then runs the two bench
binaries alternately, round after round, so that both see the same machine load. Prints
each benchmark's median throughput per side over the rounds and the ratio head / base.
On this project's shared machines only such ratios mean anything (docs/performance.md).
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
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--measurement-time", type=float, default=3.0)
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
    print(f"{'benchmark':<34} {'base':>10} {'head':>10} {'head/base':>10}")
    for n in names:
        b = statistics.median(r[n] for r in runs["base"])
        h = statistics.median(r[n] for r in runs["head"])
        print(f"{n:<34} {b / 1e6:>9.2f}M {h / 1e6:>9.2f}M {h / b:>10.3f}")


if __name__ == "__main__":
    main()
