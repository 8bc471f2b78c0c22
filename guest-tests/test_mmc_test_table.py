#!/usr/bin/env python3
"""Tests of mmc-test-table.py: the mmc-test job's output (in the kernel's own line formats
of drivers/mmc/core/mmc_test.c) into cases, and the comparison with the expectations."""

import importlib.util
import os
import subprocess
import sys
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
spec = importlib.util.spec_from_file_location("mmc_test_table",
                                              os.path.join(HERE, "mmc-test-table.py"))
table = importlib.util.module_from_spec(spec)
spec.loader.exec_module(table)


def job_log(cases, hung=None, rc=0):
    """A results-port log holding the mmc-test job: cases is [(n, name, klog lines)]."""
    out = ["@@GT-BEGIN@@", "@@GT-SH-BEGIN mmc-test@@", "unbinding mmc0:0001 from mmcblk",
           "MMCTEST-CARD mmc0:0001 EMU45A on mmc0", "MMCTEST-LIST-BEGIN", "0:\tRun all tests"]
    out += [f"{n}:\t{name}" for n, name, _ in cases]
    out.append("MMCTEST-LIST-END")
    out.append("MMCTEST-CASES " + " ".join(str(n) for n, _, _ in cases))
    t = 10.0
    for n, name, klog in cases:
        out.append(f"MMCTEST-CASE {n} start={t:.2f}")
        t += 1.5
        out.append(f"MMCTEST-CASE-END {n} rc={124 if n == hung else 0} end={t:.2f}")
        out.append(f"MMCTEST-KLOG-BEGIN {n}")
        out.append(f"[   {t:.6f}] mmc0: Test case {n}. {name}...")
        out += [f"[   {t:.6f}] {line}" for line in klog]
        out.append(f"MMCTEST-KLOG-END {n}")
        if n == hung:
            out.append(f"MMCTEST-HUNG {n} after 600 s")
            break
        out += [f"MMCTEST-RESULT-BEGIN {n}", f"Test {n}: 0", f"MMCTEST-RESULT-END {n}"]
    out += [f"@@GT-SH-END mmc-test rc={rc}@@", "@@GT-END@@"]
    return "\n".join(out) + "\n"


CASES = [
    (1, "Basic write (no data verification)", ["mmc0: Result: OK"]),
    (7, "Power of two block writes", ["mmc0: Result: UNSUPPORTED (by card)"]),
    (17, "Proper xfer_size at write (midway failure)", ["mmc0: Result: ERROR (-84)"]),
    (23, "Best-case read performance", ["mmc0: Result: Prepare stage failed! (-5)"]),
    (27, "Single read performance by transfer size", [
        "mmc0: Transfer of 1 sectors (0.5 KiB) took 0.001706500 seconds (300 kB/s, 293 KiB/s, 585.99 IOPS)",
        "mmc0: Transfer of 8192 sectors (4096 KiB) took 0.250000000 seconds "
        "(16777 kB/s, 16384 KiB/s, 4.00 IOPS)",
        "mmc0: Result: OK"]),
    (33, "Random read performance by transfer size", [
        "mmc0: Transfer of 5617 x 1 sectors (5617 x 0.5 KiB) took 10.000513100 seconds "
        "(287 kB/s, 280 KiB/s, 561.67 IOPS, sg_len 1)",
        "mmc0: Result: OK"]),
]


