#!/usr/bin/env python3
"""Host-side checks of a --disk sdhci run: the card as the guest's MMC stack saw it.

run-guest-test.sh calls this after the guest has shut down, with the results port's
log (data.log), the daemon's --cmd-log, and `vhost-user-emmc inspect` of the model
(fresh registers) and of the image (the card's state after the guest shut down). It
prints what it found and exits 1 on any miss:

* probe: the kernel names the model's card (the CID product name), mmcblk0, its two
  boot partitions and its RPMB partition appear; the bus the guest chose (debugfs ios)
  is printed and recorded;
* EXT_CSD: the guest's 512 bytes (debugfs, a fresh CMD8) against the image's after
  the run, byte by byte; every differing byte must be explained: a field the guest
  wrote with CMD6 (replayed from the command log) that the power-off reset or a later
  CMD6 changed, or a live status field. The bytes mmc-utils printed (`[NAME: 0xNN]`)
  must equal the debugfs bytes of the field of that name;
* discard: CMD35/CMD36/CMD38 in the command log cover the discarded ranges with the
  discard (0x00000003) and secure (0x80000000, or 0x80000001 + 0x80008000) arguments;
  a secure discard the kernel refused is reported, and then must not reach the card;
* fsync: at least one CMD6 FLUSH_CACHE (0x03200101) per fsync fio counted;
* write data CRC errors: the fault plan fired (data-err in the log) and the data
  verified (card-crc.fio passed, which parse-fio.py checks);
* power cut: after the cut the guest brought the card up again (CMD0 + CMD1 after
  the first write);
* card-stall: the 1 KiB page-crossing writes' completion latency shows the model's
  AU-collection stall.
"""

import argparse
import json
import re
import sys

EXT_CSD_LEN = 512
# Fields whose value is the card's state, not a setting: what they read depends on
# when they are read.
LIVE = {"BKOPS_STATUS", "CORRECTLY_PRG_SECTORS_NUM", "EXCEPTION_EVENTS_STATUS",
        "PACKED_COMMAND_STATUS", "PACKED_FAILURE_INDEX", "DYNCAP_NEEDED"}
FLUSH_ARG = 0x03200101


def sections(text):
    """{name: (rc, text)} for shell jobs and fio jobs, and the kernel log lines."""
    sh, fio, dmesg = {}, {}, []
    cur = None
    buf = []
    for line in text.split("\n"):
        line = line.rstrip("\r")
        m = re.match(r"^@@GT-(SH|FIO)-BEGIN (\S+)@@$", line)
        if m:
            cur, buf = (m.group(1), m.group(2)), []
            continue
        m = re.match(r"^@@GT-(SH|FIO)-END (\S+) rc=(-?\d+)@@$", line)
        if m and cur:
            (sh if cur[0] == "SH" else fio)[cur[1]] = (int(m.group(3)), "\n".join(buf))
            cur = None
            continue
        if line == "@@GT-DMESG-BEGIN@@":
            cur, buf = ("DMESG", None), []
            continue
        if line == "@@GT-DMESG-END@@" and cur:
            dmesg = buf
            cur = None
            continue
        if cur:
            buf.append(line)
    return sh, fio, dmesg


def parse_inspect(path):
    """The 512 EXT_CSD bytes `inspect` printed, the fields (name -> (offset, length,
    access)), and the CID product name."""
    data = bytearray(EXT_CSD_LEN)
    fields = {}
    pnm = None
    in_ext = False
    reserved_zero = False
    with open(path, encoding="utf-8") as f:
        for line in f:
            m = re.match(r'^\s+PNM \[[^\]]*\]: \S+\s+"([^"]*)"', line)
            if m:
                pnm = m.group(1)
            if line.startswith("EXT_CSD:"):
                in_ext = True
                continue
            if not in_ext:
                continue
            if "Reserved bytes: all 0" in line:
                reserved_zero = True
                continue
            m = re.match(r"^\s+([A-Z0-9_]+) \[(\d+)\]: (.*)$", line)
            if not m:
                continue
            name, off, rest = m.group(1), int(m.group(2)), m.group(3)
            m2 = re.match(r"^0x([0-9a-f]+)\s+(.*)$", rest)
            if m2:
                hexv = m2.group(1)
                n = len(hexv) // 2
                v = int(hexv, 16)
                vals = [(v >> (8 * i)) & 0xFF for i in range(n)]
                access = m2.group(2)
            else:
                m3 = re.match(r"^([0-9a-f]{2}) × (\d+)\s+(.*)$", rest)
                if m3:
                    vals = [int(m3.group(1), 16)] * int(m3.group(2))
                    access = m3.group(3)
                else:
                    toks = rest.split()
                    vals = []
                    while toks and re.fullmatch(r"[0-9a-f]{2}", toks[0]):
                        vals.append(int(toks.pop(0), 16))
                    access = " ".join(toks)
            data[off:off + len(vals)] = bytes(vals)
            fields[name] = (off, len(vals), access[:24])
    if not fields:
        raise ValueError(f"{path}: no EXT_CSD fields")
    if not reserved_zero:
        raise ValueError(f"{path}: reserved EXT_CSD bytes are not all 0")
    return bytes(data), fields, pnm


