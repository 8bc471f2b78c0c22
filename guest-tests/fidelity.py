#!/usr/bin/env python3
"""Simulated vs measured: fio's figures in a guest beside the simulator's replay.

For each guest run (a directory with the results port's log, data.log, and the
daemon's request trace, serve.trace, as `run-guest-test.sh --save DIR` leaves
them) and each fio job in it:

  1. the job's requests are picked out of the trace: the job's direction, inside
     its region (offset and size from fio's JSON). They must be exactly fio's
     I/Os (one request per I/O, the same bytes) and nothing else may arrive
     between the first and the last of them — so the boot's partition scan and
     the other jobs are left out, and the guest split nothing;
  2. those requests, times moved so the first arrives at 0 and without the
     daemon's own completion column, are replayed by the simulator for the same
     model (`simulator_command`, the one place it is invoked);
  3. fio's bandwidth stands beside the simulator's throughput (bytes over card
     time from the first arrival to the last completion);
  4. fio's completion-latency p50 stands beside what the simulator predicts the
     guest sees: the simulator's p50 (from each request's arrival in the trace)
     plus the guest's turnaround, measured in the same boot. The turnaround is the
     guest's own time under TCG: the interrupt, waking the vCPU, fio's loop and
     the next request's way down to the daemon. It is part of fio's latency and
     no card model has it; it grows with the machine's load, so it is measured,
     not assumed. With one request in flight (the jobs' iodepth 1) the trace
     shows it: the time from the card's modelled completion of one request
     (column 5) to the arrival of the next, at p50. That time also holds the
     daemon's lateness in signalling the completion, which is the daemon's and
     not the guest's, so the daemon's lateness p50 over the boot (its `session:`
     line in backend.log) is taken out of it and stays in the comparison.

Prints a table; exits 1 when a checked row's throughput or p50 differs by more
than --tolerance percent, or a job's requests cannot be matched. Rows named by
--info are shown and never checked. Standard library only.
"""

import argparse
import fnmatch
import importlib.util
import json
import math
import os
import re
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))

# parse-fio.py's reader of the results port (its name has a hyphen: load by path).
_spec = importlib.util.spec_from_file_location("parse_fio", os.path.join(HERE, "parse-fio.py"))
parse_fio = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(parse_fio)

# Requests the simulator may keep in flight: open-loop replay (each request at its
# trace time), bounded only by the virtqueue's size.
REPLAY_QD = 256

TRACE_OPS = {"R": "read", "W": "write", "WF": "write"}
READ_RW = {"read", "randread"}
WRITE_RW = {"write", "randwrite"}


class FidelityError(Exception):
    """A job whose requests cannot be compared (the message says why)."""


def simulator_command(binary, model, trace, qd=REPLAY_QD):
    """The simulator run that replays `trace` on a fresh card of `model`: through the
    MMC block driver with serve's defaults (noop scheduler, packing off), each request
    submitted at its trace time."""
    return [binary, "compare", "--models", model, "--trace", trace, "--qd", str(qd),
            "--json"]


def simulator_figures(doc, model):
    """The read and write summaries of one model from the simulator's JSON: either
    `simulate`'s (`read`/`write` at the top) or `compare`'s (`runs`, one per model)."""
    if "runs" in doc:
        runs = [r for r in doc["runs"] if r.get("model") == model]
        if not runs:
            raise FidelityError(f"the simulator's output has no run of {model}")
        doc = runs[0]
    return {"read": doc.get("read"), "write": doc.get("write")}


def run_simulator(binary, model, trace):
    cmd = simulator_command(binary, model, trace)
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode != 0:
        raise FidelityError(f"{' '.join(cmd)} exited {p.returncode}: {p.stderr.strip()}")
    try:
        doc = json.loads(p.stdout)
    except ValueError as e:
        raise FidelityError(f"{' '.join(cmd)}: output is not JSON ({e})") from e
    return simulator_figures(doc, model)


