#!/usr/bin/env python3
"""The per-case table of a guest's mmc_test run (guest-tests/jobs/mmc-test.sh).

Reads the results port's log (data.log) of `run-guest-test.sh --jobs mmc-test`, takes
the mmc-test job's output (the testlist, each case's start and end, the kernel's lines
for it and the debugfs results file) and prints one row per case: number, name,
result, time. The performance cases' transfers (count x size, time, rate, IOPS as
mmc_test computed them) follow in a second table.

With --expect FILE the results are compared with the expected ones by case name (the
numbers differ between kernels): a case whose result is worse than expected, or that
did not run, fails the run (exit status 1); a better one is reported so that the
expectations can be raised. Results from worst to best: MISSING (or NOT RUN), HUNG,
ERROR, PREPARE FAILED, FAILED, UNSUPPORTED (by host), UNSUPPORTED (by card), OK. Lines
of the expectations file with a fifth column hold only for the models it names
(--model). A performance case that reports OK without moving a byte is shown as
"OK, nothing transferred".

  mmc-test-table.py DATA_LOG [--expect FILE [--model M]] [--markdown FILE] [--json FILE]
                             [--title TEXT]
  mmc-test-table.py --side-by-side [--expect FILE] LABEL=RUN.json LABEL=RUN.json ...
      (the results of several runs' --json files as one markdown table)
"""

import argparse
import json
import re
import sys

SH_BEGIN = "@@GT-SH-BEGIN mmc-test@@"
SH_END = re.compile(r"^@@GT-SH-END mmc-test rc=(\d+)@@")
# Kernel lines: "[   12.345678] mmc0: Result: OK".
KLOG_PREFIX = re.compile(r"^\[\s*[0-9.]+\]\s*")
RESULT = re.compile(r"^\S+: Result: (.*)$")
TRANSFER_ONE = re.compile(
    r"Transfer of (\d+) sectors \(([\d.]+) KiB\) took (\d+)\.(\d+) seconds "
    r"\((\d+) kB/s, (\d+) KiB/s, (\d+\.\d+) IOPS\)")
TRANSFER_AVG = re.compile(
    r"Transfer of (\d+) x (\d+) sectors \((\d+) x ([\d.]+) KiB\) took (\d+)\.(\d+) seconds "
    r"\((\d+) kB/s, (\d+) KiB/s, (\d+\.\d+) IOPS, sg_len (\d+)\)")

# Worst first.
RANK = ["MISSING", "HUNG", "ERROR", "PREPARE FAILED", "FAILED",
        "UNSUPPORTED (by host)", "UNSUPPORTED (by card)", "OK"]


def normalise(text):
    """The kernel's result text in RANK's words (an error keeps its number)."""
    text = text.strip()
    m = re.match(r"Prepare stage failed! \((-?\d+)\)", text)
    return f"PREPARE FAILED ({m.group(1)})" if m else text


def family(result):
    """A result without its error number: "ERROR (-110)" -> "ERROR"."""
    return re.sub(r" \(-?\d+\)$", "", result)


def rank(result):
    """Position in RANK, worst 0; anything unknown (NOT RUN) counts as missing."""
    f = family(result)
    return RANK.index(f) if f in RANK else 0


