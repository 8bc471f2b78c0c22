#!/usr/bin/env python3
"""Tests of parse-fio.py's checks (and vhost-user-trace.py's) on synthetic guest
output (no guest needed).

Run: python3 guest-tests/test_parse_fio.py
"""

import json
import os
import subprocess
import sys
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))


def fio_doc(write_clat_min_ns, error=0, total_err=0, first_error=0):
    clat = {"N": 10, "min": write_clat_min_ns, "max": write_clat_min_ns * 3,
            "mean": write_clat_min_ns * 2,
            "percentile": {"50.000000": write_clat_min_ns * 2,
                           "99.000000": write_clat_min_ns * 3}}
    return {"jobs": [{
        "jobname": "w", "error": error, "total_err": total_err, "first_error": first_error,
        "job options": {},
        "write": {"total_ios": 10, "io_bytes": 40960, "iops": 100.0, "bw": 400,
                  "clat_ns": clat},
        "read": {"total_ios": 0},
    }]}


def data_log(doc, dmesg=("virtio_blk virtio0: [vda] 2097152 512-byte logical blocks",)):
    lines = ["@@GT-BEGIN@@", "@@GT-FIO-BEGIN randrw@@", json.dumps(doc),
             "@@GT-FIO-END randrw rc=0@@", "@@GT-DMESG-BEGIN@@", *dmesg,
             "@@GT-DMESG-END@@", "@@GT-END@@"]
    return "\n".join(lines) + "\n"