class ParseTest(unittest.TestCase):
    def test_results_names_times_and_transfers(self):
        parsed = table.parse(job_log(CASES))
        self.assertEqual(parsed["card"], "mmc0:0001 EMU45A on mmc0")
        by_n = {c["number"]: c for c in parsed["cases"]}
        self.assertEqual([c["number"] for c in parsed["cases"]], [1, 7, 17, 23, 27, 33])
        self.assertEqual(by_n[1]["result"], "OK")
        self.assertEqual(by_n[7]["result"], "UNSUPPORTED (by card)")
        self.assertEqual(by_n[17]["result"], "ERROR (-84)")
        self.assertEqual(by_n[23]["result"], "PREPARE FAILED (-5)")
        self.assertEqual(by_n[27]["name"], "Single read performance by transfer size")
        self.assertAlmostEqual(by_n[27]["seconds"], 1.5)
        one, big = by_n[27]["transfers"]
        self.assertEqual((one["count"], one["sectors"], one["kib_s"]), (1, 1, 293))
        self.assertAlmostEqual(one["seconds"], 0.0017065)
        self.assertEqual((big["sectors"], big["kib_s"], big["iops"]), (8192, 16384, 4.0))
        (avg,) = by_n[33]["transfers"]
        self.assertEqual((avg["count"], avg["sectors"], avg["sg_len"]), (5617, 1, 1))
        self.assertAlmostEqual(avg["iops"], 561.67)
        self.assertEqual(table.size_text(8192), "4 MiB")
        self.assertEqual(table.size_text(1), "0.5 KiB")

    def test_a_hung_case_and_the_cases_after_it(self):
        parsed = table.parse(job_log(CASES, hung=17, rc=1))
        by_n = {c["number"]: c["result"] for c in parsed["cases"]}
        self.assertEqual(by_n[17], "HUNG")
        self.assertEqual(by_n[23], "NOT RUN")
        self.assertEqual(by_n[33], "NOT RUN")

    def test_cases_the_run_did_not_take_are_left_out(self):
        log = job_log(CASES).replace("MMCTEST-CASES 1 7 17 23 27 33", "MMCTEST-CASES 1 7")
        parsed = table.parse(log)
        # Cases outside the selection are not reported as missing.
        self.assertNotIn("NOT RUN", [c["result"] for c in parsed["cases"]])
        parsed = table.parse(job_log(CASES[:2]).replace("MMCTEST-CASES 1 7", "MMCTEST-CASES 1 7 17"))
        self.assertEqual([c["result"] for c in parsed["cases"]][-1], "NOT RUN")
        self.assertEqual(len(parsed["cases"]), 3)

    def test_no_job_output(self):
        self.assertIsNone(table.parse("@@GT-BEGIN@@\n@@GT-END@@\n"))


class CompareTest(unittest.TestCase):
    def expect(self, **over):
        e = {name: ("OK", "") for _, name, _ in CASES}
        e["Power of two block writes"] = ("UNSUPPORTED (by card)", "WRITE_BL_PARTIAL is 0")
        e.update(over)
        return e

    def test_worse_fails_better_is_a_note(self):
        parsed = table.parse(job_log(CASES))
        expect = self.expect(**{"Proper xfer_size at write (midway failure)": ("ERROR", ""),
                                "Best-case read performance": ("FAILED", "")})
        # 17 ERROR (-84) against ERROR: same family, passes. 23 PREPARE FAILED against
        # FAILED: worse, fails.
        failures, notes = table.compare(parsed["cases"], expect)
        self.assertEqual(len(failures), 1, failures)
        self.assertIn("case 23", failures[0])
        expect = self.expect(**{"Power of two block writes": ("FAILED", "")})
        expect["Proper xfer_size at write (midway failure)"] = ("ERROR", "")
        expect["Best-case read performance"] = ("PREPARE FAILED", "")
        failures, notes = table.compare(parsed["cases"], expect)
        self.assertEqual(failures, [])
        self.assertTrue(any("better than the expected FAILED" in n for n in notes), notes)

    def test_an_error_where_ok_is_expected_fails(self):
        parsed = table.parse(job_log(CASES))
        failures, _ = table.compare(parsed["cases"], self.expect())
        self.assertTrue(any("case 17" in f and "ERROR (-84), expected OK" in f for f in failures))
        self.assertTrue(any("case 23" in f for f in failures))

    def test_cases_the_run_did_not_take_are_not_held_against_it(self):
        log = job_log(CASES).replace("MMCTEST-CASES 1 7 17 23 27 33", "MMCTEST-CASES 1 7")
        # Only cases 1 and 7 ran (the others' lines are dropped as a real run would).
        keep = []
        skip = False
        for line in log.splitlines():
            if line.startswith("MMCTEST-CASE ") and line.split()[1] not in ("1", "7"):
                skip = True
            if line.startswith("@@GT-SH-END"):
                skip = False
            if not skip:
                keep.append(line)
        parsed = table.parse("\n".join(keep) + "\n")
        self.assertEqual([c["number"] for c in parsed["cases"]], [1, 7])
        skipped = {name for n, name in parsed["names"].items() if n not in parsed["selected"]}
        failures, _ = table.compare(parsed["cases"], self.expect(), skipped)
        self.assertEqual(failures, [])
        failures, _ = table.compare(parsed["cases"], self.expect())
        self.assertEqual(len(failures), 4, failures)

    def test_a_case_missing_from_the_kernel_fails(self):
        parsed = table.parse(job_log(CASES[:2]))
        failures, _ = table.compare(parsed["cases"], self.expect())
        self.assertTrue(any("Random read performance" in f and "not in this kernel" in f
                            for f in failures), failures)