def parse(text):
    """The mmc-test job's cases: {"card", "rc", "names": {n: name}, "cases": [..]}."""
    lines = text.replace("\r", "").splitlines()
    try:
        start = next(i for i, line in enumerate(lines) if line.strip() == SH_BEGIN)
    except StopIteration:
        return None
    out = {"card": "", "rc": None, "names": {}, "cases": [], "errors": []}
    cases = {}
    section = None
    current = None
    for raw in lines[start + 1:]:
        line = raw.rstrip()
        m = SH_END.match(line)
        if m:
            out["rc"] = int(m.group(1))
            break
        if line.startswith("MMCTEST-CARD "):
            out["card"] = line[len("MMCTEST-CARD "):]
        elif line.startswith("MMCTEST-CAPACITY "):
            words = line.split()
            out["capacity"] = int(words[1]) if len(words) > 1 and words[1].isdigit() else None
        elif line.startswith("MMCTEST-BUS "):
            out["bus"] = line[len("MMCTEST-BUS "):].strip()
        elif line.startswith("MMCTEST-CASES"):
            out["selected"] = [int(w) for w in line.split()[1:] if w.isdigit()]
        elif line.startswith("MMCTEST-ERROR "):
            out["errors"].append(line[len("MMCTEST-ERROR "):])
        elif line == "MMCTEST-LIST-BEGIN":
            section = "list"
        elif line == "MMCTEST-LIST-END":
            section = None
        elif section == "list":
            m = re.match(r"^(\d+):\s*(.*)$", line)
            if m and m.group(1) != "0":
                out["names"][int(m.group(1))] = m.group(2).strip()
        elif line.startswith("MMCTEST-CASE "):
            m = re.match(r"^MMCTEST-CASE (\d+) start=([\d.]+)", line)
            if m:
                n = int(m.group(1))
                current = cases.setdefault(n, {"number": n, "result": "MISSING", "start": None,
                                                "end": None, "transfers": [], "log": []})
                current["start"] = float(m.group(2))
        elif line.startswith("MMCTEST-CASE-END "):
            m = re.match(r"^MMCTEST-CASE-END (\d+) rc=(\d+) end=([\d.]+)", line)
            if m and int(m.group(1)) in cases:
                cases[int(m.group(1))]["end"] = float(m.group(3))
        elif line.startswith("MMCTEST-HUNG "):
            n = int(line.split()[1])
            if n in cases:
                cases[n]["result"] = "HUNG"
        elif line.startswith("MMCTEST-KLOG-BEGIN "):
            section = ("klog", int(line.split()[1]))
        elif line.startswith("MMCTEST-KLOG-END "):
            section = None
        elif line.startswith("MMCTEST-RESULT-BEGIN ") or line.startswith("MMCTEST-RESULT-END "):
            section = None
        elif isinstance(section, tuple) and section[0] == "klog" and section[1] in cases:
            case = cases[section[1]]
            body = KLOG_PREFIX.sub("", line)
            case["log"].append(body)
            m = RESULT.match(body)
            if m and case["result"] != "HUNG":
                case["result"] = normalise(m.group(1))
                continue
            m = TRANSFER_AVG.search(body)
            if m:
                count, sectors = int(m.group(1)), int(m.group(2))
                case["transfers"].append({
                    "count": count, "sectors": sectors,
                    "seconds": float(f"{m.group(5)}.{m.group(6)}"),
                    "kib_s": int(m.group(8)), "iops": float(m.group(9)),
                    "sg_len": int(m.group(10))})
                continue
            m = TRANSFER_ONE.search(body)
            if m:
                case["transfers"].append({
                    "count": 1, "sectors": int(m.group(1)),
                    "seconds": float(f"{m.group(3)}.{m.group(4)}"),
                    "kib_s": int(m.group(6)), "iops": float(m.group(7)), "sg_len": None})
    for n, case in sorted(cases.items()):
        case["name"] = out["names"].get(n, "?")
        if case["start"] is not None and case["end"] is not None:
            case["seconds"] = round(case["end"] - case["start"], 2)
        else:
            case["seconds"] = None
        out["cases"].append(case)
    # Cases the run took that never started (the job stopped early at a hung case).
    ran = {c["number"] for c in out["cases"]}
    for n in out.get("selected", sorted(out["names"])):
        name = out["names"].get(n, "?")
        if n not in ran:
            out["cases"].append({"number": n, "name": name, "result": "NOT RUN", "seconds": None,
                                 "transfers": [], "log": []})
    out["cases"].sort(key=lambda c: c["number"])
    # A performance case that passed without moving a byte (mmc_test's 32-bit sizes wrap
    # to 0 on some capacities) is marked: its OK says nothing about the card.
    for c in out["cases"]:
        perf = "performance" in c["name"] or c["name"].startswith("Large sequential")
        moved = sum(t["count"] * t["sectors"] for t in c["transfers"])
        c["nothing_moved"] = perf and c["result"] == "OK" and moved == 0
    return out


def read_expect(path, model=None):
    """{name: (result, reason)} from the expectations file: `N | name | result | reason`,
    and `N | name | result | reason | MODEL,...` for what differs on those models only
    (it replaces the line for all models when `model` is one of them)."""
    expect, special = {}, {}
    with open(path, encoding="utf-8") as f:
        for line in f:
            line = line.strip()
            if not line or line.startswith("#"):
                continue
            parts = [p.strip() for p in line.split("|")]
            if len(parts) < 3:
                raise SystemExit(f"{path}: not `N | name | result | reason`: {line}")
            entry = (parts[2], parts[3] if len(parts) > 3 else "")
            if len(parts) > 4 and parts[4]:
                if model in [m.strip() for m in parts[4].split(",")]:
                    special[parts[1]] = entry
            else:
                expect[parts[1]] = entry
    expect.update(special)
    return expect


