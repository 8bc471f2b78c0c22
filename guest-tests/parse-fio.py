#!/usr/bin/env python3
"""Check and summarise the results a guest test run wrote to its data port.

Reads the log of the guest's second serial port (see guest-init.sh for the
markers), prints one line per fio job and direction (IOPS, bandwidth, completion
latency min/p50/p99/max in microseconds, errors), and exits non-zero when:

  * the guest did not reach the end marker, or reported a fatal error;
  * a job file is missing from the output, fio exited non-zero, or its JSON
    does not parse;
  * any fio job reports an error (I/O error, verification failure), did no
    I/O, or is a verify job that read nothing back;
  * the guest kernel log shows an I/O error, an oops or a warning (lines matching
    --dmesg-allow are listed, not counted);
  * a shell job (--sh-jobs: /jobs/NAME.sh in the guest) is missing or exited
    non-zero; its output is printed;
  * the smallest write (or read) completion latency of any job is below the
    expected minimum: the larger of --expect-min-*-lat-us and, with
    --model-trace, the smallest latency the daemon modelled for that direction
    (a request cannot complete in the guest before the card model lets it).

Standard library only.
"""

import argparse
import errno
import json
import math
import os
import re
import sys

BEGIN = "@@GT-BEGIN@@"
END = "@@GT-END@@"
FIO_BEGIN = re.compile(r"^@@GT-FIO-BEGIN (\S+)@@$")
FIO_END = re.compile(r"^@@GT-FIO-END (\S+) rc=(-?\d+)@@$")
SH_BEGIN = re.compile(r"^@@GT-SH-BEGIN (\S+)@@$")
SH_END = re.compile(r"^@@GT-SH-END (\S+) rc=(-?\d+)@@$")
FATAL = re.compile(r"@@GT-FATAL (.*)@@")
DMESG_BEGIN = "@@GT-DMESG-BEGIN@@"
DMESG_END = "@@GT-DMESG-END@@"

# Kernel log lines that only report an I/O error passed up from the disk.
DMESG_IO_ERROR = re.compile(r"I/O error|blk_update_request|Buffer I/O error")

# Kernel log lines that mean the disk or the kernel misbehaved.
DMESG_BAD = re.compile(
    r"I/O error|blk_update_request|critical medium error|Buffer I/O error"
    r"|virtio_blk.*(error|failed)|BUG:|WARNING:|Oops|Call Trace|hung_task"
    r"|blocked for more than",
    re.IGNORECASE,
)


def parse_log(text):
    """Split the data-port log into fio sections, the kernel log and markers."""
    lines = text.replace("\r", "").split("\n")
    out = {"begin": False, "end": False, "fatal": [], "fio": {}, "sh": {}, "dmesg": []}
    section = None  # ("fio" or "sh", name, [lines]) or ("dmesg", None, [lines])
    for line in lines:
        stripped = line.strip()
        m = FATAL.search(stripped)
        if m:
            out["fatal"].append(m.group(1))
            continue
        if stripped == BEGIN:
            out["begin"] = True
            continue
        if stripped == END:
            out["end"] = True
            continue
        m = FIO_BEGIN.match(stripped)
        if m:
            section = ("fio", m.group(1), [])
            continue
        m = FIO_END.match(stripped)
        if m and section and section[0] == "fio" and section[1] == m.group(1):
            out["fio"][m.group(1)] = {"rc": int(m.group(2)), "text": "\n".join(section[2])}
            section = None
            continue
        m = SH_BEGIN.match(stripped)
        if m:
            section = ("sh", m.group(1), [])
            continue
        m = SH_END.match(stripped)
        if m and section and section[0] == "sh" and section[1] == m.group(1):
            out["sh"][m.group(1)] = {"rc": int(m.group(2)), "text": "\n".join(section[2])}
            section = None
            continue
        if stripped == DMESG_BEGIN:
            section = ("dmesg", None, [])
            continue
        if stripped == DMESG_END and section and section[0] == "dmesg":
            out["dmesg"] = section[2]
            section = None
            continue
        if section:
            section[2].append(line)
    return out


def fio_json(text):
    """fio may print notes before its JSON document: start at the first '{'."""
    start = text.find("{")
    if start < 0:
        raise ValueError("no JSON object in fio output")
    return json.loads(text[start:])


def describe_error(err):
    if err == errno.EILSEQ:
        return "data verification failed (EILSEQ)"
    name = errno.errorcode.get(err, "?")
    return f"{os.strerror(err)} ({name})"


def us(ns):
    return ns / 1000.0


def direction_stats(job, direction):
    d = job.get(direction) or {}
    ios = int(d.get("total_ios", 0))
    if ios == 0:
        return None
    clat = d.get("clat_ns") or {}
    if int(clat.get("N", 0)) == 0:
        clat = {}  # no completed I/O to time (e.g. the only one failed)
    pct = clat.get("percentile") or {}
    return {
        "timed": bool(clat),
        "ios": ios,
        "io_bytes": int(d.get("io_bytes", 0)),
        "iops": float(d.get("iops", 0.0)),
        "bw_kib": float(d.get("bw", 0)),
        "clat_min_us": us(clat.get("min", 0)),
        "clat_p50_us": us(pct.get("50.000000", 0)),
        "clat_p99_us": us(pct.get("99.000000", 0)),
        "clat_max_us": us(clat.get("max", 0)),
        "clat_mean_us": us(clat.get("mean", 0)),
    }


