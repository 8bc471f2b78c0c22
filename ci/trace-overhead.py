#!/usr/bin/env python3
"""What `serve --trace` and `serve --cmd-log` cost in IOPS with the ideal model.

The daemon (`serve --transport blk --model ideal --timing off`, image in tmpfs) is driven
by tools/blkbench (libblkio, virtio-blk-vhost-user) from outside a VM, once without
tracing, once with `--trace`, once with `--cmd-log` (and once with both), the
configurations alternating job by job and round by round (A B C D, B C D A, ...) so that
all see the same machine load; each round's ratio (traced IOPS / plain IOPS) compares
runs a few seconds apart. Prints, per job, every round's ratios and their median.

With `--transport mmc` the daemon serves virtio-mmc and the client is
guest-tests/virtio-mmc's `virtio-mmc-bench` (raw requests, depth 1 and 16); the jobs are
then its rows (CMD13, CMD17 512 B, CMD23+CMD18 4 KiB) and their requests/s is compared.

Usage: ci/trace-overhead.py [--seconds S] [--rounds N] [--jobs randread:4k:32,...]
                            [--configs plain,trace,cmd-log,both] [--transport blk|mmc]
                            [--dir DIR]
Builds the release binaries (vhost-user-emmc, tools/blkbench, virtio-mmc-bench) first.
"""

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
bench = __import__("bench-vs-qsd")

ROOT = bench.ROOT
EMMC = bench.EMMC
CONFIGS = ["plain", "trace", "cmd-log", "both"]
MMC_BENCH = os.path.join(ROOT, "target", "release", "virtio-mmc-bench")


class MmcDaemon:
    """`serve --transport mmc --model ideal --timing off` and virtio-mmc-bench."""

    def __init__(self, image, sock, extra):
        self.cmd = [EMMC, "serve", "--create", "--transport", "mmc", "--socket", sock, "--image", image,
                    "--model", "ideal", "--timing", "off", *extra]
        self.sock = sock

    def run(self, seconds):
        proc = subprocess.Popen(self.cmd, stderr=subprocess.DEVNULL)
        try:
            bench.wait_for_socket(self.sock, proc, "vhost-user-emmc serve")
            out = subprocess.run([MMC_BENCH, "--socket", self.sock, "--seconds", str(seconds)],
                                 check=True, capture_output=True, text=True).stdout
        finally:
            bench.stop(proc)
            if os.path.exists(self.sock):
                os.unlink(self.sock)
        rows = {}
        for line in out.splitlines():
            cells = line.rsplit(None, 6)
            if len(cells) == 7 and cells[1].isdigit():
                rows[f"{cells[0]} QD{cells[1]}"] = float(cells[3])
        return rows


