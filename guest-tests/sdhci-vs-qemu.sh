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
# Prints a table. Exits 1 when either run fails, when the daemon's writes do not
# complete, or when the daemon's random-read IOPS fall below QEMU's (issue 14's
# target; --no-target reports that without failing).
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
    -h | --help) sed -n '2,14p' "$0"; exit 0 ;;
    *) echo "sdhci-vs-qemu: unknown option $1" >&2; exit 2 ;;
    esac
done
[[ $RUNTIME =~ ^[0-9]+$ ]] || { echo "sdhci-vs-qemu: --runtime wants seconds" >&2; exit 2; }
if [[ -z $OUT ]]; then
    OUT=$(mktemp -d "${TMPDIR:-/tmp}/sdhci-vs-qemu.XXXXXX")
    trap 'rm -rf "$OUT"' EXIT
fi
mkdir -p "$OUT"

rc=0
if [[ $REPORT == 0 ]]; then
echo "== QEMU 11.1's sdhci-pci + emmc (in-process), kernel $KERNEL"
"$HERE/run-guest-test.sh" --disk qemu-sdhci --kernel "$KERNEL" --quiet --fio-var "GT_RUNTIME=$RUNTIME" \
    --summary-json "$OUT/qemu.json" --save "$OUT/qemu" >"$OUT/qemu.log" 2>&1 || rc=1
tail -n 3 "$OUT/qemu.log"
echo "== the daemon's SDHCI controller on vfio-user-pci, model ideal, kernel $KERNEL"
"$HERE/run-guest-test.sh" --disk sdhci --jobs sdhci-perf --model ideal --kernel "$KERNEL" --quiet \
    "${pass[@]}" --fio-var "GT_RUNTIME=$RUNTIME" \
    --summary-json "$OUT/daemon.json" --save "$OUT/daemon" >"$OUT/daemon.log" 2>&1 || rc=1
tail -n 3 "$OUT/daemon.log"
fi

python3 - "$OUT" "$TARGET" <<'PY' || rc=1
import json, re, sys
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

def bus(name):
    try:
        text = open(f"{out}/{name}/data.log", errors="replace").read()
    except OSError:
        return "?"
    w = re.search(r"bus width:\s+\d+ \((\d+) bits\)", text)
    t = re.search(r"timing spec:\s+\d+ \(([^)]*)\)", text)
    c = re.search(r"actual clock:\s+(\d+) Hz", text)
    return (f"{w.group(1) if w else '?'}-bit {t.group(1) if t else '?'} "
            f"{int(c.group(1)) // 1000000 if c else '?'} MHz")

def mmio_ns(name):
    try:
        text = open(f"{out}/{name}/data.log", errors="replace").read()
    except OSError:
        return None
    m = re.search(r"MMIO-ROUNDTRIP: ([0-9.]+) ns per read", text)
    return float(m.group(1)) if m else None

def qemu_writes():
    try:
        text = open(f"{out}/qemu/data.log", errors="replace").read()
    except OSError:
        return None, "?"
    m = re.search(r"write-seq-1m: +write: IOPS=[^,]*, BW=([0-9.]+)([KM])iB/s", text)
    result = re.search(r"WRITE-RESULT: (.*)", text)
    mib = None
    if m:
        mib = float(m.group(1)) / (1024 if m.group(2) == "K" else 1)
    return mib, result.group(1) if result else "no result"

q, d = rows("qemu"), rows("daemon")
q_iops = figure(q, "sdhci-randread-4k-qd16", "read", "iops")
d_iops = figure(d, "sdhci-randread-4k-qd16", "read", "iops")
q_rd = figure(q, "sdhci-seqread-1m", "read", "bw_kib")
d_rd = figure(d, "sdhci-seqread-1m", "read", "bw_kib")
d_wr = figure(d, "sdhci-seqwrite-1m", "write", "bw_kib")
q_wr, q_wres = qemu_writes()
f = lambda v, scale=1.0, fmt="{:.1f}": "-" if v is None else fmt.format(v / scale)
print()
print(f"{'':<34} {'QEMU sdhci-pci + emmc':>24} {'daemon, vfio-user':>24}")
print(f"{'bus the guest chose':<34} {bus('qemu'):>24} {bus('daemon'):>24}")
print(f"{'4 KiB random read, QD16 (IOPS)':<34} {f(q_iops):>24} {f(d_iops):>24}")
print(f"{'1 MiB sequential read (MiB/s)':<34} {f(q_rd, 1024, '{:.2f}'):>24} {f(d_rd, 1024, '{:.2f}'):>24}")
print(f"{'1 MiB sequential write (MiB/s)':<34} {f(q_wr, 1, '{:.2f}'):>24} {f(d_wr, 1024, '{:.2f}'):>24}")
print(f"{'one MMIO read, guest side (us)':<34} {f(mmio_ns('qemu'), 1000, '{:.1f}'):>24} {f(mmio_ns('daemon'), 1000, '{:.1f}'):>24}")
print(f"QEMU's writes: {q_wres}")
ok = True
if d_wr is None or d_wr <= 0:
    print("FAIL: the daemon's 1 MiB writes did not complete")
    ok = False
if d_iops is None or q_iops is None:
    print("FAIL: a random-read figure is missing")
    ok = False
elif d_iops < q_iops:
    print(f"{'FAIL' if target else 'note'}: the daemon's random-read IOPS ({d_iops:.0f}) are below "
          f"QEMU's in-process device ({q_iops:.0f})")
    ok = ok and not target
else:
    print(f"target met: {d_iops / q_iops:.2f}x the in-process device's random-read IOPS")
sys.exit(0 if ok else 1)
PY
if [[ $rc != 0 ]]; then
    echo "sdhci-vs-qemu: FAILED (logs in $OUT: qemu.log, daemon.log)"
    trap - EXIT
    exit 1
fi
echo "sdhci-vs-qemu: passed"
