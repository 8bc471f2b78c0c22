#!/usr/bin/env bash
# The daemon's SDHCI controller (serve --transport sdhci on QEMU 11.1's vfio-user-pci)
# against QEMU 11.1's in-process sdhci-pci + emmc, one after the other with the same
# guest kernel: 4 KiB random reads at queue depth 16 (IOPS), 1 MiB sequential reads
# and writes (MiB/s), and one MMIO read of the controller as the guest sees it
# (guest-tests/mmio-probe.c). The daemon runs the `ideal` model (no card time), so both
# figures are what the controller path itself costs under TCG.
#
#   guest-tests/sdhci-vs-qemu.sh [--kernel 6.1|6.12] [--runtime S] [--out DIR] [--no-build]
#   guest-tests/sdhci-vs-qemu.sh --report DIR    # the table again from an --out DIR
#
# Prints a table and the daemon's own account of its session (the `pci session:` line:
# its handling time per access, the client's round trip, the guest's answer to an
# interrupt, the timer's spinning). Exits 1 when either run fails, when the daemon's
# writes do not complete, or when the daemon's random-read IOPS fall below QEMU's
# (issue 14's target; --no-target reports that without failing). A first pair that
# misses only the target is followed by a second pair, and the target is judged on the
# best run of each side: the daemon's path costs process wake-ups on every register
# access and QEMU's none, so one slow stretch of a shared machine can sink one run.
set -euo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)

KERNEL=6.1
RUNTIME=10
OUT=
TARGET=1
REPORT=0
pass=()
while [[ $# -gt 0 ]]; do
    case $1 in
    --kernel) KERNEL=$2; shift 2 ;;
    --runtime) RUNTIME=$2; shift 2 ;;
    --out) OUT=$2; shift 2 ;;
    --no-target) TARGET=0; shift ;;
    --report) OUT=$2; REPORT=1; shift 2 ;;
    --no-build) pass+=(--no-build); shift ;;
    -h | --help) sed -n '2,19p' "$0"; exit 0 ;;
    *) echo "sdhci-vs-qemu: unknown option $1" >&2; exit 2 ;;
    esac
done
[[ $RUNTIME =~ ^[0-9]+$ ]] || { echo "sdhci-vs-qemu: --runtime wants seconds" >&2; exit 2; }
if [[ -z $OUT ]]; then
    OUT=$(mktemp -d "${TMPDIR:-/tmp}/sdhci-vs-qemu.XXXXXX")
    trap 'rm -rf "$OUT"' EXIT
fi
mkdir -p "$OUT"

# One run of each, QEMU's device first; SUFFIX names the pair's files ("" or "-2").
run_pair() {
    local suffix=$1 label=${2:-}
    echo "== QEMU 11.1's sdhci-pci + emmc (in-process), kernel $KERNEL$label"
    "$HERE/run-guest-test.sh" --disk qemu-sdhci --kernel "$KERNEL" --quiet --fio-var "GT_RUNTIME=$RUNTIME" \
        --summary-json "$OUT/qemu$suffix.json" --save "$OUT/qemu$suffix" >"$OUT/qemu$suffix.log" 2>&1 || rc=1
    tail -n 3 "$OUT/qemu$suffix.log"
    echo "== the daemon's SDHCI controller on vfio-user-pci, model ideal, kernel $KERNEL$label"
    "$HERE/run-guest-test.sh" --disk sdhci --jobs sdhci-perf --model ideal --kernel "$KERNEL" --quiet \
        "${pass[@]}" --fio-var "GT_RUNTIME=$RUNTIME" \
        --summary-json "$OUT/daemon$suffix.json" --save "$OUT/daemon$suffix" >"$OUT/daemon$suffix.log" 2>&1 || rc=1
    tail -n 3 "$OUT/daemon$suffix.log"
}

rc=0
if [[ $REPORT == 0 ]]; then
    run_pair ""
fi

