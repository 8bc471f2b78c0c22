#!/usr/bin/env python3
"""Tests of fidelity.py (simulated vs measured) on synthetic guest runs, with a fake
simulator in place of vhost-user-emmc (no guest, no build needed).

Run: python3 guest-tests/test_fidelity.py
"""

import importlib.util
import json
import os
import subprocess
import sys
import tempfile
import textwrap
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
_spec = importlib.util.spec_from_file_location("fidelity", os.path.join(HERE, "fidelity.py"))
fidelity = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(fidelity)

# Stands in for `vhost-user-emmc compare ... --json` (or `simulate`): replays nothing,
# reports what FAKE_SIM (JSON) says for the trace it was given, and keeps a copy of
# that trace for the test to look at.
FAKE_SIM = textwrap.dedent("""\
    #!/usr/bin/env python3
    import json, os, shutil, sys
    args = sys.argv[1:]
    trace = args[args.index("--trace") + 1]
    flag = "--models" if "--models" in args else "--model"
    model = args[args.index(flag) + 1]
    cfg = json.loads(os.environ["FAKE_SIM"])
    if cfg.get("fail"):
        print("simulate: the trace is broken", file=sys.stderr)
        sys.exit(3)
    shutil.copy(trace, os.environ["FAKE_SIM_SAVE"])
    ops = {"read": 0, "write": 0}
    for line in open(trace):
        f = line.split("#")[0].split()
        if f:
            ops["read" if f[1] == "R" else "write"] += 1
    out = {d: {"ops": ops[d], "bytes": 0, "mb_per_s": cfg["mb_per_s"], "iops": 0,
               "mean_us": 0, "p50_us": cfg["p50_us"], "p99_us": 0, "p999_us": 0,
               "max_us": 0} for d in ops}
    if cfg.get("shape", "compare") == "compare":
        out = {"runs": [{"model": "other", "read": None, "write": None},
                        {"model": model, "policy": "packing=off", **out}]}
    print(json.dumps(out))
    """)

MIB = 1 << 20


def fio_doc(jobname, rw, offset, size, bs, ios, mb_per_s, p50_us):
    direction = "read" if "read" in rw else "write"
    other = "write" if direction == "read" else "read"
    return {"global options": {"filename": "/dev/vda", "direct": "1", "ioengine": "psync"},
            "jobs": [{"jobname": jobname,
                      "job options": {"rw": rw, "bs": bs, "offset": offset, "size": size},
                      direction: {"total_ios": ios,
                                  "io_bytes": ios * fidelity.size_bytes(bs),
                                  "bw_bytes": int(mb_per_s * 1e6),
                                  "bw": int(mb_per_s * 1e6 / 1024),
                                  "clat_ns": {"N": ios, "percentile": {
                                      "50.000000": int(p50_us * 1000)}}},
                      other: {"total_ios": 0, "io_bytes": 0}}]}


def data_log(*docs):
    lines = ["@@GT-BEGIN@@"]
    for i, doc in enumerate(docs):
        lines += [f"@@GT-FIO-BEGIN job{i}@@", json.dumps(doc), f"@@GT-FIO-END job{i} rc=0@@"]
    lines += ["@@GT-DMESG-BEGIN@@", "@@GT-DMESG-END@@", "@@GT-END@@"]
    return "\n".join(lines) + "\n"


# A boot's partition scan, then four 512 KiB writes at 256 MiB, one at a time: each
# takes the card 18 ms, and the next arrives `turnaround_ms` after it completed.
BOOT = ["# serve", "# time_ns op offset_bytes length_bytes completion_ns",
        "1000000 R 0 4096 1200000", "1300000 R 8589930496 4096 1500000",
        "# 2000000 GET_ID 2000100"]


def writes(turnaround_ms=1):
    step = 18_000_000 + turnaround_ms * 1_000_000
    return [f"{5_000_000_000 + i * step} W {256 * MIB + i * 512 * 1024} 524288 "
            f"{5_000_000_000 + i * step + 18_000_000}" for i in range(4)]


WRITES = writes()


def backend_log(lateness_p50_us=0.0):
    """The daemon's log as run-guest-test.sh --save keeps it: its pacing summary."""
    return ("vhost-user-emmc: serving /tmp/sock\n"
            "[2026-12-03T07:51:19Z INFO  emmc_frontend::pacing] session: 132 completions, "
            f"lateness p50 {lateness_p50_us:.1f} µs, p99 15.7 µs, max 35.0 µs; signalled "
            "p50 7.4 µs, p99 21.3 µs after due; timer wake-ups late p50 78.8 µs, p99 "
            "176.1 µs; spin margin 219 µs\n")