def size_text(sectors):
    kib = sectors / 2
    if kib >= 1024 and kib % 1024 == 0:
        return f"{int(kib // 1024)} MiB"
    return f"{kib:g} KiB"


def compare(cases, expect, skipped=()):
    """(failures, notes) from the results against the expectations; `skipped`: names of
    the kernel's cases this run did not take (GT_MMCTEST_CASES), not held against it."""
    failures, notes = [], []
    seen = set()
    for c in cases:
        name = c["name"]
        if name not in expect:
            notes.append(f"case {c['number']} ({name}): {c['result']}, not in the expectations")
            continue
        seen.add(name)
        want, reason = expect[name]
        got = c["result"]
        if got == want:
            continue
        if got == "NOT RUN" or rank(got) < rank(want):
            failures.append(f"case {c['number']} ({name}): {got}, expected {want}"
                            + (f" ({reason})" if reason else ""))
        else:
            notes.append(f"case {c['number']} ({name}): {got}, better than the expected {want}: "
                         "raise the expectation")
    for name, (want, _) in expect.items():
        if name not in seen and name not in skipped:
            failures.append(f"expected case {name!r} ({want}) is not in this kernel's mmc_test "
                            "or did not run")
    return failures, notes


def shown(case):
    """The result as the tables show it."""
    return case["result"] + (", nothing transferred" if case.get("nothing_moved") else "")


def text_table(parsed):
    rows = [("case", "name", "result", "time (s)")]
    for c in parsed["cases"]:
        t = "" if c["seconds"] is None else f"{c['seconds']:.2f}"
        rows.append((str(c["number"]), c["name"], shown(c), t))
    widths = [max(len(r[i]) for r in rows) for i in range(4)]
    out = []
    for r in rows:
        out.append(f"{r[0]:>{widths[0]}}  {r[1]:<{widths[1]}}  {r[2]:<{widths[2]}}  "
                   f"{r[3]:>{widths[3]}}")
    return "\n".join(out)


def perf_rows(parsed):
    for c in parsed["cases"]:
        for t in c["transfers"]:
            yield c, t


def perf_text(parsed):
    rows = [("case", "transfer", "count", "time (s)", "KiB/s", "IOPS")]
    for c, t in perf_rows(parsed):
        rows.append((str(c["number"]), size_text(t["sectors"]), str(t["count"]),
                     f"{t['seconds']:.3f}", str(t["kib_s"]), f"{t['iops']:.2f}"))
    if len(rows) == 1:
        return ""
    widths = [max(len(r[i]) for r in rows) for i in range(6)]
    return "\n".join("  ".join(f"{v:>{widths[i]}}" for i, v in enumerate(r)) for r in rows)


# The cases whose transfers step through the sizes once each: one column apiece in the
# by-size table.
BY_SIZE = (("Single read performance by transfer size", "single read"),
           ("Single write performance by transfer size", "single write"),
           ("Consecutive read performance by transfer size", "consecutive read"),
           ("Consecutive write performance by transfer size", "consecutive write"),
           ("Random read performance by transfer size", "random read"),
           ("Random write performance by transfer size", "random write"))


def by_size(parsed):
    """Markdown: KiB/s by transfer size for the by-size cases that ran ("" if none)."""
    columns = []
    for name, label in BY_SIZE:
        case = next((c for c in parsed["cases"] if c["name"] == name and c["transfers"]), None)
        if case:
            rates = {}
            for t in case["transfers"]:
                rates.setdefault(t["sectors"], t["kib_s"])
            columns.append((f"{label} ({case['number']})", rates))
    if not columns:
        return ""
    sizes = sorted({sz for _, rates in columns for sz in rates})
    out = ["| transfer | " + " | ".join(label for label, _ in columns) + " |",
           "|---|" + "---|" * len(columns)]
    for sz in sizes:
        out.append(f"| {size_text(sz)} | "
                   + " | ".join(str(rates.get(sz, "")) for _, rates in columns) + " |")
    return "\n".join(out) + "\n"


def markdown(parsed, title):
    out = [f"### {title}", "", "| # | case | result | time (s) |", "|---|---|---|---|"]
    for c in parsed["cases"]:
        t = "" if c["seconds"] is None else f"{c['seconds']:.2f}"
        out.append(f"| {c['number']} | {c['name']} | {shown(c)} | {t} |")
    pivot = by_size(parsed)
    if pivot:
        out += ["", "KiB/s by transfer size (mmc_test's figures):", "", pivot.rstrip("\n")]
    perf = list(perf_rows(parsed))
    if perf:
        out += ["", "| # | transfer | count | time (s) | KiB/s | IOPS |", "|---|---|---|---|---|---|"]
        for c, t in perf:
            out.append(f"| {c['number']} | {size_text(t['sectors'])} | {t['count']} | "
                       f"{t['seconds']:.3f} | {t['kib_s']} | {t['iops']:.2f} |")
    return "\n".join(out) + "\n"


