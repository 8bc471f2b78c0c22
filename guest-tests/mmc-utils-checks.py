#!/usr/bin/env python3
"""Checks of guest-tests/mmc-utils.sh: what mmc-utils did in the guest, against EXT_CSD as
the guest read it after each step, against the daemon's command log, and against
`vhost-user-emmc inspect --image` after the power cycle.

  mmc-utils-checks.py --boot1 DATA_LOG --boot2 DATA_LOG --cmd-log CMD_LOG --inspect FILE

DATA_LOG: the results port's log of each boot (jobs/card-rpmb.sh and jobs/mmc-utils.sh,
then jobs/mmc-utils.sh again with GT_MMCU_BOOT=2); CMD_LOG: the first boot's daemon command log; FILE: inspect
of the image after the second boot. Prints one line per check; exit status 1 if any failed.
"""

import argparse
import importlib.util
import os
import re
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
# sdhci-checks.py's parser of `inspect` output (its EXT_CSD bytes), shared rather than
# written again.
_spec = importlib.util.spec_from_file_location("sdhci_checks", os.path.join(HERE, "sdhci-checks.py"))
sdhci_checks = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(sdhci_checks)

GP1_KIB = 8192  # jobs/mmc-utils.sh: mmc gp create -c 8192 1 0 0
ENH_KIB = 4096  # mmc enh_area set -y 0 4096
# EXT_CSD offsets (JESD84-B45 7.4).
ENH_START_ADDR, ENH_SIZE_MULT, GP_SIZE_MULT = 136, 140, 143
PARTITION_SETTING_COMPLETED, PARTITIONS_ATTRIBUTE = 155, 156
BKOPS_EN, BOOT_WP_STATUS, PARTITION_CONFIG, CACHE_CTRL = 163, 174, 179, 33
HC_WP_GRP_SIZE, HC_ERASE_GRP_SIZE = 221, 224


def job_output(text, job):
    m = re.search(rf"@@GT-SH-BEGIN {re.escape(job)}@@\n(.*?)@@GT-SH-END {re.escape(job)} "
                  r"rc=(\d+)@@", text.replace("\r", ""), re.S)
    return (m.group(1), int(m.group(2))) if m else (None, None)


def parse_job(body):
    """({step: rc}, {name: bytes(512)}, {size name: sectors}, {step: output})."""
    steps, extcsd, sizes, outputs = {}, {}, {}, {}
    pending = []
    for line in (body or "").splitlines():
        m = re.match(r"^MMCU-STEP (\S+) rc=(\d+)$", line)
        if m:
            steps[m.group(1)] = int(m.group(2))
            outputs[m.group(1)] = "\n".join(pending)
            pending = []
            continue
        m = re.match(r"^MMCU-EXTCSD (\S+) ([0-9a-fA-F]*)$", line)
        if m:
            hexs = m.group(2)
            extcsd[m.group(1)] = bytes.fromhex(hexs) if len(hexs) == 1024 else None
            continue
        m = re.match(r"^MMCU-SIZE (\S+) (\d+)$", line)
        if m:
            sizes[m.group(1)] = int(m.group(2))
            continue
        if line.startswith("+ "):
            pending = []
        else:
            pending.append(line)
    return steps, extcsd, sizes, outputs


def le(e, offset, n):
    return int.from_bytes(e[offset:offset + n], "little")


def card_state(text):
    """The "Card state" lines of `inspect --image` that the checks read."""
    state = {}
    for line in text.splitlines():
        m = re.match(r"^\s+(partitions|partitioning|RPMB): (.*)$", line)
        if m:
            state[m.group(1)] = m.group(2)
    return state


class Checks:
    def __init__(self):
        self.failed = 0

    def check(self, ok, what, detail=""):
        print(f"  {'ok  ' if ok else 'FAIL'} {what}" + (f" ({detail})" if detail else ""))
        if not ok:
            self.failed += 1


