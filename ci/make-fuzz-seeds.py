#!/usr/bin/env python3
"""Write the small seed corpora under fuzz/corpus/<target>/ (committed; regenerate with
this script). Each seed is a structured input that reaches deep into its target's code;
the layouts follow the decoders in crates/frontend/src/fuzzing.rs."""
import os
import struct

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "fuzz", "corpus")


def put(target, name, data):
    d = os.path.join(ROOT, target)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, name), "wb") as f:
        f.write(data)


def cmd(index, arg):
    return bytes([0, index]) + struct.pack("<I", arg)


def write_blocks(n, byte):
    return bytes([3, n, 0]) + bytes([byte]) * (512 * n)


def read_blocks(n):
    return bytes([4, n])


def switch(index, value):
    return bytes([9, index, value])


WAIT = bytes([5])
RCA = 1 << 16

# card_commands: flags (bit0 4 GiB, bit1 bring up), then ops.
put("card_commands", "write-read", bytes([2]) + cmd(23, 2) + cmd(25, 0) + write_blocks(2, 0x11)
    + WAIT + cmd(23, 2) + cmd(18, 0) + read_blocks(2) + cmd(13, RCA))
put("card_commands", "init-by-hand", bytes([0]) + cmd(0, 0) + cmd(1, 0x40FF8080) * 4 + cmd(2, 0)
    + cmd(3, RCA) + cmd(9, RCA) + cmd(7, RCA) + cmd(8, 0) + read_blocks(1))
put("card_commands", "erase", bytes([3]) + cmd(35, 0) + cmd(36, 1024) + cmd(38, 0) + WAIT
    + cmd(35, 0) + cmd(36, 8) + cmd(38, 0x80000000) + WAIT + cmd(13, RCA))
put("card_commands", "partitions-rpmb", bytes([2]) + switch(179, 1) + cmd(17, 0) + read_blocks(1)
    + switch(179, 3) + cmd(23, 1) + cmd(25, 0) + write_blocks(1, 0) + switch(179, 0) + cmd(13, RCA))
put("card_commands", "lock-wp-sleep", bytes([2]) + cmd(16, 4) + cmd(42, 0)
    + bytes([3, 1, 0]) + b"\x01\x02ab" + cmd(28, 0) + cmd(30, 0) + read_blocks(1)
    + cmd(7, 0) + cmd(5, RCA | 1 << 15) + WAIT + cmd(5, RCA) + cmd(7, RCA) + bytes([8, 1]) + cmd(0, 0))
put("card_commands", "hpi-bkops-cache", bytes([2]) + cmd(23, 64) + cmd(25, 0) + write_blocks(2, 7)
    + cmd(12, 0) + cmd(12, RCA | 1) + switch(163, 1) + switch(164, 1) + switch(32, 1) + WAIT
    + bytes([6, 0xff, 0xff]) + cmd(13, RCA))

# packed_header: max entries, the 512-byte header, model flag, blocks, data.
def header(direction, entries):
    h = bytes([1, direction, len(entries), 0, 0, 0, 0, 0])
    for count, addr, rel in entries:
        h += struct.pack("<II", count | (rel << 31), addr)
    return h + bytes(512 - len(h))


put("packed_header", "write-2", bytes([8]) + header(2, [(1, 0, 0), (2, 100, 1)]) + bytes([0, 3]) + bytes([0x22]) * 1536)
put("packed_header", "read-2", bytes([8]) + header(1, [(1, 0, 0), (1, 7, 0)]) + bytes([0, 1]))
put("packed_header", "bad-version", bytes([63]) + bytes([2, 2, 1]) + bytes(509) + bytes([1, 1]))
put("packed_header", "many", bytes([63]) + header(2, [(1, i * 8, 0) for i in range(60)]) + bytes([1, 15]))

# rpmb_frames: flags (size, key, counter), then ops.
def frame_tail(req, addr=0, count=0, counter=0):
    # The last 16 bytes of a frame: nonce[12..16], counter, address, block count, result, type.
    return bytes(4) + struct.pack(">IHHHH", counter, addr, count, 0, req)


put("rpmb_frames", "program-key-read-counter", bytes([0]) + bytes([0, 0]) + frame_tail(1)
    + bytes([2, 1]) + bytes([0, 0]) + frame_tail(5) + bytes([2, 1]) + bytes([0, 0]) + frame_tail(2) + bytes([2, 1]))
put("rpmb_frames", "signed-write-read", bytes([4]) + bytes([0x0c, 1]) + frame_tail(3, 2, 2) + frame_tail(3, 2, 2)
    + bytes([2, 1]) + bytes([0, 0]) + frame_tail(4, 2, 2) + bytes([2, 2]) + bytes([0x4c, 0]) + frame_tail(3, 0xffff, 1))
