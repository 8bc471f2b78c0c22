#!/usr/bin/env python3
"""Remove each timing mechanism in turn and check that a named calibration test fails.

Every mechanism docs/fidelity.md credits with a seed figure can be switched off by one
value in a model file. For each, this script builds the simulator with that one value
changed (a copy of the tree at HEAD, so the checkout is never touched) and runs the
calibration tests; the tests named for the mechanism must fail. A mechanism whose
removal no test notices is not held by the tests, and the script exits non-zero.

    ci/mechanism-ablation.py [--only NAME] [--keep]

The fidelity table's test counts too: a row leaving its tolerance or its documented gap
band fails it. The copy and its build live under target/ablation/ (a first run builds the workspace's
test dependencies once, about two minutes on two cores; each ablation then rebuilds
emmc-card and what depends on it).
"""

import argparse
import os
import re
import shutil
import subprocess
import sys
import time

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
WORK = os.path.join(ROOT, "target", "ablation")
SRC = os.path.join(WORK, "src")
TESTS = ["calibration", "calibration_packing", "fidelity", "plausibility"]


class Ablation:
    """Set `key = value` in `[section]` of `path` (key None: no value changed), after
    removing the table `drop` if given."""

    def __init__(self, name, mechanism, path, section, key, value, expect, drop=None):
        self.name = name
        self.mechanism = mechanism
        self.path = path
        self.section = section
        self.key = key
        self.value = value
        self.expect = expect
        self.drop = drop

    def apply(self, text):
        if self.drop:
            text = drop_table(text, self.drop)
        if self.key:
            text = set_value(text, self.section, self.key, self.value)
        return text

    def describe(self):
        parts = []
        if self.drop:
            parts.append(f"no [{self.drop}]")
        if self.key:
            parts.append(f"{self.key} = {self.value}")
        return ", ".join(parts)


ABLATIONS = [
    Ablation(
        "toshiba-page-span",
        "a write touching two 8 KiB pages goes to its AU and costs a collection (buffer A rule)",
        "device-models/toshiba-mmc32g.toml", "timing.ftl.buffer_a", "rule", '"consecutive_run"',
        ["toshiba_page_crossing_write_stall_and_its_disappearance_when_split"],
    ),
    Ablation(
        "toshiba-open-aus",
        "a pool of 7 open AUs, the 8th closes one (LRU) and copies its remainder",
        "device-models/toshiba-mmc32g.toml", "timing.ftl", "open_aus_linear", "8",
        ["toshiba_seven_open_aus_cliff"],
    ),
    Ablation(
        "toshiba-write-unit",
        "32 KiB write unit (8 KiB pages x 2 planes x 2 dies): a 16 KiB write is a read-modify-write",
        "device-models/toshiba-mmc32g.toml", "timing.nand", "dies", "1",
        ["toshiba_size_sweep"],
    ),
    Ablation(
        "toshiba-log-merge",
        "64 pages of one AU in the small-write log merge that AU",
        "device-models/toshiba-mmc32g.toml", "timing.ftl.buffer_a", "pages_per_au", "100000",
        ["toshiba_size_sweep"],
    ),
    Ablation(
        "toshiba-read-unit",
        "two planes read together: a read crossing 16 KiB costs a second tR, crossing 8 KiB does not",
        "device-models/toshiba-mmc32g.toml", "timing.nand", "planes", "1",
        ["toshiba_read_crossing_a_read_unit"],
    ),
    Ablation(
        "sandisk-open-aus",
        "a pool of 20 open AUs, the 21st collects one through the controller",
        "device-models/sandisk-sem32g.toml", "timing.ftl", "open_aus_linear", "21",
        ["sandisk_twenty_open_aus_cliff"],
    ),
    Ablation(
        "sandisk-slc-cache",
        "random writes up to 512 KiB programmed into SLC-mode blocks",
        "device-models/sandisk-sem32g.toml", "timing.ftl.slc_cache", "max_write_bytes", "0",
        ["every_seed_figure_is_within_tolerance_or_its_documented_gap"],
    ),
    Ablation(
        "sandisk-sub-page-buffer",
        "writes smaller than a page wait in a buffer that a non-contiguous write flushes",
        "device-models/sandisk-sem32g.toml", "timing.ftl", "coalesce_sub_page", "false",
        ["every_seed_figure_is_within_tolerance_or_its_documented_gap"],
        drop="timing.ftl.sub_page_buffer",
    ),
    Ablation(
        "sandisk-temporary-page",
        "that buffer is a temporary SLC page: each sub-page write is programmed there, a non-contiguous write closes it",
        "device-models/sandisk-sem32g.toml", "", None, None,
        ["every_seed_figure_is_within_tolerance_or_its_documented_gap"],
        drop="timing.ftl.sub_page_buffer",
    ),
    Ablation(
        "sandisk-cache-au-bound",
        "an SLC cache holding data of 96 AUs folds the oldest before one more (no 10 s urgent BKOPS)",
        "device-models/sandisk-sem32g.toml", "timing.ftl.slc_cache", "max_aus", "0",
        ["sandisk_used_card_random_writes_pay_a_fold_each_not_a_stall_of_seconds"],
    ),
    Ablation(
        "sandisk-sequential-cost",
        "a linear write to MLC costs ~4.5 ms beyond its programs",
        "device-models/sandisk-sem32g.toml", "timing.ftl", "sequential_write_ns", "0",
        ["sandisk_random_faster_than_linear"],
    ),
    Ablation(
        "msm-per-request-host-time",
        "per MMC request host time, which packing saves (once per packed command)",
        "device-models/hosts/msm-sdcc-sdr50.toml", "", "request_overhead_ns", "0",
        ["every_seed_figure_is_within_tolerance_or_its_documented_gap"],
    ),
    Ablation(
        "toshiba-host-preparation",
        "the host's time per block request, paid in full by a synchronous caller",
        "device-models/hosts/seed003-toshiba-host.toml", "", "prepare_ns", "0",
        ["toshiba_read_crossing_a_read_unit", "every_seed_figure_is_within_tolerance_or_its_documented_gap"],
    ),
    Ablation(
        "msm-per-command-card-time",
        "the card's per-write-command time, paid once per packed command",
        "device-models/msm-emmc45-sdr50.toml", "timing.controller", "write_command_ns", "0",
        ["msm_sequential_write_without_and_with_packing"],
    ),
]