def size_bytes(text):
    """A fio size: digits with an optional k/m/g/t suffix (powers of 1024, fio's
    default kb_base), or a plain number of bytes."""
    t = str(text).strip().lower()
    for suffix in ("ib", "b"):
        if t.endswith(suffix) and len(t) > len(suffix) and not t[-len(suffix) - 1].isdigit():
            t = t[: -len(suffix)]
            break
    mult = {"k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}
    if t and t[-1] in mult:
        return int(t[:-1]) * mult[t[-1]]
    return int(t)


def read_trace(path):
    """Every line of a `serve --trace` file: (arrival_ns, op, offset, length, done_ns).
    Comment lines the daemon writes for requests outside the format
    (`# <time_ns> <WHAT> <completion_ns>`) are kept with op set to WHAT."""
    out = []
    with open(path, encoding="utf-8") as f:
        for line in f:
            text = line.strip()
            if text.startswith("#"):
                fields = text[1:].split()
                if len(fields) == 3 and fields[0].isdigit() and fields[2].isdigit():
                    out.append((int(fields[0]), fields[1], 0, 0, int(fields[2])))
                continue
            fields = text.split()
            if not fields:
                continue
            done = int(fields[4]) if len(fields) == 5 else None
            out.append((int(fields[0]), fields[1], int(fields[2]), int(fields[3]), done))
    return out


def job_spec(doc, job):
    """Direction, region and block size of one fio job (its options over the global ones)."""
    opts = dict(doc.get("global options") or {})
    opts.update(job.get("job options") or {})
    name = job.get("jobname", "?")
    rw = opts.get("rw", "read")
    if rw in READ_RW:
        direction = "read"
    elif rw in WRITE_RW:
        direction = "write"
    else:
        raise FidelityError(f"{name}: rw={rw}: only one direction per job compares")
    if "size" not in opts:
        raise FidelityError(f"{name}: no size option, so no region to select")
    offset = size_bytes(opts.get("offset", "0"))
    return {"job": name, "dir": direction, "offset": offset,
            "end": offset + size_bytes(opts["size"]), "bs": size_bytes(opts.get("bs", "4k"))}


def guest_figures(job, direction):
    d = job.get(direction) or {}
    clat = d.get("clat_ns") or {}
    pct = clat.get("percentile") or {}
    bw_bytes = d.get("bw_bytes")
    if bw_bytes is None:
        bw_bytes = float(d.get("bw", 0)) * 1024
    return {"ios": int(d.get("total_ios", 0)), "bytes": int(d.get("io_bytes", 0)),
            "mb_per_s": float(bw_bytes) / 1e6,
            "p50_us": float(pct.get("50.000000", 0)) / 1000.0}


def select_requests(trace, spec):
    """The job's requests in the trace; fails if others arrive among them."""
    ops = {op for op, d in TRACE_OPS.items() if d == spec["dir"]}
    picked = [i for i, r in enumerate(trace)
              if r[1] in ops and spec["offset"] <= r[2] < spec["end"]]
    if not picked:
        raise FidelityError(f"{spec['job']}: no {spec['dir']}s in "
                            f"[{spec['offset']}, {spec['end']}) in the trace")
    first, last = trace[picked[0]][0], trace[picked[-1]][0]
    chosen = set(picked)
    foreign = [r for i, r in enumerate(trace) if i not in chosen and first <= r[0] <= last]
    if foreign:
        t, op, off, length, _ = foreign[0]
        raise FidelityError(
            f"{spec['job']}: {len(foreign)} requests fio did not issue arrived while it "
            f"ran (first: {op} at {off}+{length}, {t} ns); the replay would not be the "
            "job's alone")
    return [trace[i] for i in picked]


def write_replay_trace(requests, path):
    """The requests as a trace starting at 0, without the daemon's completion column:
    the simulator models each request itself."""
    t0 = requests[0][0]
    with open(path, "w", encoding="utf-8") as f:
        f.write("# fio's requests from a serve --trace, arrival times from the first\n")
        for t, op, off, length, _ in requests:
            f.write(f"{t - t0} {op} {off} {length}\n")


def daemon_figures(requests):
    """Diagnostic only: what the daemon's own model gave these requests (trace column
    5). Not compared; it shows whether a disagreement is the replay's or the guest's."""
    done = [r for r in requests if r[4] is not None]
    if len(done) != len(requests):
        return None
    span = max(r[4] for r in done) - done[0][0]
    return {"mb_per_s": sum(r[3] for r in done) / 1e6 / (span / 1e9) if span > 0 else 0.0,
            "p50_us": p50(r[4] - r[0] for r in done) / 1000.0}


def p50(values):
    """The lower median, as the daemon and the simulator take it."""
    v = sorted(values)
    return v[max(0, math.ceil(0.5 * len(v)) - 1)]


def trace_gap_us(requests, job):
    """The p50 of the time from the card's modelled completion of one of the job's
    requests (trace column 5) to the arrival of the next, µs. With one request in
    flight that is the guest's own share of fio's latency, on both sides of the card
    time, and the daemon's lateness. None for a single request."""
    if any(r[4] is None for r in requests):
        raise FidelityError(f"{job}: the trace has no completion column, so the guest's "
                            "turnaround cannot be measured")
    gaps = [nxt[0] - cur[4] for cur, nxt in zip(requests, requests[1:])]
    if any(g < 0 for g in gaps):
        raise FidelityError(f"{job}: a request arrived before the one before it "
                            "completed; the turnaround needs one request in flight "
                            "(iodepth 1)")
    return p50(gaps) / 1000.0 if gaps else None


# The line the daemon logs when a frontend session ends (emmc_frontend::pacing).
SESSION_RE = re.compile(r"session: (\d+) completions, lateness p50 ([0-9.]+) µs, "
                        r"p99 ([0-9.]+) µs")


def daemon_lateness(directory):
    """The daemon's pacing over the boot from backend.log: the largest lateness p50
    (and its p99) of its sessions, µs, and their completions."""
    path = os.path.join(directory, "backend.log")
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            found = list(SESSION_RE.finditer(f.read()))
    except OSError as e:
        raise FidelityError(f"{path}: {e.strerror}: the daemon's log is needed for "
                            "its lateness") from e
    if not found:
        raise FidelityError(f"{path}: no 'session: ... lateness' line (the daemon logs it "
                            "at RUST_LOG=info when the guest detaches)")
    worst = max(found, key=lambda m: float(m.group(2)))
    return {"completions": sum(int(m.group(1)) for m in found),
            "p50_us": float(worst.group(2)), "p99_us": float(worst.group(3))}


def diff_pct(guest, sim):
    if guest == 0:
        return math.inf if sim else 0.0
    return (sim - guest) / guest * 100.0


def compare_job(binary, model, trace, lateness, doc, job, tmpdir):
    spec = job_spec(doc, job)
    guest = guest_figures(job, spec["dir"])
    if guest["ios"] == 0:
        raise FidelityError(f"{spec['job']}: fio did no {spec['dir']}s")
    requests = select_requests(trace, spec)
    nbytes = sum(r[3] for r in requests)
    if nbytes != guest["bytes"]:
        raise FidelityError(f"{spec['job']}: the trace holds {nbytes} bytes of "
                            f"{spec['dir']}s in the job's region, fio did {guest['bytes']}")
    if len(requests) != guest["ios"]:
        raise FidelityError(
            f"{spec['job']}: the daemon saw {len(requests)} requests for fio's "
            f"{guest['ios']} I/Os: the guest split them (see the guest's max_sectors_kb "
            "and max_segments), so per-I/O latency would not compare")
    path = os.path.join(tmpdir, f"{model}-{spec['job']}.trace")
    write_replay_trace(requests, path)
    sim = run_simulator(binary, model, path)[spec["dir"]]
    if not sim or int(sim.get("ops", 0)) != len(requests):
        raise FidelityError(f"{spec['job']}: the simulator replayed "
                            f"{(sim or {}).get('ops', 0)} {spec['dir']}s of {len(requests)}")
    return {"model": model, "job": spec["job"], "dir": spec["dir"], "bs": spec["bs"],
            "ios": guest["ios"],
            "guest_mb_per_s": guest["mb_per_s"], "sim_mb_per_s": float(sim["mb_per_s"]),
            "guest_p50_us": guest["p50_us"], "sim_p50_us": float(sim["p50_us"]),
            "trace_gap_us": trace_gap_us(requests, spec["job"]) or 0.0,
            "lateness_p50_us": lateness["p50_us"],
            "daemon": daemon_figures(requests)}


def load_run(directory):
    with open(os.path.join(directory, "data.log"), encoding="utf-8", errors="replace") as f:
        parsed = parse_fio.parse_log(f.read())
    if not parsed["fio"]:
        raise FidelityError(f"{directory}/data.log: no fio output")
    docs = []
    for name, section in parsed["fio"].items():
        if section["rc"] != 0:
            raise FidelityError(f"{directory}: {name}.fio: fio exited {section['rc']}")
        try:
            docs.append(parse_fio.fio_json(section["text"]))
        except ValueError as e:
            raise FidelityError(f"{directory}: {name}.fio: unreadable fio JSON ({e})") from e
    return docs, read_trace(os.path.join(directory, "serve.trace"))


def judge(row, tolerance, info_patterns):
    row["bw_diff_pct"] = diff_pct(row["guest_mb_per_s"], row["sim_mb_per_s"])
    # What the guest should see if the simulator is right: the card's time, and the
    # guest's own turnaround around it. The daemon's lateness is not the guest's: it
    # stays in the difference.
    row["turnaround_us"] = max(0.0, row["trace_gap_us"] - row["lateness_p50_us"])
    row["predicted_p50_us"] = row["sim_p50_us"] + row["turnaround_us"]
    row["p50_diff_pct"] = diff_pct(row["guest_p50_us"], row["predicted_p50_us"])
    row["p50_gap_us"] = row["guest_p50_us"] - row["sim_p50_us"]
    key = f"{row['model']}:{row['job']}"
    row["checked"] = not any(fnmatch.fnmatchcase(key, p) for p in info_patterns)
    row["ok"] = (abs(row["bw_diff_pct"]) <= tolerance
                 and abs(row["p50_diff_pct"]) <= tolerance)
    return row


def size_text(n):
    for unit, mult in (("M", 1 << 20), ("k", 1 << 10)):
        if n % mult == 0:
            return f"{n // mult}{unit}"
    return str(n)


def table(rows, markdown=False):
    head = ["model", "job", "dir", "bs", "I/Os", "guest MB/s", "sim MB/s", "diff",
            "guest p50 µs", "sim p50 µs", "guest−sim µs", "turnaround µs", "diff",
            "verdict"]
    body = []
    for r in rows:
        verdict = ("ok" if r["ok"] else "DIFFERS") if r["checked"] else (
            "(not checked)")
        body.append([r["model"], r["job"], r["dir"], size_text(r["bs"]), str(r["ios"]),
                     f"{r['guest_mb_per_s']:.2f}", f"{r['sim_mb_per_s']:.2f}",
                     f"{r['bw_diff_pct']:+.1f}%",
                     f"{r['guest_p50_us']:.0f}", f"{r['sim_p50_us']:.0f}",
                     f"{r['p50_gap_us']:.0f}", f"{r['turnaround_us']:.0f}",
                     f"{r['p50_diff_pct']:+.1f}%", verdict])
    if markdown:
        lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        lines += ["| " + " | ".join(b) + " |" for b in body]
        return "\n".join(lines)
    widths = [max(len(x) for x in col) for col in zip(head, *body)]
    fmt = lambda cells: "  ".join(c.rjust(w) if i >= 3 else c.ljust(w)  # noqa: E731
                                  for i, (c, w) in enumerate(zip(cells, widths)))
    return "\n".join([fmt(head), "-" * len(fmt(head))] + [fmt(b) for b in body])


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--run", action="append", default=[], metavar="MODEL=DIR",
                    help="a guest run of MODEL saved in DIR (data.log, serve.trace); repeat")
    ap.add_argument("--bin", required=True, help="the vhost-user-emmc binary")
    ap.add_argument("--tolerance", type=float, default=10.0,
                    help="largest difference allowed, percent of the guest's figure")
    ap.add_argument("--info", action="append", default=[], metavar="MODEL:JOB",
                    help="rows to show without checking (shell patterns); repeat")
    ap.add_argument("--json", help="also write the rows here")
    ap.add_argument("--markdown", action="store_true", help="print the table as Markdown")
    args = ap.parse_args(argv)
    if not args.run:
        ap.error("give at least one --run MODEL=DIR")

    rows, failures, lateness = [], [], []
    with tempfile.TemporaryDirectory(prefix="fidelity.") as tmp:
        for spec in args.run:
            model, sep, directory = spec.partition("=")
            if not sep or not model or not directory:
                ap.error(f"--run wants MODEL=DIR, not {spec!r}")
            try:
                docs, trace = load_run(directory)
                late = daemon_lateness(directory)
            except (OSError, FidelityError) as e:
                failures.append(f"{model}: {e}")
                continue
            lateness.append((model, directory, late))
            for doc in docs:
                for job in doc.get("jobs", []):
                    try:
                        row = compare_job(args.bin, model, trace, late, doc, job, tmp)
                    except FidelityError as e:
                        failures.append(f"{model}: {e}")
                        continue
                    rows.append(judge(row, args.tolerance, args.info))

    print(f"Simulated vs measured: fio in the guest (bandwidth, completion-latency p50) "
          f"beside the simulator's replay of the daemon's trace; tolerance ±{args.tolerance:g}% "
          "of the guest's figure, throughput and p50, for the checked rows. The p50 "
          "diff compares fio's with the simulator's plus the guest's turnaround: from "
          "the card's completion of a request to the next one's arrival in the trace, "
          "p50, less the daemon's lateness p50.")
    print(table(rows, args.markdown))
    for model, directory, late in lateness:
        print(f"  {model} {os.path.basename(os.path.normpath(directory))}: the daemon's "
              f"pacing over the boot: {late['completions']} completions, lateness p50 "
              f"{late['p50_us']:.1f} µs, p99 {late['p99_us']:.1f} µs")
    for r in rows:
        if r["daemon"]:
            print(f"  {r['model']} {r['job']}: the daemon's own model (trace column 5, "
                  f"diagnostic, not compared): {r['daemon']['mb_per_s']:.2f} MB/s, "
                  f"p50 {r['daemon']['p50_us']:.0f} µs")
    for r in rows:
        if r["checked"] and not r["ok"]:
            failures.append(f"{r['model']} {r['job']}: throughput {r['bw_diff_pct']:+.1f}%, "
                            f"p50 {r['p50_diff_pct']:+.1f}% (simulator "
                            f"{r['sim_p50_us']:.0f} + turnaround {r['turnaround_us']:.0f} "
                            f"against fio's {r['guest_p50_us']:.0f} µs; tolerance "
                            f"±{args.tolerance:g}%)")
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump({"tolerance_pct": args.tolerance, "rows": rows,
                       "lateness": [{"model": m, "run": d, **late} for m, d, late in lateness],
                       "failures": failures},
                      f, indent=2)
            f.write("\n")
    if failures:
        print("FAILED:")
        for msg in failures:
            print(f"  - {msg}")
        return 1
    checked = sum(r["checked"] for r in rows)
    if not checked:
        print("FAILED:\n  - no checked rows: nothing was compared")
        return 1
    print(f"fidelity: {checked} checked rows agree within ±{args.tolerance:g}% "
          f"({len(rows) - checked} shown unchecked)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
