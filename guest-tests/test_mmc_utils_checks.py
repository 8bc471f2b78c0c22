#!/usr/bin/env python3
"""Tests of mmc-utils-checks.py: a run where the card did what mmc-utils asked passes, and
each way a card could fail it (partitioning not in effect after the power cycle, power-on
write protection surviving it, the RPMB counter lost, sanitize never reaching the card,
inspect disagreeing) fails the named check."""

import os
import subprocess
import sys
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
USER = 15269888  # sectors, generic-emmc45's user area


def ext(**fields):
    """512 bytes of EXT_CSD as hex: HC_WP_GRP_SIZE 1, HC_ERASE_GRP_SIZE 1 (512 KiB units)."""
    e = bytearray(512)
    e[221] = 1
    e[224] = 1
    for offset, value in fields.items():
        e[int(offset[1:])] = value
    return e.hex()


def boot1(**over):
    steps = {"status": 0, "wp-get": 0, "wp-set": 0, "wp-get-after": 0, "write-boot0": 1,
             "write-boot1": 0, "bootpart": 0, "cache-off": 0, "cache-on": 0, "bkops": 0,
             "gp-create": 0, "enh-area": 0, "sanitize": 0, "status-end": 0}
    steps.update(over.get("steps", {}))
    part = ext(o143=16, o140=8, o156=1, o155=1, o179=0x48, o163=1, o33=1)
    lines = [f"MMCU-SIZE user {USER}", "SEND_STATUS response: 0x00000900",
             f"MMCU-STEP status rc={steps['status']}",
             f"MMCU-EXTCSD wp-set {over.get('wp_set', ext(o174=0x01))}",
             f"MMCU-EXTCSD bootpart {ext(o179=0x48)}", f"MMCU-EXTCSD cache-off {ext(o33=0)}",
             f"MMCU-EXTCSD cache-on {ext(o33=1)}", f"MMCU-EXTCSD bkops {ext(o163=1)}",
             f"MMCU-EXTCSD partitioning {over.get('partitioning', part)}",
             "SEND_STATUS response: 0x00000900", f"MMCU-STEP status-end rc={steps['status-end']}"]
    lines += [f"MMCU-STEP {k} rc={v}" for k, v in steps.items() if k not in ("status", "status-end")]
    return ("@@GT-SH-BEGIN card-rpmb@@\nok\n@@GT-SH-END card-rpmb rc=0@@\n"
            "@@GT-SH-BEGIN mmc-utils@@\n" + "\n".join(lines) + "\n@@GT-SH-END mmc-utils rc=0@@\n")


def boot2(gp0=16384, boot_wp=0, counter=1, write_boot0=0):
    lines = [f"MMCU-SIZE user {USER - 16384 if gp0 else USER}"]
    if gp0:
        lines.append(f"MMCU-SIZE gp0 {gp0}")
    lines += ["SEND_STATUS response: 0x00000900", "MMCU-STEP status rc=0",
              f"MMCU-STEP write-boot0 rc={write_boot0}",
              f"Counter value: 0x{counter:08x}", "MMCU-STEP rpmb-counter rc=0",
              f"MMCU-EXTCSD after {ext(o174=boot_wp, o179=0x48, o163=1, o155=1)}"]
    return "@@GT-SH-BEGIN mmc-utils@@\n" + "\n".join(lines) + "\n@@GT-SH-END mmc-utils rc=0@@\n"


CMDLOG = ("1 CMD6 SWITCH arg=0x03a50101 write-byte SANITIZE_START[165]=0x01 R1 0x00000900 tran "
          "dur=2039\n")


def inspect(partitioning="completed, in effect", counter=1, boot_wp="0x00"):
    """`inspect --image` output, as much of it as the checks read (the other EXT_CSD
    fields are 0)."""
    user_kib = (USER - 16384) // 2
    return ("EXT_CSD: revision 6\n"
            " Modes segment [0-191]\n"
            "  CACHE_CTRL [33]: 0x00       R/W/E_P  cache off\n"
            "  PARTITION_SETTING_COMPLETED [155]: 0x01       R/W      completed\n"
            "  BKOPS_EN [163]: 0x01       R/W      manual\n"
            f"  BOOT_WP_STATUS [174]: {boot_wp}       R        x\n"
            "  PARTITION_CONFIG [179]: 0x48       R/W/E & R/W/E_P  boot 1\n"
            " Reserved bytes: all 0\n\n"
            "Card state (kept with the image):\n"
            f"  partitions: user {user_kib} KiB, boot1 4096 KiB, boot2 4096 KiB, rpmb 4096 KiB, "
            "gp1 8192 KiB\n"
            f"  partitioning: {partitioning}\n"
            f"  RPMB: authentication key programmed, write counter {counter}\n")


class ChecksTest(unittest.TestCase):
    def run_checks(self, b1=None, b2=None, cmdlog=CMDLOG, insp=None):
        with tempfile.TemporaryDirectory() as d:
            files = {}
            for name, text in (("b1", b1 or boot1()), ("b2", b2 or boot2()), ("cmd", cmdlog),
                               ("insp", insp or inspect())):
                files[name] = os.path.join(d, name)
                with open(files[name], "w", encoding="utf-8") as f:
                    f.write(text)
            run = subprocess.run([sys.executable, os.path.join(HERE, "mmc-utils-checks.py"),
                                  "--boot1", files["b1"], "--boot2", files["b2"],
                                  "--cmd-log", files["cmd"], "--inspect", files["insp"]],
                                 capture_output=True, text=True, check=False)
            return run.returncode, run.stdout

    def assert_fails(self, needle, **kw):
        rc, out = self.run_checks(**kw)
        self.assertEqual(rc, 1, out)
        failed = [line for line in out.splitlines() if line.strip().startswith("FAIL")]
        self.assertTrue(any(needle in line for line in failed), out)

    def test_a_card_that_did_everything_passes(self):
        rc, out = self.run_checks()
        self.assertEqual(rc, 0, out)
        self.assertIn("mmc-utils checks: 0 failed", out)

    def test_partitioning_not_in_effect_after_the_power_cycle(self):
        self.assert_fails("mmcblk0gp0 is there", b2=boot2(gp0=0))
        self.assert_fails("partitioning in effect",
                          insp=inspect(partitioning="completed, takes effect at the next power-up"))

    def test_power_on_protection_surviving_power(self):
        self.assert_fails("power-on write protection ended", b2=boot2(boot_wp=1, write_boot0=1))
        self.assert_fails("BOOT_WP_STATUS 0x00", insp=inspect(boot_wp="0x01"))

    def test_protection_that_never_took(self):
        self.assert_fails("writeprotect boot set 0", b1=boot1(wp_set=ext(o174=0)))
        self.assert_fails("fails while it is protected", b1=boot1(steps={"write-boot0": 0}))

    def test_rpmb_counter_lost(self):
        self.assert_fails("read-counter: 1", b2=boot2(counter=0))
        self.assert_fails("write counter 1", insp=inspect(counter=0))

    def test_sanitize_that_never_reached_the_card(self):
        self.assert_fails("mmc sanitize", cmdlog="")

    def test_gp_size_other_than_asked(self):
        self.assert_fails("mmc gp create", b1=boot1(partitioning=ext(o143=8, o140=8, o156=1, o155=1)))


if __name__ == "__main__":
    unittest.main()