def modelled_latencies(path):
    """Per direction, the latency (us) of each request in a `serve --trace` file:
    completion minus arrival, in card time."""
    out = {"read": [], "write": []}
    ops = {"R": "read", "W": "write", "WF": "write"}
    with open(path, encoding="utf-8") as f:
        for line in f:
            fields = line.split("#", 1)[0].split()
            if len(fields) == 5 and fields[1] in ops:
                out[ops[fields[1]]].append((int(fields[4]) - int(fields[0])) / 1000.0)
    return out


def quantile(values, q):
    """Nearest-rank quantile."""
    s = sorted(values)
    return s[max(0, math.ceil(q * len(s)) - 1)]


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("log", help="the data serial port's log")
    ap.add_argument("--jobs", required=True, help="fio job files expected, comma separated")
    ap.add_argument("--sh-jobs", default="",
                    help="shell jobs expected, comma separated: each must exit 0")
    ap.add_argument("--dmesg-allow", default="",
                    help="a regular expression: kernel log lines it matches are known "
                         "behaviour of the device under test, listed but not failures")
    ap.add_argument("--expect-min-write-lat-us", type=float, default=0.0)
    ap.add_argument("--expect-min-read-lat-us", type=float, default=0.0)
    ap.add_argument("--model-trace", help="the daemon's --trace file: modelled latencies")
    ap.add_argument("--summary-json", help="also write the summary here")
    ap.add_argument("--expect-errors", default="",
                    help="job files (comma separated) that must report I/O errors: "
                         "faults were injected while they ran")
    ap.add_argument("--allow-errors", default="",
                    help="job files (comma separated) that may report I/O errors (EIO "
                         "only) but need not: a power cut the guest may recover from")
    args = ap.parse_args()
    modelled = modelled_latencies(args.model_trace) if args.model_trace else None

    with open(args.log, "r", encoding="utf-8", errors="replace") as f:
        parsed = parse_log(f.read())

    failures = []
    rows = []
    for fatal in parsed["fatal"]:
        failures.append(f"guest: {fatal}")
    if not parsed["begin"]:
        failures.append("guest never started the fio jobs (no begin marker)")
    if not parsed["end"]:
        failures.append("guest did not reach the end marker (timeout, crash or hang)")

    sh_out = {}
    for name in [j for j in args.sh_jobs.split(",") if j]:
        section = parsed["sh"].get(name)
        if section is None:
            failures.append(f"{name}.sh: no output")
            continue
        sh_out[name] = section
        print(f"--- {name}.sh (exit status {section['rc']})")
        for line in section["text"].rstrip("\n").split("\n"):
            print(f"{name}: {line}")
        if section["rc"] != 0:
            failures.append(f"{name}.sh: exited {section['rc']}")
    if sh_out:
        print()

    expect_errors = {j for j in args.expect_errors.split(",") if j}
    allow_errors = {j for j in args.allow_errors.split(",") if j} | expect_errors
    for name in [j for j in args.jobs.split(",") if j]:
        section = parsed["fio"].get(name)
        if section is None:
            failures.append(f"{name}.fio: no output")
            continue
        if section["rc"] != 0 and name not in allow_errors:
            failures.append(f"{name}.fio: fio exited {section['rc']}")
        try:
            doc = fio_json(section["text"])
        except ValueError as e:
            failures.append(f"{name}.fio: unreadable fio JSON ({e})")
            continue
        file_errors = 0
        for job in doc.get("jobs", []):
            jname = job.get("jobname", "?")
            err = int(job.get("error", 0))
            total_err = int(job.get("total_err", 0))
            file_errors += total_err
            first = int(job.get("first_error", 0))
            if name in allow_errors:
                # Injected faults: I/O errors are expected, and only I/O errors.
                for code in (err, first):
                    if code not in (0, errno.EIO):
                        failures.append(f"{jname}: fio error {code}: {describe_error(code)} "
                                        "(only EIO was injected)")
            elif err or total_err:
                failures.append(f"{jname}: fio error {err}: {describe_error(err)}"
                                + (f" ({total_err} I/O errors)" if total_err else ""))
            opts = job.get("job options", {})
            verifying = bool(opts.get("verify")) and opts.get("do_verify", "1") != "0"
            stats = {d: direction_stats(job, d) for d in ("read", "write", "trim")}
            if opts.get("verify_only") in ("1", 1, True):
                # A verify-only job writes nothing; fio still fills its write section.
                stats["write"] = None
            if not any(stats.values()):
                failures.append(f"{jname}: did no I/O")
            if verifying and not stats["read"]:
                failures.append(f"{jname}: verify job read nothing back")
            # A job that says direct=0 (seed000-rw's buffered writer) completes in the
            # guest's page cache; its latency says nothing of the device and is not
            # checked against the model's floor.
            direct = str(opts.get("direct", doc.get("global options", {}).get("direct", "1")))
            for direction, s in stats.items():
                if s is None:
                    continue
                if direct == "0":
                    s = {**s, "timed": False}
                rows.append({"file": name, "job": jname, "dir": direction,
                             "error": total_err, "verify": verifying, **s})
        if name in expect_errors:
            if file_errors == 0:
                failures.append(f"{name}.fio: no I/O errors although faults were injected")
            else:
                print(f"{name}.fio: {file_errors} I/O errors reported, as injected")

    # With injected faults the kernel logs the I/O errors it passed on; anything else
    # (oops, warnings, hung tasks) still fails.
    allow = re.compile(args.dmesg_allow) if args.dmesg_allow else None
    allowed_dmesg = [line for line in parsed["dmesg"] if DMESG_BAD.search(line)
                     and allow and allow.search(line)]
    bad_dmesg = [line for line in parsed["dmesg"] if DMESG_BAD.search(line)
                 and not (allow_errors and DMESG_IO_ERROR.search(line))
                 and not (allow and allow.search(line))]
    for line in bad_dmesg[:10]:
        failures.append(f"guest kernel: {line.strip()}")

    checks = []
    for direction, asked in (("write", args.expect_min_write_lat_us),
                             ("read", args.expect_min_read_lat_us)):
        expected = asked
        if modelled is not None and modelled[direction]:
            lat = modelled[direction]
            floor = min(lat)
            if floor < 0:
                failures.append(f"the daemon's trace has a {direction} that completed "
                                f"{-floor:.1f} us before it arrived")
            checks.append(f"model: {len(lat)} {direction}s, modelled latency min "
                          f"{floor:.1f} p50 {quantile(lat, 0.5):.1f} "
                          f"p99 {quantile(lat, 0.99):.1f} max {max(lat):.1f} us")
            expected = max(expected, floor)
        relevant = [r for r in rows if r["dir"] == direction and r["timed"]]
        if not relevant:
            # A floor asked for by hand needs something to check; one from the trace
            # alone does not (the boot's partition scan reads even when no job does).
            if asked > 0:
                failures.append(f"no {direction}s to check the {direction} latency against")
            elif expected > 0:
                checks.append(f"no {direction}s in fio's jobs: the model's {direction} "
                              "floor checks nothing")
            continue
        lowest = min(relevant, key=lambda r: r["clat_min_us"])
        line = (f"min {direction} clat {lowest['clat_min_us']:.1f} us "
                f"({lowest['job']})")
        if expected > 0:
            ok = lowest["clat_min_us"] >= expected
            line += f", expected >= {expected:.1f} us: {'ok' if ok else 'FAIL'}"
            if not ok:
                failures.append(
                    f"{lowest['job']}: {direction} completion latency "
                    f"{lowest['clat_min_us']:.1f} us is below the model's "
                    f"minimum {expected:.1f} us")
        checks.append(line)

    # The human summary (a run of shell jobs only has no table).
    fio_jobs = [j for j in args.jobs.split(",") if j]
    hdr = (f"{'job':<24} {'dir':<5} {'ios':>7} {'IOPS':>9} {'MiB/s':>8} "
           f"{'clat min':>9} {'p50':>9} {'p99':>9} {'max':>10} {'err':>4}")
    if fio_jobs:
        print(hdr)
        print("-" * len(hdr))
    for r in rows:
        if r["timed"]:
            lat = (f"{r['clat_min_us']:>9.1f} {r['clat_p50_us']:>9.1f} "
                   f"{r['clat_p99_us']:>9.1f} {r['clat_max_us']:>10.1f}")
        else:
            lat = f"{'-':>9} {'-':>9} {'-':>9} {'-':>10}"
        print(f"{r['job']:<24} {r['dir']:<5} {r['ios']:>7} {r['iops']:>9.1f} "
              f"{r['bw_kib'] / 1024:>8.2f} {lat} {r['error']:>4}")
    if fio_jobs:
        print("(latencies: completion latency in microseconds, measured in the guest)")
    for line in checks:
        print(line)
    print(f"guest kernel log: {len(parsed['dmesg'])} lines, {len(bad_dmesg)} bad"
          + (f", {len(allowed_dmesg)} known (--dmesg-allow)" if allow else ""))
    for line in allowed_dmesg[:10]:
        print(f"  known: {line.strip()}")

    if args.summary_json:
        with open(args.summary_json, "w", encoding="utf-8") as f:
            json.dump({"pass": not failures, "failures": failures, "jobs": rows,
                       "checks": checks,
                       "sh": {n: {"rc": v["rc"], "output": v["text"]}
                              for n, v in sh_out.items()}}, f, indent=2)
            f.write("\n")

    if failures:
        print("FAILED:")
        for msg in failures:
            print(f"  - {msg}")
        return 1
    print("all checks passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
