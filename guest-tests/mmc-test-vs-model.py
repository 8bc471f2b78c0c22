#!/usr/bin/env python3
"""mmc_test's consecutive read and write figures beside what the model predicts.

mmc_test's cases "Consecutive read/write performance by transfer size" move its test
area (4 MiB in the middle of the card) in transfers of 512 B, 1 KiB, ... up to the
host's largest, one after another at queue depth 1 (the write case erases the area
before each size), and time them in the guest. The model's prediction for the same
pattern is `vhost-user-emmc simulate --workload seq-read|seq-write --bs SIZE --count N
--offset AREA` on a fresh card (as erased as mmc_test's area), in card time, with the
model's card on the bus the guest's MMC core chose (the run's debugfs ios) and no host
software time (a model file that extends M with such a host). The guest's
figure also holds what the card does not: the SDHCI emulation under TCG, the vfio-user
round trips and the guest's own request path. That part is shown per transfer
(guest time minus model time, divided by the count): a constant there means the card's
timing came through and the rest is the host's.

  mmc-test-vs-model.py --json mmc-test.json --model M [--bin PATH] [--markdown FILE]

mmc-test.json is mmc-test-table.py's --json of a `run-guest-test.sh --jobs mmc-test
--model M` run (its --save directory has it).
"""

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
CASES = (("read", "Consecutive read performance by transfer size"),
         ("write", "Consecutive write performance by transfer size"))


def simulate(binary, model, direction, size, count, offset):
    run = subprocess.run([binary, "simulate", "--model", model, "--workload", f"seq-{direction}",
                          "--bs", str(size), "--count", str(count), "--offset", str(offset),
                          "--json"], capture_output=True, text=True, check=True)
    return json.loads(run.stdout)["card_time_s"]


def guest_bus_model(model, bus, directory):
    """A model file: `model` as the daemon serves it, on the bus the guest chose, without
    the model's host software time. Returns its path."""
    if "HS200" in bus:
        timing = "hs200"
    elif "DDR52" in bus:
        timing = "ddr52"
    else:
        timing = "hs"
    path = os.path.join(directory, "guest-bus.toml")
    with open(path, "w", encoding="utf-8") as f:
        f.write(f'''name = "{model}-guest-bus"
description = "{model} on the bus the guest chose ({bus}), no host software time"
extends = "{model}"  # [assumed] the card as the daemon serves it

[host]
name = "guest-bus"
description = "SDHCI, {timing}, 8-bit, no host software time"
extends = "sdhci-hs52"  # [assumed] no host software time: the guest's is measured, not modelled
timing = "{timing}"  # [assumed] the bus mode the guest's MMC core chose
''')
    return path


def size_text(size):
    return f"{size // 1024} KiB" if size >= 1024 else f"{size} B"


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", required=True, help="mmc-test-table.py --json of the run")
    ap.add_argument("--model", required=True)
    ap.add_argument("--bin", default=os.path.join(os.path.dirname(HERE), "target", "release",
                                                  "vhost-user-emmc"))
    ap.add_argument("--markdown", help="write the table as markdown to this file")
    ap.add_argument("--bus", help="the guest's bus (debugfs ios timing spec), for a run whose "
                    "JSON lacks it")
    ap.add_argument("--capacity", type=int,
                    help="the card's sectors, for a run whose JSON lacks them")
    args = ap.parse_args()
    with open(args.json, encoding="utf-8") as f:
        parsed = json.load(f)
    capacity = args.capacity or parsed.get("capacity")
    if not capacity:
        sys.exit("the run's JSON has no capacity (MMCTEST-CAPACITY): rerun with this version")
    bus = parsed.get("bus") or args.bus
    if not bus:
        sys.exit("the run's JSON has no bus (MMCTEST-BUS): pass --bus, e.g. 'mmc DDR52'")
    tmp = tempfile.mkdtemp(prefix="mmc-test-vs-model.")
    model = guest_bus_model(args.model, bus, tmp)
    rows = []
    for direction, name in CASES:
        case = next((c for c in parsed["cases"] if c["name"] == name), None)
        if case is None or case["result"] != "OK" or not case["transfers"]:
            sys.exit(f"case {name!r} did not run or did not pass in {args.json}")
        for t in case["transfers"]:
            size = t["sectors"] * 512
            area = size * t["count"]
            # mmc_test_area_init: half the capacity, down to a multiple of the area.
            dev_addr = capacity // 2
            dev_addr -= dev_addr % (area // 512)
            model_s = simulate(args.bin, model, direction, size, t["count"], dev_addr * 512)
            guest_kib = t["kib_s"]
            model_kib = area / 1024 / model_s if model_s > 0 else 0.0
            extra_us = (t["seconds"] - model_s) / t["count"] * 1e6
            rows.append((direction, size_text(size), t["count"], guest_kib, model_kib,
                         guest_kib / model_kib if model_kib else 0.0, extra_us))
    head = ("| case | transfer | count | mmc_test in the guest (KiB/s) | model: simulate "
            "(KiB/s) | guest / model | guest − model per transfer (µs) |")
    out = [head, "|---|---|---|---|---|---|---|"]
    for d, size, count, g, m, ratio, extra in rows:
        out.append(f"| consecutive {d} | {size} | {count} | {g} | {m:.0f} | {ratio:.2f} | "
                   f"{extra:.0f} |")
    shutil.rmtree(tmp, ignore_errors=True)
    text = (f"{args.model} on the guest's bus ({bus}); model: `simulate` on a fresh card\n\n"
            + "\n".join(out) + "\n")
    sys.stdout.write(text)
    if args.markdown:
        with open(args.markdown, "w", encoding="utf-8") as f:
            f.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