def extra(config, workdir):
    trace = ["--trace", os.path.join(workdir, "trace.txt")]
    cmd_log = ["--cmd-log", os.path.join(workdir, "cmd.log")]
    return {"plain": [], "trace": trace, "cmd-log": cmd_log, "both": trace + cmd_log}[config]


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=5.0, help="run time per job")
    ap.add_argument("--rounds", type=int, default=5, help="alternating rounds")
    ap.add_argument("--jobs", default="randread:4k:32,randread:4k:1,randwrite:4k:1",
                    help="blkbench jobs, comma-separated")
    ap.add_argument("--configs", default=",".join(CONFIGS),
                    help="configurations compared, comma-separated; plain first")
    ap.add_argument("--transport", choices=["blk", "mmc"], default="blk")
    ap.add_argument("--dir", default="/dev/shm", help="tmpfs for the image and the logs")
    args = ap.parse_args()
    jobs = args.jobs.split(",")
    configs = args.configs.split(",")
    if configs[0] != "plain" or any(c not in CONFIGS for c in configs):
        sys.exit(f"--configs: plain first, then some of {CONFIGS[1:]}")
    bench.log("building release binaries")
    subprocess.run(["cargo", "build", "--release", "--quiet", "-p", "vhost-user-emmc",
                    "-p", "blkbench", "-p", "virtio-mmc-driver"], cwd=ROOT, check=True)
    if args.transport == "mmc":
        return main_mmc(args, configs)
    workdir = tempfile.mkdtemp(prefix="vue-trace.", dir=args.dir)
    iops = {job: {c: [] for c in configs} for job in jobs}
    try:
        sock = os.path.join(workdir, "vhost.sock")
        image = os.path.join(workdir, "card.img")
        subprocess.run([EMMC, "image", "create", "--model", "ideal", image], check=True,
                       stdout=subprocess.DEVNULL)
        offset, _ = bench.user_area(image)
        with open(image, "r+b") as f:
            f.seek(offset)
            chunk = os.urandom(1 << 20)
            for _ in range(1024):
                f.write(chunk)
        for r in range(args.rounds):
            order = configs[r % len(configs):] + configs[:r % len(configs)]
            for job in jobs:
                for config in order:
                    backend = bench.Emmc(image, sock, "ideal", "off",
                                         extra=extra(config, workdir))
                    res = bench.run_one(backend, job, args.seconds)
                    iops[job][config].append(res["iops"])
                    bench.log(f"round {r + 1} {job} {config}: {res['iops']:.0f} IOPS")
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    print(f"# cost of tracing ({time.strftime('%Y-%m-%d %H:%M')}, {os.cpu_count()} CPUs, "
          f"load {os.getloadavg()[0]:.2f}); serve --model ideal --timing off, "
          f"{args.seconds:g} s per job, {args.rounds} alternating rounds\n")
    print("| job | plain IOPS (median) | config | ratio per round | median ratio |")
    print("|---|---|---|---|---|")
    for job in jobs:
        plain = iops[job]["plain"]
        for config in configs[1:]:
            ratios = [t / p for t, p in zip(iops[job][config], plain)]
            print(f"| {job} | {statistics.median(plain):.0f} | {config} | "
                  + " ".join(f"{x:.3f}" for x in ratios)
                  + f" | {statistics.median(ratios):.3f} |")


def main_mmc(args, configs):
    workdir = tempfile.mkdtemp(prefix="vue-trace.", dir=args.dir)
    rate = {}
    try:
        sock = os.path.join(workdir, "mmc.sock")
        image = os.path.join(workdir, "card.img")
        subprocess.run([EMMC, "image", "create", "--model", "ideal", image], check=True,
                       stdout=subprocess.DEVNULL)
        for r in range(args.rounds):
            order = configs[r % len(configs):] + configs[:r % len(configs)]
            for config in order:
                rows = MmcDaemon(image, sock, extra(config, workdir)).run(args.seconds)
                for row, v in rows.items():
                    rate.setdefault(row, {c: [] for c in configs})[config].append(v)
                bench.log(f"round {r + 1} {config}: "
                          + ", ".join(f"{k} {v:.0f}/s" for k, v in rows.items()))
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    print(f"# cost of tracing, virtio-mmc ({time.strftime('%Y-%m-%d %H:%M')}, "
          f"{os.cpu_count()} CPUs, load {os.getloadavg()[0]:.2f}); serve --transport mmc "
          f"--model ideal --timing off, virtio-mmc-bench {args.seconds:g} s per row, "
          f"{args.rounds} alternating rounds\n")
    print("| request | plain requests/s (median) | config | ratio per round | median ratio |")
    print("|---|---|---|---|---|")
    for row, by in rate.items():
        plain = by["plain"]
        for config in configs[1:]:
            ratios = [t / p for t, p in zip(by[config], plain)]
            print(f"| {row} | {statistics.median(plain):.0f} | {config} | "
                  + " ".join(f"{x:.3f}" for x in ratios)
                  + f" | {statistics.median(ratios):.3f} |")


if __name__ == "__main__":
    main()
