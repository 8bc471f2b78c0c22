#!/usr/bin/env bash
# Seed 000 through a real guest, with serve's defaults: msm-emmc45-sdr50, a Debian 6.1
# guest running a sequential direct reader (768 KiB, queue depth 1) beside a buffered
# sequential writer for 10 s, once per write packing mode, each on a fresh image
# (run-guest-test.sh --jobs seed000). Prints mode, the reader's rate (fio's, and the
# reader alone in the same boot), the writer's rate as the daemon saw it (fio's buffered
# figure is the page cache's) and the driver's packing statistics over the run, then
# checks the reader against seed 000 (000_c5266c4a64c56db6.txt: "write packing causes
# the read throughput to drop from 24MB/s to 12MB/s. The write packing control managed
# to increase the read throughput back to the original value"):
#   off          reader >= 0.75 x the reader alone in the same boot (it keeps its rate)
#   always       reader 0.3-0.65 x the reader without packing (it loses about half)
#   controlled   reader >= 0.7 x without packing and >= 1.3 x with (it comes back;
#                threshold 17, serve's default)
# The reader is the simulator's parallel-rw reader (768 KiB, 10 ms of processing after
# each), so this and the fidelity rows s000-sdr50-parallel-read-* are one experiment.
# Exit status: 0 pass, 1 a check failed, 2 a guest run failed.
#
# Usage: guest-tests/seed000-rw.sh [--modes off,always,controlled] [--out DIR]
#            [--serve-args 'ARGS'] [--no-build] [--no-check]
# --serve-args adds daemon options to every run (e.g. '--scheduler noop' to measure
# another driver configuration than serve's defaults); --no-check prints the table only.
# Other options go to run-guest-test.sh. Run as root (see guest-tests/README.md).
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
MODES=off,always,controlled
OUT=
EXTRA=
CHECK=1
PASS=()
while [[ $# -gt 0 ]]; do
    case $1 in
    --modes) MODES=$2; shift 2 ;;
    --out) OUT=$2; shift 2 ;;
    --serve-args) EXTRA=$2; shift 2 ;;
    --no-check) CHECK=0; shift ;;
    -h | --help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) PASS+=("$1"); shift ;;
    esac
done
if [[ -z $OUT ]]; then
    OUT=$(mktemp -d "${TMPDIR:-/tmp}/seed000-rw.XXXXXX")
fi
mkdir -p "$OUT"
IMAGE_DIR=${GUEST_IMAGE_DIR:-/dev/shm}

rc=0
IFS=, read -r -a modes <<<"$MODES"
for mode in "${modes[@]}"; do
    case $mode in off | always | controlled) ;; *) echo "seed000-rw: unknown mode $mode" >&2; exit 2 ;; esac
    echo "== seed000-rw: packing $mode${EXTRA:+ ($EXTRA)}"
    # Only the first run builds; a fresh image each time (the harness creates one).
    if ! "$HERE/run-guest-test.sh" --disk vhost-user-blk --model msm-emmc45-sdr50 \
        --jobs seed000 --quiet --image-dir "$IMAGE_DIR" \
        --serve-args "--packing $mode${EXTRA:+ $EXTRA}" --save "$OUT/$mode" \
        "${PASS[@]}" >"$OUT/$mode.log" 2>&1; then
        tail -n 30 "$OUT/$mode.log" >&2
        echo "seed000-rw: the guest run with packing $mode failed ($OUT/$mode.log)" >&2
        rc=2
    fi
    PASS+=(--no-build)
done

check=()
[[ $CHECK == 1 ]] || check=(--no-check)
python3 - "$OUT" "$MODES" "${check[@]}" <<'PY' || rc=$((rc > 0 ? rc : 1))
import json, os, re, sys

out, modes = sys.argv[1], sys.argv[2].split(",")
check = "--no-check" not in sys.argv[3:]
SEED = {"off": 24.0, "always": 12.0, "controlled": 24.0}
MB = 1e6


def fio_docs(path):
    """fio's JSON per job file from the results port's log."""
    text = open(path, errors="replace").read()
    docs = {}
    for m in re.finditer(r"@@GT-FIO-BEGIN (\S+)@@\n(.*?)@@GT-FIO-END \1 rc=\d+@@", text, re.S):
        body = m.group(2)
        start = body.find("{")
        if start >= 0:
            docs[m.group(1)] = json.loads(body[start:])
    return docs


def bw(doc, job, direction):
    for j in doc.get("jobs", []):
        if j.get("jobname") == job:
            return j[direction]["io_bytes"] / (j[direction]["runtime"] / 1000.0) / MB
    return None


def window_rates(trace, t0, t1):
    """Bytes read and written that completed in card time [t0, t1], per second."""
    rd = wr = 0
    for line in open(trace):
        f = line.split()
        if not f or f[0].startswith("#") or len(f) < 5:
            continue
        done = int(f[4])
        if t0 <= done <= t1:
            if f[1] == "R":
                rd += int(f[3])
            elif f[1] in ("W", "WF"):
                wr += int(f[3])
    span = (t1 - t0) / 1e9
    return rd / span / MB, wr / span / MB