def set_value(text, section, key, value):
    """`key = value` in `[section]` ("" = before the first table), comment kept."""
    out = []
    current = ""
    done = False
    for line in text.splitlines(keepends=True):
        m = re.match(r"\s*\[([^\]]+)\]", line)
        if m:
            current = m.group(1).strip()
        elif current == section and not done:
            m = re.match(r"(\s*" + re.escape(key) + r"\s*=\s*)([^#\n]*?)(\s*(#.*)?)$", line.rstrip("\n"))
            if m:
                line = m.group(1) + value + m.group(3) + "\n"
                done = True
        out.append(line)
    if not done:
        raise SystemExit(f"ablation: no {key} in [{section or 'top level'}]")
    return "".join(out)


def drop_table(text, section):
    """`text` without the table `[section]` (its header and its lines up to the next table)."""
    out = []
    inside = False
    found = False
    for line in text.splitlines(keepends=True):
        m = re.match(r"\s*\[([^\]]+)\]", line)
        if m:
            inside = m.group(1).strip() == section
            found = found or inside
        if not inside:
            out.append(line)
    if not found:
        raise SystemExit(f"ablation: no [{section}]")
    return "".join(out)


def copy_tree():
    if os.path.exists(SRC):
        shutil.rmtree(SRC)
    os.makedirs(SRC)
    archive = subprocess.run(["git", "-C", ROOT, "archive", "HEAD"], check=True, capture_output=True).stdout
    # -m: the files get the extraction time, newer than any build a previous run left in
    # target/ablation (with the archive's commit times, cargo would take a build of an
    # ablated model for the baseline).
    subprocess.run(["tar", "-x", "-m", "-C", SRC], input=archive, check=True)


def run_tests():
    """Names of the calibration tests that failed; None if the build failed."""
    env = dict(os.environ, CARGO_TARGET_DIR=os.path.join(WORK, "target"))
    cmd = ["cargo", "test", "--quiet", "-p", "emmc-sim", "--no-fail-fast"]
    for t in TESTS:
        cmd += ["--test", t]
    p = subprocess.run(cmd, cwd=SRC, env=env, capture_output=True, text=True)
    out = p.stdout + p.stderr
    if "could not compile" in out or "error[" in out:
        sys.stderr.write(out[-3000:])
        return None
    # Every failing test prints "---- NAME stdout ----", quiet or not, in every binary.
    return set(re.findall(r"^---- (\S+) stdout ----", out, re.M))


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", help="run only the ablation of this name")
    ap.add_argument("--keep", action="store_true", help="keep target/ablation/src afterwards")
    args = ap.parse_args()
    todo = [a for a in ABLATIONS if not args.only or a.name == args.only]
    if not todo:
        raise SystemExit(f"no ablation named {args.only}")
    copy_tree()
    t0 = time.time()
    base = run_tests()
    if base is None or base:
        raise SystemExit(f"baseline: the calibration tests must pass first (failed: {sorted(base or [])})")
    print(f"baseline: calibration tests pass ({time.time() - t0:.0f} s)")
    bad = 0
    for a in todo:
        path = os.path.join(SRC, a.path)
        original = open(path).read()
        open(path, "w").write(a.apply(original))
        t = time.time()
        failed = run_tests()
        open(path, "w").write(original)
        missing = [e for e in a.expect if failed is None or e not in failed]
        status = "ok" if not missing else "NOT NOTICED"
        bad += bool(missing)
        shown = "build failed" if failed is None else (", ".join(sorted(failed)) or "none")
        print(f"{status:12} {a.name}: {a.describe()} ({a.path}) [{time.time() - t:.0f} s]")
        print(f"             mechanism: {a.mechanism}")
        print(f"             failed: {shown}")
        if missing:
            print(f"             expected to fail: {', '.join(missing)}")
    if not args.keep:
        shutil.rmtree(SRC, ignore_errors=True)
    print(f"{len(todo) - bad} of {len(todo)} mechanisms held by a named test")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