def field_at(fields, index):
    for name, (off, n, access) in fields.items():
        if off <= index < off + n:
            return name, off, access
    return f"reserved[{index}]", index, ""


def parse_cmd_log(path):
    """[(line number, opcode, arg, text)] of the command log."""
    out = []
    with open(path, encoding="utf-8", errors="replace") as f:
        for i, line in enumerate(f):
            if line.startswith("#"):
                continue
            m = re.match(r"^\d+ CMD(\d+) \S+ (?:auto )?arg=0x([0-9a-f]{8})", line)
            if m:
                out.append((i, int(m.group(1)), int(m.group(2), 16), line.rstrip("\n")))
    return out


def ok_cmd(text):
    return " err=" not in text


def switch_history(cmds, model):
    """For each EXT_CSD byte, the values CMD6 gave it, in order (from the model's)."""
    hist = {i: [model[i]] for i in range(EXT_CSD_LEN)}
    for _, op, arg, text in cmds:
        if op != 6 or not ok_cmd(text):
            continue
        access, index, value = (arg >> 24) & 3, (arg >> 16) & 0xFF, (arg >> 8) & 0xFF
        cur = hist[index][-1]
        if access == 1:
            new = cur | value
        elif access == 2:
            new = cur & ~value & 0xFF
        elif access == 3:
            new = value
        else:
            continue
        hist[index].append(new)
    return hist


class Checks:
    def __init__(self):
        self.failures = []
        self.summary = {}

    def fail(self, msg):
        print(f"FAIL: {msg}")
        self.failures.append(msg)


def check_probe(c, sh, dmesg, pnm):
    text = "\n".join(dmesg)
    want = [(rf"mmcblk0: mmc0:\w+ {re.escape(pnm)} ", f"mmcblk0 named {pnm}"),
            (r"mmcblk0boot0: mmc0:", "mmcblk0boot0"), (r"mmcblk0boot1: mmc0:", "mmcblk0boot1"),
            (r"mmcblk0rpmb: mmc0:", "mmcblk0rpmb")]
    for pat, what in want:
        m = re.search(pat + r".*", text)
        if m:
            print(f"probe: {what}: {m.group(0).split('] ')[-1].strip()}")
        else:
            c.fail(f"the kernel log does not show {what}")
    m = re.search(r"mmc0: new (.*) at address", text)
    if m:
        print(f"probe: the kernel says: mmc0: new {m.group(1)}")
    probe = sh.get("sdhci-probe", (1, ""))[1]
    ios = {}
    for key in ("clock", "actual clock", "bus width", "timing spec", "signal voltage"):
        m = re.search(rf"^\s+{key}:\s+(.*)$", probe, re.M)
        if m:
            ios[key] = m.group(1).strip()
    host = re.search(r"^host mmc0: (.*)$", probe, re.M)
    if host:
        ios["host"] = host.group(1)
        if "sdhci-pci" not in host.group(1):
            c.fail(f"mmc0 is not bound to sdhci-pci: {host.group(1)}")
    else:
        c.fail("no mmc0 host bound")
    c.summary["ios"] = ios
    c.summary["card"] = m.group(1) if m else None
    print("probe: bus: " + ", ".join(f"{k} {v}" for k, v in ios.items()))