class ParseFio(unittest.TestCase):
    def run_parse(self, log_text, trace_text=None, extra=()):
        with tempfile.TemporaryDirectory() as d:
            log = os.path.join(d, "data.log")
            with open(log, "w") as f:
                f.write(log_text)
            cmd = [sys.executable, os.path.join(HERE, "parse-fio.py"), log,
                   "--jobs", "randrw", *extra]
            if trace_text is not None:
                trace = os.path.join(d, "serve.trace")
                with open(trace, "w") as f:
                    f.write(trace_text)
                cmd += ["--model-trace", trace]
            p = subprocess.run(cmd, capture_output=True, text=True)
            return p.returncode, p.stdout

    def test_a_clean_run_passes(self):
        rc, out = self.run_parse(data_log(fio_doc(250_000)))
        self.assertEqual(rc, 0, out)

    def test_writes_faster_than_the_model_fail(self):
        # The model says a 4 KiB write takes 3 ms; the guest saw one complete in 250 us.
        trace = "# serve\n0 W 0 4096 3000000\n4000000 W 4096 4096 7100000\n"
        rc, out = self.run_parse(data_log(fio_doc(250_000)), trace)
        self.assertEqual(rc, 1, out)
        self.assertIn("below the model's minimum 3000.0 us", out)

    def test_writes_no_faster_than_the_model_pass(self):
        trace = "0 W 0 4096 200000\n# 300000 GET_ID 300100\n"
        rc, out = self.run_parse(data_log(fio_doc(250_000)), trace)
        self.assertEqual(rc, 0, out)
        self.assertIn("modelled latency min 200.0", out)

    def test_a_trace_with_a_completion_before_its_arrival_fails(self):
        rc, out = self.run_parse(data_log(fio_doc(250_000)), "5000000 W 0 4096 4000000\n")
        self.assertEqual(rc, 1, out)
        self.assertIn("before it arrived", out)

    def test_an_explicit_floor_applies_without_a_trace(self):
        rc, out = self.run_parse(data_log(fio_doc(250_000)),
                                 extra=["--expect-min-write-lat-us", "5000"])
        self.assertEqual(rc, 1, out)

    def test_boot_reads_in_the_trace_need_no_reads_in_fio(self):
        # A write-only job set: the trace's only reads are the boot's partition scan.
        trace = "1000 R 0 4096 200000\n5000000 W 0 4096 5200000\n"
        rc, out = self.run_parse(data_log(fio_doc(250_000)), trace)
        self.assertEqual(rc, 0, out)
        self.assertIn("the model's read floor checks nothing", out)
        # A read floor asked for by hand still needs reads to check.
        rc, out = self.run_parse(data_log(fio_doc(250_000)), trace,
                                 extra=["--expect-min-read-lat-us", "100"])
        self.assertEqual(rc, 1, out)
        self.assertIn("no reads to check the read latency against", out)

    def test_io_errors_and_kernel_complaints_fail(self):
        rc, out = self.run_parse(data_log(fio_doc(250_000, error=5)))
        self.assertEqual(rc, 1, out)
        self.assertIn("fio error 5", out)
        rc, out = self.run_parse(data_log(
            fio_doc(250_000), dmesg=("blk_update_request: I/O error, dev vda, sector 8",)))
        self.assertEqual(rc, 1, out)

    def test_injected_io_errors_must_show_and_be_eio(self):
        io_error = ("blk_update_request: I/O error, dev vda, sector 8",)
        expect = ("--expect-errors", "randrw")
        # Errors where faults were injected, and the kernel saying so: a pass.
        rc, out = self.run_parse(
            data_log(fio_doc(250_000, total_err=12, first_error=5), dmesg=io_error),
            extra=expect)
        self.assertEqual(rc, 0, out)
        self.assertIn("12 I/O errors reported", out)
        # Faults injected but fio saw none: the faults never reached the guest.
        rc, out = self.run_parse(data_log(fio_doc(250_000)), extra=expect)
        self.assertEqual(rc, 1, out)
        self.assertIn("no I/O errors although faults were injected", out)
        # Only EIO was injected: another error is a failure.
        rc, out = self.run_parse(
            data_log(fio_doc(250_000, total_err=3, first_error=84)), extra=expect)
        self.assertEqual(rc, 1, out)
        # A kernel oops is never excused.
        rc, out = self.run_parse(
            data_log(fio_doc(250_000, total_err=3, first_error=5),
                     dmesg=("BUG: unable to handle page fault",)), extra=expect)
        self.assertEqual(rc, 1, out)

    def test_a_guest_that_never_finished_fails(self):
        text = data_log(fio_doc(250_000)).replace("@@GT-END@@\n", "")
        rc, out = self.run_parse(text)
        self.assertEqual(rc, 1, out)
        self.assertIn("end marker", out)

    def sh_log(self, rc, dmesg=()):
        """A run with one shell job (before the fio job, as guest-init.sh writes it)."""
        text = data_log(fio_doc(250_000), dmesg=dmesg)
        return text.replace("@@GT-BEGIN@@\n", "@@GT-BEGIN@@\n@@GT-SH-BEGIN probe@@\n"
                            f"card: QEMU!!\nWRITE-RESULT: hung\n@@GT-SH-END probe rc={rc}@@\n")

    def test_shell_jobs_are_printed_and_must_exit_zero(self):
        rc, out = self.run_parse(self.sh_log(0), extra=["--sh-jobs", "probe"])
        self.assertEqual(rc, 0, out)
        self.assertIn("probe: WRITE-RESULT: hung", out)
        rc, out = self.run_parse(self.sh_log(1), extra=["--sh-jobs", "probe"])
        self.assertEqual(rc, 1, out)
        self.assertIn("probe.sh: exited 1", out)
        rc, out = self.run_parse(self.sh_log(0), extra=["--sh-jobs", "probe,other"])
        self.assertEqual(rc, 1, out)
        self.assertIn("other.sh: no output", out)

    def test_kernel_lines_of_the_device_under_test_can_be_allowed(self):
        dmesg = ("blk_update_request: I/O error, dev mmcblk0, sector 131072 op 0x1:(WRITE)",)
        rc, out = self.run_parse(self.sh_log(0, dmesg), extra=["--sh-jobs", "probe"])
        self.assertEqual(rc, 1, out)
        rc, out = self.run_parse(self.sh_log(0, dmesg),
                                 extra=["--sh-jobs", "probe", "--dmesg-allow", "mmc0|mmcblk0"])
        self.assertEqual(rc, 0, out)
        self.assertIn("1 known (--dmesg-allow)", out)
        # Anything else still fails.
        rc, out = self.run_parse(self.sh_log(0, dmesg + ("BUG: unable to handle page fault",)),
                                 extra=["--sh-jobs", "probe", "--dmesg-allow", "mmc0|mmcblk0"])
        self.assertEqual(rc, 1, out)


class VhostUserTrace(unittest.TestCase):
    def run_trace(self, text):
        with tempfile.TemporaryDirectory() as d:
            log = os.path.join(d, "qemu.log")
            with open(log, "w") as f:
                f.write(text)
            p = subprocess.run([sys.executable, os.path.join(HERE, "vhost-user-trace.py"), log],
                               capture_output=True, text=True)
            return p.returncode, p.stdout

    def test_a_handshake_passes_and_is_named(self):
        rc, out = self.run_trace(
            "vhost_user_write req:1 (GET_FEATURES) flags:0x1\n"
            "vhost_user_read req:1 (GET_FEATURES) flags:0x5\n"
            "123@1.5:vhost_user_write req:15 flags:0x1\n"
            "123@1.6:vhost_user_read req:15 flags:0x5\n"
            + "vhost_user_write req:24 (GET_CONFIG) flags:0x9\n" * 2)
        self.assertEqual(rc, 0, out)
        self.assertIn("GET_FEATURES, GET_PROTOCOL_FEATURES, GET_CONFIG x2", out)

    def test_no_reply_fails(self):
        rc, out = self.run_trace("vhost_user_write req:1 (GET_FEATURES) flags:0x1\n")
        self.assertEqual(rc, 1, out)
        rc, out = self.run_trace("qemu-system-x86_64: Failed to connect to the socket\n")
        self.assertEqual(rc, 1, out)


if __name__ == "__main__":
    unittest.main()