def side_by_side(columns, expect=None):
    """A markdown table of several runs' results by case: columns is [(label, parsed)]."""
    names = {}
    for _, parsed in columns:
        for c in parsed["cases"]:
            names.setdefault(c["number"], c["name"])
    head = "| # | case | " + " | ".join(label for label, _ in columns) + " |"
    if expect:
        head += " expected on an eMMC 4.5 card |"
    rule = "|" + "---|" * (2 + len(columns) + (1 if expect else 0))
    out = [head, rule]
    for n in sorted(names):
        cells = []
        for _, parsed in columns:
            c = next((c for c in parsed["cases"] if c["number"] == n), None)
            cells.append(shown(c) if c else "")
        row = f"| {n} | {names[n]} | " + " | ".join(cells) + " |"
        if expect:
            want, reason = expect.get(names[n], ("", ""))
            row += f" {want}{': ' + reason if reason else ''} |"
        out.append(row)
    return "\n".join(out) + "\n"


def main():
    if len(sys.argv) > 1 and sys.argv[1] == "--side-by-side":
        # mmc-test-table.py --side-by-side [--expect FILE] LABEL=RUN.json ...
        ap = argparse.ArgumentParser(description="several runs' results side by side")
        ap.add_argument("--side-by-side", action="store_true")
        ap.add_argument("--expect")
        ap.add_argument("runs", nargs="+", help="LABEL=mmc-test.json (from --json)")
        args = ap.parse_args()
        columns = []
        for run in args.runs:
            label, _, path = run.partition("=")
            with open(path, encoding="utf-8") as f:
                columns.append((label, json.load(f)))
        sys.stdout.write(side_by_side(columns, read_expect(args.expect) if args.expect else None))
        return 0
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("data")
    ap.add_argument("--expect", help="expected results (guest-tests/mmc-test-expected.txt)")
    ap.add_argument("--markdown", help="write the tables as markdown to this file")
    ap.add_argument("--json", help="write the parsed cases as JSON to this file")
    ap.add_argument("--title", default="mmc_test", help="heading of the markdown tables")
    ap.add_argument("--model", help="the card's model, for the expectations that differ by model")
    args = ap.parse_args()
    with open(args.data, encoding="utf-8", errors="replace") as f:
        parsed = parse(f.read())
    if parsed is None:
        print("mmc-test: the job's output is not in the log (did the guest get to it?)")
        return 1
    print(f"mmc_test on {parsed['card'] or 'the card'}: {len(parsed['cases'])} cases")
    for e in parsed["errors"]:
        print(f"mmc-test job: {e}")
    print(text_table(parsed))
    perf = perf_text(parsed)
    if perf:
        print()
        print("performance cases (mmc_test's own figures):")
        print(perf)
    counts = {}
    for c in parsed["cases"]:
        key = family(c["result"])
        counts[key] = counts.get(key, 0) + 1
    print("results: " + ", ".join(f"{v} {k}" for k, v in sorted(counts.items())))
    failures = []
    if parsed["errors"] or not parsed["cases"]:
        failures.append("the mmc-test job could not run mmc_test (above)")
    if args.expect:
        taken = set(parsed.get("selected", parsed["names"]))
        skipped = {name for n, name in parsed["names"].items() if n not in taken}
        fails, notes = compare(parsed["cases"], read_expect(args.expect, args.model), skipped)
        vacuous = [str(c["number"]) for c in parsed["cases"] if c.get("nothing_moved")]
        if vacuous:
            notes.append(f"cases {', '.join(vacuous)} passed without transferring anything "
                         "(mmc_test sizes them in 32-bit sectors x 512, which wrap to 0 on some "
                         "capacities; docs/mmc-test.md)")
        failures += fails
        for n in notes:
            print(f"note: {n}")
    if args.markdown:
        with open(args.markdown, "w", encoding="utf-8") as f:
            f.write(markdown(parsed, args.title))
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(parsed, f, indent=1)
    for fail in failures:
        print(f"FAILED: {fail}")
    if args.expect:
        print(f"mmc-test: {'FAIL' if failures else 'PASS'} against {args.expect}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