def check_extcsd(c, sh, model, after, fields, cmds):
    rc, text = sh.get("card-extcsd", (None, ""))
    m = re.search(r"^EXTCSD-HEX: ([0-9a-f]+)$", text, re.M)
    if not m or len(m.group(1)) != 2 * EXT_CSD_LEN:
        c.fail("the guest printed no 512-byte EXT_CSD from debugfs")
        return
    guest = bytes.fromhex(m.group(1))
    hist = switch_history(cmds, model)
    unexplained = 0
    same = sum(1 for i in range(EXT_CSD_LEN) if guest[i] == after[i])
    print(f"EXT_CSD: guest (debugfs) vs image after the run: {same} of {EXT_CSD_LEN} bytes equal")
    for i in range(EXT_CSD_LEN):
        g, a, mo = guest[i], after[i], model[i]
        if g == a:
            continue
        name, off, access = field_at(fields, i)
        label = f"{name}[{i}]" if off == i else f"{name}[{off}+{i - off}]"
        written = hist[i][1:]
        steps = [v for k, v in enumerate(hist[i]) if k == 0 or v != hist[i][k - 1]]
        steps_text = " -> ".join(f"{v:#04x}" for v in steps) + f", {len(written)} CMD6"
        if name in LIVE:
            why = "live status: what it reads depends on when"
        elif g in hist[i] and written and (a == mo and "E_P" in access):
            why = (f"the guest set it by CMD6 ({steps_text});"
                   f" {access.split()[0]}: the power-off restored the default")
        elif g in hist[i] and written and a == hist[i][-1]:
            why = (f"the guest set it by CMD6 and changed it later "
                   f"({steps_text})")
        else:
            why = "UNEXPLAINED"
            unexplained += 1
        print(f"  {label:<32} guest {g:#04x}  image after {a:#04x}  model {mo:#04x}: {why}")
    # Against the model's fresh registers: only what the guest switched, and live fields.
    for i in range(EXT_CSD_LEN):
        if guest[i] != model[i]:
            name, _, _ = field_at(fields, i)
            if name not in LIVE and guest[i] not in hist[i][1:]:
                print(f"  {name}[{i}]: guest {guest[i]:#04x}, model {model[i]:#04x}, "
                      "no CMD6 wrote it: UNEXPLAINED")
                unexplained += 1
    if unexplained:
        c.fail(f"EXT_CSD: {unexplained} bytes differ without an explanation")
    # mmc-utils' view: [NAME: 0xNN] lines for one-byte fields of the same name.
    mu = text.split("MMC-EXTCSD-BEGIN", 1)[-1]
    compared = mism = 0
    for name, val in re.findall(r"\[([A-Z0-9_]+): 0x([0-9a-fA-F]{2})\]", mu):
        if name in fields and fields[name][1] == 1:
            compared += 1
            if int(val, 16) != guest[fields[name][0]]:
                mism += 1
                c.fail(f"mmc-utils prints {name} {val}, debugfs read {guest[fields[name][0]]:#04x}")
    if "Extended CSD rev" not in mu:
        c.fail("mmc extcsd read printed no EXT_CSD")
    print(f"EXT_CSD: mmc-utils' extcsd read: {compared} one-byte fields by name, "
          f"{mism} differ from the debugfs bytes")
    c.summary["ext_csd"] = {"bytes_equal_after": same, "unexplained": unexplained,
                            "mmc_utils_fields": compared}


def erase_sequences(cmds):
    """(start, end, CMD38 arg) for each CMD35, CMD36, CMD38 in a row that succeeded."""
    seqs = []
    for k in range(len(cmds) - 2):
        trio = cmds[k:k + 3]
        ops = [t[1] for t in trio]
        # CMD13 polls may sit between; take the next CMD36 and CMD38 after a CMD35.
        if ops[0] != 35:
            continue
        rest = [t for t in cmds[k + 1:k + 12] if t[1] in (36, 38)]
        if len(rest) >= 2 and rest[0][1] == 36 and rest[1][1] == 38:
            if all(ok_cmd(t[3]) for t in (trio[0], rest[0], rest[1])):
                seqs.append((trio[0][2], rest[0][2], rest[1][2]))
    return seqs


def covered(seqs, start, end, args):
    """Whether sequences with an argument in ARGS cover sectors [start, end]."""
    parts = sorted((s, e) for s, e, a in seqs if a in args and start <= s and e <= end)
    pos = start
    for s, e in parts:
        if s > pos:
            return False
        pos = max(pos, e + 1)
    return pos > end