def diff(a, b):
    keys = set(a) | set(b)
    d = {k: b.get(k, 0) - a.get(k, 0) for k in keys}
    return {k: v for k, v in d.items() if v}


rows, failures = [], []
for mode in modes:
    d = os.path.join(out, mode)
    try:
        docs = fio_docs(os.path.join(d, "data.log"))
        alone = bw(docs["seed000-read"], "s0-read-alone", "read")
        reader = bw(docs["seed000-rw"], "s0-reader", "read")
        writer_fio = bw(docs["seed000-rw"], "s0-writer", "write")
        s0 = json.load(open(os.path.join(d, "stats-start.json")))
        s1 = json.load(open(os.path.join(d, "stats-end.json")))
        t0, t1 = s0["card"]["now_ns"], s1["card"]["now_ns"]
        rd_dev, wr_dev = window_rates(os.path.join(d, "serve.trace"), t0, t1)
        wp0 = s0["transport"]["driver"]["write_packing"]
        wp1 = s1["transport"]["driver"]["write_packing"]
        entries = diff(wp0["entries"], wp1["entries"])
        stops = diff(wp0["stop_reasons"], wp1["stop_reasons"])
        lists = sum(entries.values())
        packed = sum(v for k, v in entries.items() if int(k) > 1)
        single = entries.get("1", 0)
        bkops = (s1["card"]["counters"]["bkops_ns"] - s0["card"]["counters"]["bkops_ns"]) / 1e9
    except (OSError, KeyError, ValueError, TypeError, ZeroDivisionError) as e:
        failures.append(f"{mode}: no results ({e!r})")
        continue
    hist = " ".join(f"{k}:{entries[k]}" for k in sorted(entries, key=int))
    stop = ", ".join(f"{v} {k}" for k, v in sorted(stops.items()))
    rows.append((mode, alone, reader, rd_dev, wr_dev, writer_fio, lists, packed, single, bkops,
                 hist, stop))

# The checks are the seed's statements, each against a rate measured in the same run, so
# a slower host (TCG) moves both sides: without packing the reader keeps its rate (at
# least 0.75 x the reader alone in the same boot; seed 000: 24 MB/s, and "~40% loss" in
# its other experiment); with packing it loses about half (0.3-0.65 x the reader without
# packing; seed: 12 of 24); with write packing control it comes back (at least 0.7 x the
# reader without packing and 1.3 x the reader with packing; seed: "back to the original
# value").
reader_of = {r[0]: r[2] for r in rows}
alone_of = {r[0]: r[1] for r in rows}
if check:
    off = reader_of.get("off")
    if "off" in reader_of and reader_of["off"] < 0.75 * alone_of["off"]:
        failures.append(f"packing off: reader {off:.1f} MB/s, below 0.75 x the reader alone "
                        f"({alone_of['off']:.1f})")
    if "always" in reader_of and off is not None:
        r = reader_of["always"]
        if not 0.3 * off <= r <= 0.65 * off:
            failures.append(f"packing always: reader {r:.1f} MB/s, not about half of {off:.1f} "
                            f"without packing (0.3-0.65 x)")
    if "controlled" in reader_of and off is not None:
        r = reader_of["controlled"]
        if r < 0.7 * off:
            failures.append(f"packing controlled: reader {r:.1f} MB/s, below 0.7 x {off:.1f} "
                            f"without packing")
        if "always" in reader_of and r < 1.3 * reader_of["always"]:
            failures.append(f"packing controlled: reader {r:.1f} MB/s, not above 1.3 x "
                            f"{reader_of['always']:.1f} with packing always")
    if "off" not in reader_of:
        failures.append("the checks need the packing off run (--modes off,...)")

print()
print("seed 000 in a guest (msm-emmc45-sdr50; MB/s = 10^6 B/s; reader: fio in the guest; "
      "writer: what reached the card in the run's 10 s, from the daemon's trace)")
print(f"{'packing':<11} {'seed':>5} {'reader':>7} {'alone':>6} {'writer':>7} {'w(fio)':>7} "
      f"{'lists':>6} {'packed':>6} {'1-entry':>7} {'bkops s':>7}")
for (mode, alone, reader, rd_dev, wr_dev, wf, lists, packed, single, bkops, hist, stop) in rows:
    print(f"{mode:<11} {SEED[mode]:>5.0f} {reader:>7.1f} {alone:>6.1f} {wr_dev:>7.1f} {wf:>7.1f} "
          f"{lists:>6} {packed:>6} {single:>7} {bkops:>7.2f}")
for (mode, *_, hist, stop) in rows:
    if hist:
        print(f"  {mode}: packed-write lists by entries {hist}; stopped: {stop}")
print()
for f in failures:
    print(f"FAIL: {f}")
if failures:
    print(f"seed000-rw: {len(failures)} failed (results in {out})")
    sys.exit(1)
print(f"seed000-rw: {'all checks passed' if check else 'not checked'} (results in {out})")
PY
exit "$rc"