# The report; exits 3 when the only failure is a missed target.
report() {
python3 - "$OUT" "$TARGET" <<'PY'
import json, os, re, sys
out, target = sys.argv[1], sys.argv[2] == "1"

def rows(name):
    try:
        return json.load(open(f"{out}/{name}.json")).get("jobs", [])
    except (OSError, ValueError):
        return []

def figure(rs, job, direction, key):
    for r in rs:
        if r["job"] == job and r["dir"] == direction:
            return r[key]
    return None

def text(name, log):
    try:
        return open(f"{out}/{name}/{log}", errors="replace").read()
    except OSError:
        return ""

def bus(name):
    t = text(name, "data.log")
    if not t:
        return "?"
    w = re.search(r"bus width:\s+\d+ \((\d+) bits\)", t)
    s = re.search(r"timing spec:\s+\d+ \(([^)]*)\)", t)
    c = re.search(r"actual clock:\s+(\d+) Hz", t)
    return (f"{w.group(1) if w else '?'}-bit {s.group(1) if s else '?'} "
            f"{int(c.group(1)) // 1000000 if c else '?'} MHz")

def mmio_ns(name):
    m = re.search(r"MMIO-ROUNDTRIP: ([0-9.]+) ns per read", text(name, "data.log"))
    return float(m.group(1)) if m else None

def qemu_writes(suffix):
    t = text(f"qemu{suffix}", "data.log")
    if not t:
        return None, "?"
    m = re.search(r"write-seq-1m: +write: IOPS=[^,]*, BW=([0-9.]+)([KM])iB/s", t)
    result = re.search(r"WRITE-RESULT: (.*)", t)
    mib = None
    if m:
        mib = float(m.group(1)) / (1024 if m.group(2) == "K" else 1)
    return mib, result.group(1) if result else "no result"

def session_line(name):
    """Where the daemon's session went, in its own words (the `pci session:` log line)."""
    m = re.findall(r"pci session(?: \(([^)]*)\))?: (.*)", text(name, "backend.log"))
    if not m:
        return "(no session line in the daemon's log)"
    why, line = m[-1]
    return f"{line} ({why})" if why else line

f = lambda v, scale=1.0, fmt="{:.1f}": "-" if v is None else fmt.format(v / scale)

def table(suffix):
    q, d = rows(f"qemu{suffix}"), rows(f"daemon{suffix}")
    q_iops = figure(q, "sdhci-randread-4k-qd16", "read", "iops")
    d_iops = figure(d, "sdhci-randread-4k-qd16", "read", "iops")
    q_rd = figure(q, "sdhci-seqread-1m", "read", "bw_kib")
    d_rd = figure(d, "sdhci-seqread-1m", "read", "bw_kib")
    d_wr = figure(d, "sdhci-seqwrite-1m", "write", "bw_kib")
    q_wr, q_wres = qemu_writes(suffix)
    qn, dn = f"qemu{suffix}", f"daemon{suffix}"
    print()
    if suffix:
        print("the second pair (the first missed the target):")
    print(f"{'':<34} {'QEMU sdhci-pci + emmc':>24} {'daemon, vfio-user':>24}")
    print(f"{'bus the guest chose':<34} {bus(qn):>24} {bus(dn):>24}")
    print(f"{'4 KiB random read, QD16 (IOPS)':<34} {f(q_iops):>24} {f(d_iops):>24}")
    print(f"{'1 MiB sequential read (MiB/s)':<34} {f(q_rd, 1024, '{:.2f}'):>24} {f(d_rd, 1024, '{:.2f}'):>24}")
    print(f"{'1 MiB sequential write (MiB/s)':<34} {f(q_wr, 1, '{:.2f}'):>24} {f(d_wr, 1024, '{:.2f}'):>24}")
    print(f"{'one MMIO read, guest side (us)':<34} {f(mmio_ns(qn), 1000, '{:.1f}'):>24} {f(mmio_ns(dn), 1000, '{:.1f}'):>24}")
    print(f"QEMU's writes: {q_wres}")
    print(f"the daemon's session: {session_line(dn)}")
    return q_iops, d_iops, d_wr

pairs = [table("")]
if os.path.exists(f"{out}/daemon-2.json") or os.path.exists(f"{out}/qemu-2.json"):
    pairs.append(table("-2"))
ok, missed = True, False
for q_iops, d_iops, d_wr in pairs:
    if d_wr is None or d_wr <= 0:
        print("FAIL: the daemon's 1 MiB writes did not complete")
        ok = False
    if d_iops is None or q_iops is None:
        print("FAIL: a random-read figure is missing")
        ok = False
if ok:
    # Best of each side over the pairs run: a machine that slows one run down (the
    # daemon's path takes several process wake-ups per register access, QEMU's none)
    # does not decide the comparison alone.
    q_best = max(p[0] for p in pairs)
    d_best = max(p[1] for p in pairs)
    which = "" if len(pairs) == 1 else f" (best of {len(pairs)} runs each)"
    if d_best < q_best:
        print(f"{'FAIL' if target else 'note'}: the daemon's random-read IOPS ({d_best:.0f}) are "
              f"below QEMU's in-process device ({q_best:.0f}){which}")
        missed = target
    else:
        print(f"target met: {d_best / q_best:.2f}x the in-process device's random-read IOPS{which}")
sys.exit(1 if not ok else 3 if missed else 0)
PY
}

report || rrc=$?
if [[ ${rrc:-0} == 3 && $REPORT == 0 && $rc == 0 ]]; then
    # Missed on the first pair only: one more pair, judged best of two on each side.
    run_pair -2 " (second pair)"
    rrc=0
    report || rrc=$?
fi
[[ ${rrc:-0} == 0 ]] || rc=1
if [[ $rc != 0 ]]; then
    echo "sdhci-vs-qemu: FAILED (logs in $OUT: qemu.log, daemon.log)"
    trap - EXIT
    exit 1
fi
echo "sdhci-vs-qemu: passed"