def check_discard(c, sh, gt, cmds):
    rc, text = sh.get("card-discard", (None, ""))
    res = dict(re.findall(r"^DISCARD-RESULT: (\w+) rc=(\d+)$", text, re.M))
    seqs = erase_sequences(cmds)
    length = int(gt["GT_DISCARD_LEN"]) // 512
    d0 = int(gt["GT_DISCARD_OFFSET"]) // 512
    s0 = int(gt["GT_SECDISCARD_OFFSET"]) // 512
    for s, e, a in seqs:
        print(f"discard: the log shows CMD35 {s:#x} CMD36 {e:#x} CMD38 {a:#010x}")
    if res.get("discard") != "0":
        c.fail(f"blkdiscard failed in the guest (rc {res.get('discard')})")
    elif not covered(seqs, d0, d0 + length - 1, {0x3}):
        c.fail(f"no CMD35/36/38 (arg 0x00000003) covering sectors {d0}..{d0 + length - 1}")
    else:
        print(f"discard: sectors {d0}..{d0 + length - 1} discarded with CMD38 arg 0x00000003")
    secure_args = {0x80000000, 0x80000001}
    secure_seen = [x for x in seqs if x[2] in secure_args | {0x80008000}]
    if res.get("secure") == "0":
        if covered(seqs, s0, s0 + length - 1, secure_args):
            print(f"discard: secure discard of sectors {s0}..{s0 + length - 1}: "
                  f"CMD38 {', '.join(sorted({f'{a:#010x}' for _, _, a in secure_seen}))}")
            c.summary["secure_discard"] = "done"
        else:
            c.fail("blkdiscard -s succeeded but no secure CMD38 covers its range")
    else:
        print(f"discard: the kernel refused the secure discard (blkdiscard -s rc "
              f"{res.get('secure')}), and {len(secure_seen)} secure CMD38 reached the card")
        c.summary["secure_discard"] = f"refused (rc {res.get('secure')})"
        if secure_seen:
            c.fail("a refused secure discard reached the card")


def fio_doc(fio, name):
    rc, text = fio.get(name, (None, ""))
    start = text.find("{")
    if start < 0:
        return None
    try:
        return json.loads(text[start:])
    except ValueError:
        return None


def check_fsync(c, fio, cmds):
    doc = fio_doc(fio, "card-fsync")
    fsyncs = 0
    if doc:
        for job in doc.get("jobs", []):
            fsyncs += int(job.get("sync", {}).get("total_ios", 0) or 0)
    flushes = sum(1 for _, op, arg, t in cmds if op == 6 and arg == FLUSH_ARG and ok_cmd(t))
    print(f"fsync: fio counted {fsyncs} fsyncs; the command log has {flushes} CMD6 FLUSH_CACHE")
    c.summary["fsync"] = {"fsyncs": fsyncs, "flush_cache": flushes}
    if fsyncs == 0:
        c.fail("card-fsync.fio counted no fsync")
    elif flushes < fsyncs:
        c.fail(f"fewer FLUSH_CACHE ({flushes}) than fsyncs ({fsyncs})")


def check_crc(c, gt, cmds, dmesg):
    start = size_bytes(gt["GT_CRC_OFFSET"]) // 512
    end = start + size_bytes(gt["GT_CRC_SIZE"]) // 512
    errs = [t for _, op, arg, t in cmds if op in (24, 25) and start <= arg < end
            and "data-err=" in t]
    writes = [t for _, op, arg, t in cmds if op in (24, 25) and start <= arg < end]
    print(f"crc: {len(writes)} writes to card-crc's region, {len(errs)} with an injected "
          "data error")
    for t in errs[:3]:
        print(f"  {t}")
    lines = [ln for ln in dmesg if re.search(r"mmc|mmcblk", ln) and re.search(r"-84|error", ln)]
    for ln in lines[:4]:
        print(f"  kernel: {ln.strip()}")
    c.summary["crc"] = {"writes": len(writes), "injected": len(errs)}
    if not errs:
        c.fail("the command log shows no data error in card-crc's region")