class ExpectTest(unittest.TestCase):
    def test_a_model_line_replaces_the_line_for_all_models_on_that_model_only(self):
        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, "e.txt")
            with open(path, "w", encoding="utf-8") as f:
                f.write("# N | case | expected | reason\n"
                        "48 | Commands during read | OK |\n"
                        "48 | Commands during read | UNSUPPORTED (by card) | quirk | a-model, b\n")
            self.assertEqual(table.read_expect(path)["Commands during read"], ("OK", ""))
            self.assertEqual(table.read_expect(path, "generic")["Commands during read"][0], "OK")
            self.assertEqual(table.read_expect(path, "b")["Commands during read"],
                             ("UNSUPPORTED (by card)", "quirk"))


class NothingMovedTest(unittest.TestCase):
    def test_a_performance_case_that_moved_nothing_is_marked(self):
        cases = [(35, "Large sequential read into scattered pages", [
            "mmc0: Transfer of 0 x 1024 sectors (0 x 512 KiB) took 0.000027864 seconds "
            "(0 kB/s, 0 KiB/s, 0.00 IOPS, sg_len 0)", "mmc0: Result: OK"]),
                 (37, "Write performance with blocking req 4k to 4MB", ["mmc0: Result: OK"]),
                 (1, "Basic write (no data verification)", ["mmc0: Result: OK"])]
        parsed = table.parse(job_log(cases))
        marked = {c["number"]: c["nothing_moved"] for c in parsed["cases"]}
        self.assertEqual(marked, {1: False, 35: True, 37: True})
        self.assertIn("OK, nothing transferred", table.text_table(parsed))
        parsed = table.parse(job_log(CASES))
        self.assertFalse(any(c["nothing_moved"] for c in parsed["cases"]))


class CommandTest(unittest.TestCase):
    def test_exit_status_and_markdown(self):
        with tempfile.TemporaryDirectory() as d:
            log = os.path.join(d, "data.log")
            with open(log, "w", encoding="utf-8") as f:
                f.write(job_log(CASES))
            exp = os.path.join(d, "expected.txt")
            with open(exp, "w", encoding="utf-8") as f:
                f.write("# N | case | expected | reason\n")
                for n, name, klog in CASES:
                    want = klog[-1].split("Result: ", 1)[1].replace(
                        "Prepare stage failed! (-5)", "PREPARE FAILED")
                    f.write(f"{n} | {name} | {want} | \n")
            md = os.path.join(d, "t.md")
            run = subprocess.run([sys.executable, os.path.join(HERE, "mmc-test-table.py"), log,
                                  "--expect", exp, "--markdown", md, "--title", "T"],
                                 capture_output=True, text=True, check=False)
            self.assertEqual(run.returncode, 0, run.stdout + run.stderr)
            self.assertIn("mmc-test: PASS", run.stdout)
            with open(md, encoding="utf-8") as f:
                text = f.read()
            self.assertIn("| 33 | 0.5 KiB | 5617 | 10.001 | 280 | 561.67 |", text)
            # By transfer size: single read (27) and random read (33) side by side.
            self.assertIn("| transfer | single read (27) | random read (33) |", text)
            self.assertIn("| 0.5 KiB | 293 | 280 |", text)
            self.assertIn("| 4 MiB | 16384 |  |", text)
            with open(exp, "a", encoding="utf-8") as f:
                f.write("52 | A case this kernel lacks | OK |\n")
            run = subprocess.run([sys.executable, os.path.join(HERE, "mmc-test-table.py"), log,
                                  "--expect", exp], capture_output=True, text=True, check=False)
            self.assertEqual(run.returncode, 1)
            self.assertIn("mmc-test: FAIL", run.stdout)


if __name__ == "__main__":
    unittest.main()