class Fidelity(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()
        self.dir = self.tmp.name
        self.sim = os.path.join(self.dir, "fake-sim")
        with open(self.sim, "w") as f:
            f.write(FAKE_SIM)
        os.chmod(self.sim, 0o755)
        self.replayed = os.path.join(self.dir, "replayed.trace")

    def tearDown(self):
        self.tmp.cleanup()

    def guest_run(self, name, docs, trace_lines, log=None):
        d = os.path.join(self.dir, name)
        os.makedirs(d)
        with open(os.path.join(d, "data.log"), "w") as f:
            f.write(data_log(*docs))
        with open(os.path.join(d, "serve.trace"), "w") as f:
            f.write("\n".join(trace_lines) + "\n")
        with open(os.path.join(d, "backend.log"), "w") as f:
            f.write(backend_log() if log is None else log)
        return d

    def compare(self, runs, sim, extra=()):
        env = dict(os.environ, FAKE_SIM=json.dumps(sim), FAKE_SIM_SAVE=self.replayed)
        cmd = [sys.executable, os.path.join(HERE, "fidelity.py"), "--bin", self.sim,
               "--json", os.path.join(self.dir, "out.json"), *extra]
        for model, d in runs:
            cmd += ["--run", f"{model}={d}"]
        p = subprocess.run(cmd, capture_output=True, text=True, env=env)
        return p.returncode, p.stdout + p.stderr

    def seqwrite(self, mb_per_s=25.0, p50_us=19000.0, ios=4):
        return fio_doc("fid-seqwrite-512k", "write", "256m", "2m", "512k", ios,
                       mb_per_s, p50_us)

    def test_figures_within_the_tolerance_pass(self):
        d = self.guest_run("g", [self.seqwrite()], BOOT + WRITES)
        rc, out = self.compare([("generic-emmc45", d)], {"mb_per_s": 24.0, "p50_us": 17500})
        self.assertEqual(rc, 0, out)
        self.assertIn("tolerance ±10%", out)
        self.assertIn("ok", out)
        with open(os.path.join(self.dir, "out.json")) as f:
            row = json.load(f)["rows"][0]
        self.assertAlmostEqual(row["bw_diff_pct"], -4.0, places=6)
        self.assertAlmostEqual(row["p50_gap_us"], 1500.0, places=6)
        self.assertAlmostEqual(row["turnaround_us"], 1000.0, places=6)
        self.assertAlmostEqual(row["predicted_p50_us"], 18500.0, places=6)
        self.assertAlmostEqual(row["p50_diff_pct"], -500 / 19000 * 100, places=6)

    def test_only_the_jobs_requests_are_replayed_from_zero_without_completions(self):
        d = self.guest_run("g", [self.seqwrite()], BOOT + WRITES)
        rc, out = self.compare([("generic-emmc45", d)], {"mb_per_s": 25.0, "p50_us": 18000})
        self.assertEqual(rc, 0, out)
        with open(self.replayed) as f:
            lines = [ln.split() for ln in f if not ln.startswith("#")]
        self.assertEqual([ln[0] for ln in lines], ["0", "19000000", "38000000", "57000000"])
        self.assertTrue(all(len(ln) == 4 and ln[1] == "W" for ln in lines), lines)
        self.assertEqual(int(lines[0][2]), 256 * MIB)

    def test_a_throughput_11_percent_off_fails(self):
        d = self.guest_run("g", [self.seqwrite()], BOOT + WRITES)
        rc, out = self.compare([("generic-emmc45", d)], {"mb_per_s": 27.75, "p50_us": 18000})
        self.assertEqual(rc, 1, out)
        self.assertIn("DIFFERS", out)
        self.assertIn("throughput +11.0%", out)

    def test_a_p50_12_percent_low_fails(self):
        # 15720 µs of card time and the guest's 1 ms turnaround: 12% short of fio's 19 ms.
        d = self.guest_run("g", [self.seqwrite()], BOOT + WRITES)
        rc, out = self.compare([("generic-emmc45", d)], {"mb_per_s": 25.0, "p50_us": 15720})
        self.assertEqual(rc, 1, out)
        self.assertIn("p50 -12.0%", out)
        self.assertIn("simulator 15720 + turnaround 1000 against fio's 19000 µs", out)

    def test_the_guests_turnaround_is_measured_from_the_trace(self):
        # A loaded machine: fio saw 22 ms for 18 ms of card time. With the 4 ms turnaround
        # the trace shows, the simulator's 18 ms agrees; had the guest turned requests
        # round in 1 ms, 4 ms of fio's latency would be unexplained.
        sim = {"mb_per_s": 20.0, "p50_us": 18000}
        slow = self.guest_run("slow", [self.seqwrite(mb_per_s=20.0, p50_us=22000)],
                              BOOT + writes(turnaround_ms=4))
        rc, out = self.compare([("generic-emmc45", slow)], sim)
        self.assertEqual(rc, 0, out)
        quick = self.guest_run("quick", [self.seqwrite(mb_per_s=20.0, p50_us=22000)],
                               BOOT + writes(turnaround_ms=1))
        rc, out = self.compare([("generic-emmc45", quick)], sim)
        self.assertEqual(rc, 1, out)
        self.assertIn("p50 -13.6%", out)

    def test_requests_in_flight_together_are_refused(self):
        # The turnaround is only the guest's with one request in flight.
        overlapping = [f"{5_000_000_000 + i * 10_000_000} W {256 * MIB + i * 512 * 1024} "
                       f"524288 {5_000_000_000 + i * 10_000_000 + 18_000_000}"
                       for i in range(4)]
        d = self.guest_run("g", [self.seqwrite()], BOOT + overlapping)
        rc, out = self.compare([("generic-emmc45", d)], {"mb_per_s": 25.0, "p50_us": 18000})
        self.assertEqual(rc, 1, out)
        self.assertIn("one request in flight", out)

    def test_a_trace_without_completions_is_refused(self):
        bare = [" ".join(w.split()[:4]) for w in WRITES]
        d = self.guest_run("g", [self.seqwrite()], BOOT + bare)
        rc, out = self.compare([("generic-emmc45", d)], {"mb_per_s": 25.0, "p50_us": 18000})
        self.assertEqual(rc, 1, out)
        self.assertIn("no completion column", out)

    def test_a_daemon_late_at_the_median_is_not_taken_for_the_guests_turnaround(self):
        # The card takes 18 ms, the daemon signals 3 ms after that, the guest turns
        # round in 1 ms: the trace shows 4 ms from the modelled completion to the next
        # arrival, and fio sees 22 ms. The daemon's 3 ms stay in the difference.
        late = self.guest_run("late", [self.seqwrite(mb_per_s=20.0, p50_us=22000)],
                              BOOT + writes(turnaround_ms=4),
                              log=backend_log(lateness_p50_us=3000.0))
        rc, out = self.compare([("generic-emmc45", late)], {"mb_per_s": 20.0, "p50_us": 18000})
        self.assertEqual(rc, 1, out)
        self.assertIn("p50 -13.6%", out)
        self.assertIn("lateness p50 3000.0 µs, p99 15.7 µs", out)
        with open(os.path.join(self.dir, "out.json")) as f:
            doc = json.load(f)
        self.assertEqual((doc["lateness"][0]["completions"], doc["lateness"][0]["p50_us"]),
                         (132, 3000.0))
        row = doc["rows"][0]
        self.assertAlmostEqual(row["trace_gap_us"], 4000.0, places=6)
        self.assertAlmostEqual(row["turnaround_us"], 1000.0, places=6)

    def test_a_run_without_the_daemons_pacing_summary_fails(self):
        d = self.guest_run("g", [self.seqwrite()], BOOT + WRITES,
                           log="vhost-user-emmc: serving /tmp/sock\n")
        rc, out = self.compare([("generic-emmc45", d)], {"mb_per_s": 25.0, "p50_us": 18000})
        self.assertEqual(rc, 1, out)
        self.assertIn("no 'session: ... lateness' line", out)
        os.remove(os.path.join(d, "backend.log"))
        rc, out = self.compare([("generic-emmc45", d)], {"mb_per_s": 25.0, "p50_us": 18000})
        self.assertEqual(rc, 1, out)
        self.assertIn("the daemon's log is needed", out)

    def test_the_tolerance_is_an_option(self):
        d = self.guest_run("g", [self.seqwrite()], BOOT + WRITES)
        rc, out = self.compare([("generic-emmc45", d)], {"mb_per_s": 25.0, "p50_us": 15720},
                               extra=["--tolerance", "15"])
        self.assertEqual(rc, 0, out)
        self.assertIn("tolerance ±15%", out)

    def test_unchecked_rows_are_shown_but_do_not_fail(self):
        small = fio_doc("fid-randread-4k", "randread", "896m", "64m", "4k", 2, 5.0, 900.0)
        reads = ["5000000000 R 939524096 4096 5000100000", "5001000000 R 943718400 4096 5001100000"]
        g = self.guest_run("g", [self.seqwrite()], BOOT + WRITES)
        i = self.guest_run("i", [small], BOOT + reads)
        rc, out = self.compare([("generic-emmc45", g), ("ideal", i)],
                               {"mb_per_s": 25.0, "p50_us": 18000}, extra=["--info", "ideal:*"])
        self.assertEqual(rc, 0, out)
        self.assertIn("(not checked)", out)

    def test_nothing_checked_fails(self):
        d = self.guest_run("g", [self.seqwrite()], BOOT + WRITES)
        rc, out = self.compare([("generic-emmc45", d)], {"mb_per_s": 25.0, "p50_us": 18000},
                               extra=["--info", "*"])
        self.assertEqual(rc, 1, out)
        self.assertIn("no checked rows", out)

    def test_a_foreign_request_during_the_job_fails(self):
        foreign = "5030000000 R 0 4096 5030100000"  # between the second and the third
        d = self.guest_run("g", [self.seqwrite()], BOOT + WRITES[:2] + [foreign] + WRITES[2:])
        rc, out = self.compare([("generic-emmc45", d)], {"mb_per_s": 25.0, "p50_us": 18000})
        self.assertEqual(rc, 1, out)
        self.assertIn("1 requests fio did not issue", out)

    def test_io_split_by_the_guest_fails(self):
        halves = []
        for i in range(4):
            t = 5_000_000_000 + i * 20_000_000
            off = 256 * MIB + i * 512 * 1024
            halves += [f"{t} W {off} 262144 {t + 9_000_000}",
                       f"{t + 9_000_000} W {off + 262144} 262144 {t + 18_000_000}"]
        d = self.guest_run("g", [self.seqwrite()], BOOT + halves)
        rc, out = self.compare([("generic-emmc45", d)], {"mb_per_s": 25.0, "p50_us": 18000})
        self.assertEqual(rc, 1, out)
        self.assertIn("8 requests for fio's 4 I/Os", out)

    def test_missing_bytes_fail(self):
        d = self.guest_run("g", [self.seqwrite(ios=5)], BOOT + WRITES)
        rc, out = self.compare([("generic-emmc45", d)], {"mb_per_s": 25.0, "p50_us": 18000})
        self.assertEqual(rc, 1, out)
        self.assertIn("fio did 2621440", out)

    def test_simulate_output_is_read_too(self):
        # `simulate --workload trace --json` has read and write at the top level.
        d = self.guest_run("g", [self.seqwrite()], BOOT + WRITES)
        rc, out = self.compare([("generic-emmc45", d)],
                               {"mb_per_s": 25.0, "p50_us": 18000, "shape": "simulate"})
        self.assertEqual(rc, 0, out)

    def test_a_compare_output_without_the_model_fails(self):
        with self.assertRaises(fidelity.FidelityError):
            fidelity.simulator_figures({"runs": [{"model": "ideal"}]}, "generic-emmc45")

    def test_a_mixed_job_is_refused(self):
        doc = self.seqwrite()
        doc["jobs"][0]["job options"]["rw"] = "randrw"
        d = self.guest_run("g", [doc], BOOT + WRITES)
        rc, out = self.compare([("generic-emmc45", d)], {"mb_per_s": 25.0, "p50_us": 18000})
        self.assertEqual(rc, 1, out)
        self.assertIn("only one direction per job compares", out)

    def test_a_run_without_a_trace_fails(self):
        d = self.guest_run("g", [self.seqwrite()], BOOT + WRITES)
        os.remove(os.path.join(d, "serve.trace"))
        rc, out = self.compare([("generic-emmc45", d)], {"mb_per_s": 25.0, "p50_us": 18000})
        self.assertEqual(rc, 1, out)
        self.assertIn("serve.trace", out)

    def test_a_simulator_failure_fails(self):
        d = self.guest_run("g", [self.seqwrite()], BOOT + WRITES)
        rc, out = self.compare([("generic-emmc45", d)], {"fail": True})
        self.assertEqual(rc, 1, out)
        self.assertIn("the trace is broken", out)

    def test_the_simulator_invocation(self):
        cmd = fidelity.simulator_command("bin", "toshiba-mmc32g", "t.trace")
        self.assertEqual(cmd[0], "bin")
        self.assertIn("toshiba-mmc32g", cmd)
        self.assertIn("t.trace", cmd)
        self.assertIn("--json", cmd)

    def test_fio_sizes(self):
        self.assertEqual(fidelity.size_bytes("512k"), 512 * 1024)
        self.assertEqual(fidelity.size_bytes("32m"), 32 * MIB)
        self.assertEqual(fidelity.size_bytes("1g"), 1 << 30)
        self.assertEqual(fidelity.size_bytes("4096"), 4096)
        self.assertEqual(fidelity.size_bytes("64MiB"), 64 * MIB)


if __name__ == "__main__":
    unittest.main()
