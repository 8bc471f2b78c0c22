#!/usr/bin/env python3
"""Tests of sdhci-checks.py on synthetic runs: EXT_CSD explained byte by byte (and an
unexplained byte failing), discard ranges from the command log, fsync counting."""

import importlib.util
import os
import sys
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
spec = importlib.util.spec_from_file_location("sdhci_checks", os.path.join(HERE, "sdhci-checks.py"))
sc = importlib.util.module_from_spec(spec)
spec.loader.exec_module(sc)

INSPECT = """CID: aa
  PNM [103:56]: 0x454d55343541  "EMU45A"
EXT_CSD: revision 6
 Modes segment [0-191]
  CACHE_CTRL [33]: 0x00       R/W/E_P  cache off
  CONTEXT_CONF [37]: 00 × 15    R/W/E_P  all closed
  GP_SIZE_MULT [143]: 01 00 02 00 00 00 00 00 00 00 00 00 R/W  GP
  HS_TIMING [185]: 0x00       R/W/E_P  backward-compatible
 Properties segment [192-511]
  EXT_CSD_REV [192]: 0x06       R        eMMC 4.5/4.51
  BKOPS_STATUS [246]: 0x00       R        none
  SEC_COUNT [212]: 0x00e90000 R        sectors
 Reserved bytes: all 0
"""


def write(d, name, text):
    path = os.path.join(d, name)
    with open(path, "w", encoding="utf-8") as f:
        f.write(text)
    return path


def guest_bytes(changes):
    b = bytearray(512)
    b[192] = 6
    b[212:216] = bytes([0, 0, 0xE9, 0])
    b[143] = 1
    b[145] = 2
    for i, v in changes.items():
        b[i] = v
    return bytes(b)


def cmd_log(lines):
    return "# log\n# fields\n" + "".join(f"{1000 + i} {t}\n" for i, t in enumerate(lines))


class Tests(unittest.TestCase):
    def setUp(self):
        self.d = tempfile.mkdtemp()
        self.model, self.fields, self.pnm = sc.parse_inspect(write(self.d, "m.txt", INSPECT))

    def test_inspect_parsed_to_bytes(self):
        self.assertEqual(self.pnm, "EMU45A")
        self.assertEqual(self.model[212:216], bytes([0, 0, 0xE9, 0]))
        self.assertEqual(self.model[143], 1)
        self.assertEqual(self.model[145], 2)
        self.assertEqual(self.fields["CONTEXT_CONF"], (37, 15, "R/W/E_P  all closed"[:24]))

    def extcsd(self, guest, cmds):
        c = sc.Checks()
        sh = {"card-extcsd": (0, f"EXTCSD-HEX: {guest.hex()}\nMMC-EXTCSD-BEGIN\n"
                                 "Extended CSD rev 1.6\n[HS_TIMING: 0x01]\nMMC-EXTCSD-END")}
        sc.check_extcsd(c, sh, self.model, self.model, self.fields,
                        sc.parse_cmd_log(write(self.d, "c.log", cmd_log(cmds))))
        return c

    def test_switched_fields_reset_by_power_off_are_explained(self):
        c = self.extcsd(guest_bytes({185: 1, 33: 1, 246: 2}),
                        ["CMD6 SWITCH arg=0x03b90100 R1b", "CMD6 SWITCH arg=0x03210100 R1b"])
        self.assertEqual(c.failures, [])

    def test_a_byte_no_cmd6_wrote_is_unexplained(self):
        c = self.extcsd(guest_bytes({185: 1, 192: 7}), ["CMD6 SWITCH arg=0x03b90100 R1b"])
        self.assertTrue(any("without an explanation" in f for f in c.failures), c.failures)

    def test_mmc_utils_disagreeing_with_debugfs_fails(self):
        c = self.extcsd(guest_bytes({}), [])
        self.assertTrue(any("mmc-utils prints HS_TIMING" in f for f in c.failures), c.failures)

    def test_discard_ranges_and_secure_refusal(self):
        gt = {"GT_DISCARD_LEN": "1048576", "GT_DISCARD_OFFSET": "1048576",
              "GT_SECDISCARD_OFFSET": "2097152"}
        log = ["CMD35 ERASE_GROUP_START arg=0x00000800 R1", "CMD13 SEND_STATUS arg=0x00010000 R1",
               "CMD36 ERASE_GROUP_END arg=0x00000fff R1", "CMD38 ERASE arg=0x00000003 R1b"]
        cmds = sc.parse_cmd_log(write(self.d, "d.log", cmd_log(log)))
        c = sc.Checks()
        sc.check_discard(c, {"card-discard": (0, "DISCARD-RESULT: discard rc=0\n"
                                                 "DISCARD-RESULT: secure rc=1\n")}, gt, cmds)
        self.assertEqual(c.failures, [])
        c = sc.Checks()
        sc.check_discard(c, {"card-discard": (0, "DISCARD-RESULT: discard rc=0\n"
                                                 "DISCARD-RESULT: secure rc=0\n")}, gt, cmds)
        self.assertEqual(len(c.failures), 1)

    def test_fewer_flushes_than_fsyncs_fails(self):
        fio = {"card-fsync": (0, '{"jobs": [{"jobname": "f", "sync": {"total_ios": 3}}]}')}
        flush = "CMD6 SWITCH arg=0x03200101 R1b"
        c = sc.Checks()
        sc.check_fsync(c, fio, sc.parse_cmd_log(write(self.d, "f.log", cmd_log([flush] * 3))))
        self.assertEqual(c.failures, [])
        c = sc.Checks()
        sc.check_fsync(c, fio, sc.parse_cmd_log(write(self.d, "g.log", cmd_log([flush] * 2))))
        self.assertEqual(len(c.failures), 1)


if __name__ == "__main__":
    sys.stdout = open(os.devnull, "w")  # the checks print as they go
    unittest.main()