def check_power_cut(c, cmds, dmesg):
    first_write = next((i for i, (_, op, _, t) in enumerate(cmds) if op in (24, 25)), None)
    reinit = [i for i, (_, op, _, t) in enumerate(cmds) if op == 1 and first_write is not None
              and i > first_write]
    timeouts = [t for _, _, _, t in cmds[first_write or 0:] if "err=" in t]
    print(f"power cut: {len(timeouts)} commands failed after the first write; "
          f"the card was brought up again {'(CMD1 seen)' if reinit else 'never'}")
    for ln in [ln for ln in dmesg if re.search(r"mmc0|mmcblk0", ln)][-8:]:
        print(f"  kernel: {ln.strip()}")
    c.summary["power_cut"] = {"failed_commands": len(timeouts), "reinitialised": bool(reinit)}
    if not reinit:
        c.fail("after the power cut the guest never brought the card up again (no CMD1)")


def check_stall(c, fio):
    doc = fio_doc(fio, "card-stall")
    if not doc:
        c.fail("card-stall.fio: no fio output")
        return
    rows = {}
    for job in doc.get("jobs", []):
        w = job.get("write", {})
        clat = w.get("clat_ns", {})
        pct = clat.get("percentile", {})

        def p(q):
            for k, v in pct.items():
                if abs(float(k) - q) < 1e-6:
                    return v / 1e6
            return float("nan")
        rows[job["jobname"]] = {"ios": w.get("total_ios", 0), "p10_ms": p(10.0),
                                "p50_ms": p(50.0), "p90_ms": p(90.0),
                                "max_ms": clat.get("max", 0) / 1e6,
                                "mib_s": w.get("bw", 0) / 1024}
        r = rows[job["jobname"]]
        print(f"stall: {job['jobname']:<24} {r['ios']:>5} writes  clat p10 {r['p10_ms']:.2f} "
              f"p50 {r['p50_ms']:.2f} p90 {r['p90_ms']:.2f} max {r['max_ms']:.2f} ms "
              f"({r['mib_s']:.2f} MiB/s)")
    c.summary["stall"] = rows
    cross = rows.get("stall-1k-page-crossing")
    inpage = rows.get("stall-1k-in-page")
    # docs/fidelity.md: the -A stall is 110-117 ms on the real card, 119-121 ms simulated.
    if not cross or not cross["p50_ms"] >= 90:
        c.fail("the page-crossing 1 KiB writes do not show the ~115 ms AU collection "
               "at the median")
    if not inpage or not inpage["p50_ms"] < 20:
        c.fail("the in-page 1 KiB writes are not fast (the small-write buffer)")


def size_bytes(v):
    mult = {"k": 1 << 10, "m": 1 << 20, "g": 1 << 30}
    return int(v[:-1]) * mult[v[-1]] if v[-1] in mult else int(v)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--jobs", required=True)
    ap.add_argument("--data", required=True)
    ap.add_argument("--cmd-log", required=True)
    ap.add_argument("--inspect-model", required=True)
    ap.add_argument("--inspect-after", required=True)
    ap.add_argument("--gt", default="", help="the job set's GT_NAME=value words")
    ap.add_argument("--summary-json")
    args = ap.parse_args()
    gt = dict(w.split("=", 1) for w in args.gt.split() if "=" in w)
    with open(args.data, encoding="utf-8", errors="replace") as f:
        sh, fio, dmesg = sections(f.read())
    c = Checks()
    model, fields, pnm = parse_inspect(args.inspect_model)
    cmds = parse_cmd_log(args.cmd_log)
    print(f"command log: {len(cmds)} commands")
    check_probe(c, sh, dmesg, pnm or "?")
    if args.jobs == "card":
        after, _, _ = parse_inspect(args.inspect_after)
        check_extcsd(c, sh, model, after, fields, cmds)
        check_discard(c, sh, gt, cmds)
        check_fsync(c, fio, cmds)
        check_crc(c, gt, cmds, dmesg)
        check_power_cut(c, cmds, dmesg)
    elif args.jobs == "card-stall":
        check_stall(c, fio)
    c.summary["failures"] = c.failures
    if args.summary_json:
        with open(args.summary_json, "w", encoding="utf-8") as f:
            json.dump(c.summary, f, indent=1)
    print(f"card checks: {len(c.failures)} failed")
    return 1 if c.failures else 0


if __name__ == "__main__":
    sys.exit(main())