put("rpmb_frames", "counter-max", bytes([0x0d]) + bytes([0x0c, 0]) + frame_tail(3, 1, 1) + bytes([0x0c, 0])
    + frame_tail(3, 1, 1) + bytes([2, 1, 0x12, 0]) + frame_tail(1) + bytes([3]))

# blk_chain: capacity/8 (u16), ndesc-1, per desc: addr sel, addr u16, len sel (+len), flags, next;
# head; then the memory fill pattern (header bytes of the request first).
def desc(sel, off, lensel, lenarg, flags, nxt):
    return bytes([sel]) + struct.pack("<H", off) + bytes([lensel]) + lenarg + bytes([flags, nxt])


fill_read = struct.pack("<IIQ", 0, 0, 8)
put("blk_chain", "read", struct.pack("<H", 1024) + bytes([2])
    + desc(0, 0x1000, 1, b"", 1, 1) + desc(3, 0, 2, bytes([1]), 3, 2) + desc(0, 0x2000, 0, bytes([1]), 2, 0)
    + bytes([0]) + fill_read * 0)
put("blk_chain", "write-indirect", struct.pack("<H", 1024) + bytes([1])
    + desc(0, 0x1000, 0, bytes([48]), 4, 0) + desc(0, 0, 1, b"", 0, 0) + bytes([0]) + struct.pack("<IIQ", 1, 0, 0))
put("blk_chain", "discard", struct.pack("<H", 64) + bytes([2])
    + desc(0, 0x1000, 1, b"", 1, 1) + desc(1, 0x1010, 0, bytes([16]), 1, 2) + desc(2, 0x2000, 0, bytes([1]), 2, 0)
    + bytes([0]) + struct.pack("<IIQ", 11, 0, 0))
put("blk_chain", "get-id", struct.pack("<H", 64) + bytes([1])
    + desc(0, 0x1000, 1, b"", 1, 1) + desc(3, 0x100, 0, bytes([20]), 2, 0) + bytes([0]) + struct.pack("<IIQ", 8, 0, 0))

# mmc_chain: per round: kind, arrival u16, shape, then the request fields.
def mmc_req(flags, opcode, resp, cmdflags, arg, sbc, blksz_sel, blocks, nseg, kind=1):
    return (bytes([kind]) + struct.pack("<H", 10) + bytes([0]) + struct.pack("<I", flags)
            + bytes([opcode, resp, cmdflags]) + struct.pack("<II", arg, sbc)
            + bytes([blksz_sel, blocks]) + struct.pack("<H", 0) + bytes([nseg]))


def mmc_ctrl(kind, arg0, arg1):
    return bytes([0]) + struct.pack("<H", 10) + bytes([0, kind]) + struct.pack("<QQ", arg0, arg1)


bring_up = (mmc_req(0, 0, 0, 0, 0, 0, 0, 0, 0) + mmc_req(0, 1, 4, 0, 0x40FF8080, 0, 0, 0, 0) * 3
            + mmc_req(0, 2, 3, 0, 0, 0, 0, 0, 0) + mmc_req(0, 3, 1, 0, RCA, 0, 0, 0, 0)
            + mmc_req(0, 7, 2, 1, RCA, 0, 0, 0, 0))
put("mmc_chain", "bring-up-write-read", bring_up
    + mmc_req(1 | 2 | 8, 25, 1, 0, 0, 2, 0, 2, 2) + mmc_req(1 | 2, 18, 1, 0, 0, 2, 0, 2, 2)
    + mmc_req(2, 8, 1, 0, 0, 0, 0, 1, 1))
put("mmc_chain", "control", mmc_ctrl(1, 52_000_000, 0x0301) + mmc_ctrl(0, 0, 0) + mmc_ctrl(4, 0, 0)
    + mmc_ctrl(6, 10_000_000, 0) + mmc_ctrl(7, 0, 0) + mmc_ctrl(2, 0, 0))
put("mmc_chain", "odd-chains", bring_up + bytes([1, 0, 0, 3]) + struct.pack("<I", 2) + bytes(30)
    + bytes([2, 0, 0, 1, 0x20]) + bytes(8))

# model_toml: mode 0 = whole text, mode 1 = built-in model with one line replaced.
models = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "device-models")
with open(os.path.join(models, "ideal.toml"), "rb") as f:
    put("model_toml", "ideal", bytes([0]) + f.read())
put("model_toml", "generic-sec-count", bytes([1, 0]) + struct.pack("<H", 30) + b"sec_count = 0")
put("model_toml", "toshiba-line", bytes([1, 1]) + struct.pack("<H", 60) + b"x = [1, 2, {a = 3}]")
put("model_toml", "garbage", bytes([0]) + b"[ext_csd]\nsec_count = -1\n[timing\n")