def status_is_tran(output):
    m = re.search(r"0x([0-9a-fA-F]{8})", output or "")
    if not m:
        return False, "no status in the output"
    v = int(m.group(1), 16)
    return ((v >> 9) & 0xF) == 4 and v & 0xFFF80000 == 0, f"{v:#010x}"


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--boot1", required=True)
    ap.add_argument("--boot2", required=True)
    ap.add_argument("--cmd-log", required=True)
    ap.add_argument("--inspect", required=True)
    args = ap.parse_args()
    with open(args.boot1, encoding="utf-8", errors="replace") as f:
        boot1 = f.read()
    with open(args.boot2, encoding="utf-8", errors="replace") as f:
        boot2 = f.read()
    with open(args.cmd_log, encoding="utf-8", errors="replace") as f:
        cmds = f.read().splitlines()
    after, _, _ = sdhci_checks.parse_inspect(args.inspect)
    with open(args.inspect, encoding="utf-8", errors="replace") as f:
        state = card_state(f.read())
    c = Checks()

    body, rc = job_output(boot1, "mmc-utils")
    steps, ext, sizes, out = parse_job(body)
    print("first boot (jobs/card-rpmb.sh, jobs/mmc-utils.sh):")
    c.check(body is not None and rc == 0, "the mmc-utils job ran", f"rc={rc}")
    _, rpmb_rc = job_output(boot1, "card-rpmb")
    c.check(rpmb_rc == 0, "mmc rpmb write-key, read-counter, write-block, read-block (card-rpmb)",
            f"rc={rpmb_rc}")
    ok, why = status_is_tran(out.get("status"))
    c.check(steps.get("status") == 0 and ok, "mmc status get: tran, no error bits", why)
    e = ext.get("wp-set")
    c.check(steps.get("wp-set") == 0 and e is not None and e[BOOT_WP_STATUS] == 0x01,
            "mmc writeprotect boot set 0: BOOT_WP_STATUS says boot area 1 power-on protected, "
            "area 2 not", f"BOOT_WP_STATUS {e[BOOT_WP_STATUS]:#04x}" if e else "no EXT_CSD")
    c.check(steps.get("write-boot0", 0) != 0, "a write to mmcblk0boot0 fails while it is protected")
    c.check(steps.get("write-boot1") == 0, "a write to mmcblk0boot1 goes through")
    e = ext.get("bootpart")
    c.check(steps.get("bootpart") == 0 and e is not None and e[PARTITION_CONFIG] & 0x78 == 0x48,
            "mmc bootpart enable 1 1: PARTITION_CONFIG boot partition 1, BOOT_ACK",
            f"{e[PARTITION_CONFIG]:#04x}" if e else "no EXT_CSD")
    e_off, e_on = ext.get("cache-off"), ext.get("cache-on")
    c.check(steps.get("cache-off") == 0 and e_off is not None and e_off[CACHE_CTRL] == 0,
            "mmc cache disable: CACHE_CTRL 0")
    c.check(steps.get("cache-on") == 0 and e_on is not None and e_on[CACHE_CTRL] == 1,
            "mmc cache enable: CACHE_CTRL 1")
    e = ext.get("bkops")
    c.check(steps.get("bkops") == 0 and e is not None and e[BKOPS_EN] & 1 == 1,
            "mmc bkops_en manual: BKOPS_EN bit 0")
    e = ext.get("partitioning")
    unit_kib = None
    if e is not None:
        unit_kib = e[HC_WP_GRP_SIZE] * e[HC_ERASE_GRP_SIZE] * 512
    ok = (steps.get("gp-create") == 0 and steps.get("enh-area") == 0 and e is not None
          and bool(unit_kib) and le(e, GP_SIZE_MULT, 3) * unit_kib == GP1_KIB
          and le(e, ENH_SIZE_MULT, 3) * unit_kib == ENH_KIB and le(e, ENH_START_ADDR, 4) == 0
          and e[PARTITIONS_ATTRIBUTE] & 1 == 1 and e[PARTITION_SETTING_COMPLETED] & 1 == 1)
    c.check(ok, f"mmc gp create -c {GP1_KIB} 1 and enh_area set -y 0 {ENH_KIB}: GP_SIZE_MULT_1, "
            "ENH_SIZE_MULT, ENH_START_ADDR, ENH_USR, PARTITION_SETTING_COMPLETED",
            f"unit {unit_kib} KiB, GP1 x{le(e, GP_SIZE_MULT, 3)}, ENH x{le(e, ENH_SIZE_MULT, 3)}"
            if e else "no EXT_CSD")
    c.check(sizes.get("user") is not None and "gp0" not in sizes,
            "no general purpose partition before the power cycle")
    sanitize = [ln for ln in cmds if "SANITIZE_START[165]=0x01" in ln]
    c.check(steps.get("sanitize") == 0 and len(sanitize) == 1 and " tran " in sanitize[0]
            and "err=" not in sanitize[0],
            "mmc sanitize: one CMD6 SANITIZE_START in the daemon's command log, accepted in tran",
            sanitize[0][:120] if sanitize else "not in the command log")
    ok, why = status_is_tran(out.get("status-end"))
    c.check(steps.get("status-end") == 0 and ok, "mmc status get at the end: tran", why)

    body2, rc2 = job_output(boot2, "mmc-utils")
    steps2, ext2, sizes2, out2 = parse_job(body2)
    print("second boot, after the daemon's power cycle (jobs/mmc-utils.sh, GT_MMCU_BOOT=2):")
    c.check(body2 is not None and rc2 == 0, "the mmc-utils job ran", f"rc={rc2}")
    gp0 = sizes2.get("gp0")
    c.check(gp0 == GP1_KIB * 2, f"/dev/mmcblk0gp0 is there, {GP1_KIB} KiB",
            f"{gp0} sectors" if gp0 else "absent")
    u1, u2 = sizes.get("user"), sizes2.get("user")
    c.check(u1 is not None and u2 == u1 - GP1_KIB * 2, "the user area shrank by GP1",
            f"{u1} -> {u2} sectors")
    e = ext2.get("after")
    c.check(e is not None and e[BOOT_WP_STATUS] == 0 and steps2.get("write-boot0") == 0,
            "power-on write protection ended with the power cycle: mmcblk0boot0 takes writes",
            f"BOOT_WP_STATUS {e[BOOT_WP_STATUS]:#04x}" if e else "no EXT_CSD")
    c.check(e is not None and e[PARTITION_CONFIG] & 0x78 == 0x48 and e[BKOPS_EN] & 1 == 1
            and e[PARTITION_SETTING_COMPLETED] & 1 == 1,
            "PARTITION_CONFIG, BKOPS_EN and PARTITION_SETTING_COMPLETED survived")
    m = re.search(r"Counter value: (0x[0-9a-fA-F]+)", out2.get("rpmb-counter", ""))
    c.check(steps2.get("rpmb-counter") == 0 and m is not None and int(m.group(1), 16) == 1,
            "mmc rpmb read-counter: 1 (the first boot's one authenticated write)",
            m.group(1) if m else "no counter")
    ok, why = status_is_tran(out2.get("status"))
    c.check(steps2.get("status") == 0 and ok, "mmc status get: tran", why)

    print("vhost-user-emmc inspect --image, after both boots:")
    c.check(after[PARTITION_CONFIG] == 0x48, "PARTITION_CONFIG 0x48",
            f"{after[PARTITION_CONFIG]:#04x}")
    c.check(after[BKOPS_EN] == 0x01, "BKOPS_EN 0x01", f"{after[BKOPS_EN]:#04x}")
    c.check(after[PARTITION_SETTING_COMPLETED] == 0x01, "PARTITION_SETTING_COMPLETED 0x01",
            f"{after[PARTITION_SETTING_COMPLETED]:#04x}")
    c.check(after[BOOT_WP_STATUS] == 0x00,
            "BOOT_WP_STATUS 0x00 (power-on protection does not outlive power)",
            f"{after[BOOT_WP_STATUS]:#04x}")
    c.check(after[CACHE_CTRL] == 0x00, "CACHE_CTRL 0x00 (volatile: off at power-up)",
            f"{after[CACHE_CTRL]:#04x}")
    parts = state.get("partitions", "")
    c.check(f"gp1 {GP1_KIB} KiB" in parts and u2 is not None and f"user {u2 // 2} KiB" in parts,
            "partitions: GP1 and the user area as the guest sees them", parts)
    c.check(state.get("partitioning") == "completed, in effect", "partitioning in effect",
            state.get("partitioning"))
    c.check(state.get("RPMB") == "authentication key programmed, write counter 1",
            "RPMB key programmed, write counter 1", state.get("RPMB"))
    print(f"mmc-utils checks: {c.failed} failed")
    return 1 if c.failed else 0


if __name__ == "__main__":
    sys.exit(main())
