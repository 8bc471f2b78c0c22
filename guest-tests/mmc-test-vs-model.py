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
round trips and the guest's own request path. With --cmd-log (the run's daemon command
log) the card time the daemon charged for those very commands stands beside the
prediction: the two agreeing means the model's time reached the guest intact. The host's
share is measured on its own by the
same cases on the `ideal` model (zero card time: the guest's time per transfer less the
bus time is the host's), given as --baseline; card time plus host time is then the
prediction of what mmc_test reports, transfer by transfer.

  mmc-test-vs-model.py --json mmc-test.json --model M [--baseline ideal.json]
                       [--cmd-log cmd.log] [--bin PATH] [--markdown FILE]

mmc-test.json is mmc-test-table.py's --json of a `run-guest-test.sh --jobs mmc-test
--model M` run (its --save directory has it).
"""

import argparse
import json
import os
import re
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


def parse_bus(text):
    """(timing, clock Hz, width) from the job's "timing=8 (mmc DDR52); clock=52000000;
    width=8" (debugfs ios)."""
    fields = dict(part.strip().split("=", 1) for part in text.split(";") if "=" in part)
    spec = fields.get("timing", "")
    if "HS200" in spec:
        timing = "hs200"
    elif "DDR52" in spec:
        timing = "ddr52"
    elif "high-speed" in spec:
        timing = "hs"
    else:
        sys.exit(f"a bus the model comparison does not know: {text!r}")
    try:
        return timing, int(fields["clock"]), int(fields["width"])
    except (KeyError, ValueError):
        sys.exit(f"no clock or width in the bus {text!r}")


def guest_bus_model(model, bus, directory):
    """A model file: `model` as the daemon serves it, on the bus the guest chose, without
    the model's host software time. Returns its path."""
    timing, clock, width = parse_bus(bus)
    os.makedirs(directory, exist_ok=True)
    path = os.path.join(directory, "guest-bus.toml")
    with open(path, "w", encoding="utf-8") as f:
        f.write(f'''name = "{model}-guest-bus"
description = "{model} on the bus the guest chose, no host software time"
extends = "{model}"  # [assumed] the card as the daemon serves it

[host]
name = "guest-bus"
description = "SDHCI, {timing} at {clock} Hz, {width}-bit, no host software time"
extends = "sdhci-hs52"  # [assumed] no host software time: the guest's is measured, not modelled
timing = "{timing}"  # [assumed] the bus mode the guest's MMC core chose (debugfs ios)
clock_hz = {clock}  # [assumed] the clock it runs at (debugfs ios)
bus_width = {width}  # [assumed] its data lines (debugfs ios)
''')
    return path


def size_text(size):
    return f"{size // 1024} KiB" if size >= 1024 else f"{size} B"


def transfers(parsed, path):
    """{(direction, bytes): transfer} of the consecutive cases in one run's JSON."""
    out = {}
    for direction, name in CASES:
        case = next((c for c in parsed["cases"] if c["name"] == name), None)
        if case is None or case["result"] != "OK" or not case["transfers"]:
            sys.exit(f"case {name!r} did not run or did not pass in {path}")
        for t in case["transfers"]:
            out[(direction, t["sectors"] * 512)] = t
    return out


CMDLOG_LINE = re.compile(r"^(\d+) CMD(\d+) .*\bdur=(\d+)")
CMDLOG_DATA = re.compile(r"\bdata=(read|write):(\d+)x512\b")


def daemon_card_times(path, groups):
    """The card time the daemon charged for each group, from its command log
    (`serve --cmd-log`): groups is [((direction, sectors, count), key)] in the order the
    guest ran them. A group is the next `count` data commands of that direction and
    length (the last `count` of such a run, as mmc_test's random write case repeats its
    warm-up); its time is the sum of their `dur` and of the commands between and after
    them (CMD12's busy, CMD13 polls), up to the next data command or erase. Returns
    {key: seconds}; a group it cannot find is left out."""
    cmds = []
    with open(path, encoding="utf-8", errors="replace") as f:
        for line in f:
            m = CMDLOG_LINE.match(line)
            if m:
                data = CMDLOG_DATA.search(line)
                cmds.append((int(m.group(2)), data.group(1) if data else None,
                             int(data.group(2)) if data else 0, int(m.group(3))))
    out = {}
    i = 0
    for (direction, sectors, count), key in groups:
        # The next run of data commands of this shape at least `count` long (shorter ones,
        # such as the partition scan's reads at boot, are passed over).
        while i < len(cmds):
            while i < len(cmds) and not (cmds[i][1] == direction and cmds[i][2] == sectors):
                i += 1
            run = []
            j = i
            while j < len(cmds):
                op, d, n, _ = cmds[j]
                if d is not None:
                    if d != direction or n != sectors:
                        break
                    run.append(j)
                elif op in (35, 36, 38):
                    break
                j += 1
            if len(run) >= count:
                first = run[-count]
                total = sum(c[3] for c in cmds[first:j] if c[0] not in (35, 36, 38))
                out[key] = total / 1e9
                i = j
                break
            i = max(j, i + 1)
    return out


def load(path, bus_override=None, capacity_override=None):
    with open(path, encoding="utf-8") as f:
        parsed = json.load(f)
    capacity = capacity_override or parsed.get("capacity")
    bus = bus_override or parsed.get("bus")
    if not capacity or not bus:
        sys.exit(f"{path} has no capacity or bus (MMCTEST-CAPACITY, MMCTEST-BUS): rerun the "
                 "guest with this version, or pass --capacity and --bus")
    if "clock=" not in bus:
        sys.exit(f"{path}: the bus {bus!r} lacks its clock: rerun the guest with this version")
    return parsed, capacity, bus


def card_seconds(binary, model_file, direction, t, capacity):
    """The model's card time for one consecutive-case phase of transfer t."""
    size = t["sectors"] * 512
    area = size * t["count"]
    # mmc_test_area_init: half the capacity, down to a multiple of the area.
    dev_addr = capacity // 2
    dev_addr -= dev_addr % (area // 512)
    return simulate(binary, model_file, direction, size, t["count"], dev_addr * 512)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", required=True, help="mmc-test-table.py --json of the run")
    ap.add_argument("--model", required=True)
    ap.add_argument("--baseline", help="--json of an `--model ideal` run (cases 30 and 31 "
                    "suffice): the host's own time per transfer, which is added to the model's")
    ap.add_argument("--cmd-log", help="the run's command log (its --save directory has it): "
                    "adds the card time the daemon charged for the same transfers")
    ap.add_argument("--bin", default=os.path.join(os.path.dirname(HERE), "target", "release",
                                                  "vhost-user-emmc"))
    ap.add_argument("--markdown", help="write the table as markdown to this file")
    ap.add_argument("--bus", help="the guest's bus as the job prints it ('timing=8 (mmc DDR52); "
                    "clock=52000000; width=8'), for a run whose JSON lacks it")
    ap.add_argument("--capacity", type=int,
                    help="the card's sectors, for a run whose JSON lacks them")
    args = ap.parse_args()
    parsed, capacity, bus = load(args.json, args.bus, args.capacity)
    tmp = tempfile.mkdtemp(prefix="mmc-test-vs-model.")
    model = guest_bus_model(args.model, bus, os.path.join(tmp, "m"))
    run = transfers(parsed, args.json)
    base = None
    if args.baseline:
        b_parsed, b_capacity, b_bus = load(args.baseline)
        base = (transfers(b_parsed, args.baseline), b_capacity,
                guest_bus_model("ideal", b_bus, os.path.join(tmp, "b")))
    charged = {}
    if args.cmd_log:
        charged = daemon_card_times(args.cmd_log, [((d, t["sectors"], t["count"]), (d, size))
                                                   for (d, size), t in run.items()])
    rows = []
    for (direction, size), t in run.items():
        n = t["count"]
        guest_us = t["seconds"] / n * 1e6
        card_us = card_seconds(args.bin, model, direction, t, capacity) / n * 1e6
        daemon_us = charged[(direction, size)] / n * 1e6 if (direction, size) in charged else None
        host_us = None
        if base and (direction, size) in base[0]:
            b = base[0][(direction, size)]
            b_card = card_seconds(args.bin, base[2], direction, b, base[1]) / b["count"] * 1e6
            host_us = b["seconds"] / b["count"] * 1e6 - b_card
        rows.append((direction, size, n, t["kib_s"], guest_us, card_us, host_us, daemon_us))
    shutil.rmtree(tmp, ignore_errors=True)
    head = ["case", "transfer", "count", "mmc_test (KiB/s)", "µs per transfer, guest",
            "card time the model predicts (µs)"]
    if args.cmd_log:
        head += ["card time the daemon charged (µs)"]
    head += ["guest − card (µs)"]
    if base:
        head += ["host time, ideal run (µs)", "card + host (µs)", "guest vs card + host"]
    out = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for d, size, n, kib, guest_us, card_us, host_us, daemon_us in rows:
        cells = [f"consecutive {d}", size_text(size), str(n), str(kib), f"{guest_us:.0f}",
                 f"{card_us:.0f}"]
        if args.cmd_log:
            cells.append("" if daemon_us is None else f"{daemon_us:.0f}")
        cells.append(f"{guest_us - card_us:.0f}")
        if base:
            if host_us is None:
                cells += ["", "", ""]
            else:
                pred = card_us + host_us
                cells += [f"{host_us:.0f}", f"{pred:.0f}", f"{(guest_us - pred) / pred * 100:+.0f}%"]
        out.append("| " + " | ".join(cells) + " |")
    text = (f"{args.model}, the guest's bus: {bus}. Card time: `simulate` of the same "
            "transfers on a fresh card, that bus, no host software time"
            + (f"; host time: the `ideal` run ({args.baseline}) minus its own card time"
               if base else "") + ".\n\n" + "\n".join(out) + "\n")
    sys.stdout.write(text)
    if args.markdown:
        with open(args.markdown, "w", encoding="utf-8") as f:
            f.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
