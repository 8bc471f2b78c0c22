#!/usr/bin/env python3
"""How fast do 1 MiB writes, and 4 KiB writes and reads, go into and out of a tmpfs image? No daemon.

The image writer thread (crates/card/src/store/mapped.rs) copies large writes into a
shared mapping of the image instead of calling `pwrite`. This prints the rates that
choice rests on, from one thread, over a file already written once (as the benchmark's
image is):

* pwrite                 — `os.pwrite` of 1 MiB at a time (what qemu-storage-daemon does);
* memcpy into a mapping  — a copy into pages of a mapping that stays in place;
* populate + memcpy      — the same, each copy preceded by madvise(MADV_POPULATE_WRITE)
                           on its pages (what the writer does: an error, not SIGBUS, when
                           the filesystem is full);
* map, copy, unmap       — a mapping made and torn down for each write (the page tables
                           filled every time: what a window that does not stay mapped costs).

Python's own cost per 1 MiB operation is a few microseconds against 100-200 µs of copying.

Then 4 KiB at random page offsets over the same span (ns per operation): `pwrite`,
populate + copy into the mapping, a copy into a page already populated (what the device
thread's small writes cost once their page is known to be allocated), and for reads
`pread` against a copy out of the mapping. Here Python's own cost per call is of the
order of the figures themselves, so a last row copies 4 KiB between two buffers in the
same way: subtract it from the others to compare what the kernel and the memory cost.

Usage: ci/image-copy-rates.py [--dir /dev/shm] [--span-mib 512] [--seconds 1] [--rounds 3]
"""

import argparse
import mmap
import os
import time

MADV_POPULATE_WRITE = 23  # Linux 5.14; not in every Python's mmap module
BS = 1 << 20


def rate(seconds, span, step):
    """GB/s of `step(offset)` calls, each copying BS bytes, cycling over `span`."""
    done = 0
    start = time.perf_counter()
    while time.perf_counter() - start < seconds:
        for off in range(0, span, BS):
            step(off)
            done += BS
    return done / (time.perf_counter() - start) / 1e9


def small(fd, whole, view, span, args):
    """ns per 4 KiB operation at random page offsets (median of the rounds)."""
    import random

    page = 4096
    rng = random.Random(1)
    offsets = [rng.randrange(span // page) * page for _ in range(100_000)]
    src = bytes(range(256)) * (page // 256)
    dst = bytearray(page)
    other = memoryview(bytearray(2 * page))

    def populate_copy(off):
        whole.madvise(MADV_POPULATE_WRITE, off, page)
        view[off:off + page] = src

    def copy_in(off):
        view[off:off + page] = src

    def copy_out(off):
        dst[:] = view[off:off + page]

    def pread(off):
        os.preadv(fd, [dst], off)

    def hot(_off):
        other[page:] = src

    steps = [
        ("pwrite", lambda off: os.pwrite(fd, src, off)),
        ("populate + copy in", populate_copy),
        ("copy in, populated", copy_in),
        ("pread", pread),
        ("copy out", copy_out),
        ("Python's floor", hot),
    ]
    results = {name: [] for name, _ in steps}
    for _ in range(args.rounds):
        for name, step in steps:
            start = time.perf_counter()
            for off in offsets:
                step(off)
            results[name].append((time.perf_counter() - start) / len(offsets) * 1e9)
    print(f"4 KiB at random page offsets over {args.span_mib} MiB, {len(offsets)} each, "
          f"{args.rounds} rounds (ns per operation, median):")
    for name, got in results.items():
        med = sorted(got)[len(got) // 2]
        print(f"  {name:24} {med:7.0f}  ({' '.join(f'{g:.0f}' for g in got)})")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--dir", default="/dev/shm")
    ap.add_argument("--span-mib", type=int, default=512)
    ap.add_argument("--seconds", type=float, default=1.0)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    span = args.span_mib << 20
    path = os.path.join(args.dir, f"image-copy-rates.{os.getpid()}")
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        os.ftruncate(fd, span)
        src = bytes(range(256)) * (BS // 256)
        for off in range(0, span, BS):
            os.pwrite(fd, src, off)
        whole = mmap.mmap(fd, span, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        view = memoryview(whole)

        def copy(off):
            view[off:off + BS] = src

        def populate_copy(off):
            whole.madvise(MADV_POPULATE_WRITE, off, BS)
            view[off:off + BS] = src

        def map_copy_unmap(off):
            m = mmap.mmap(fd, BS, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE, offset=off)
            m.madvise(MADV_POPULATE_WRITE)
            m[:] = src
            m.close()

        steps = [
            ("pwrite", lambda off: os.pwrite(fd, src, off)),
            ("memcpy into a mapping", copy),
            ("populate + memcpy", populate_copy),
            ("map, copy, unmap", map_copy_unmap),
        ]
        print(f"1 MiB writes over {args.span_mib} MiB of {args.dir}, one thread, "
              f"{args.seconds:g} s each, {args.rounds} rounds (GB/s):")
        results = {name: [] for name, _ in steps}
        for _ in range(args.rounds):
            for name, step in steps:
                try:
                    results[name].append(rate(args.seconds, span, step))
                except OSError as e:  # a kernel without MADV_POPULATE_WRITE
                    results[name].append(None)
                    print(f"  {name}: {e}")
        base = sorted(results["pwrite"])[len(results["pwrite"]) // 2]
        for name, got in results.items():
            got = [g for g in got if g is not None]
            if not got:
                continue
            med = sorted(got)[len(got) // 2]
            print(f"  {name:24} median {med:5.2f}  ({' '.join(f'{g:.2f}' for g in got)})"
                  f"  {med / base:.2f}× pwrite")
        small(fd, whole, view, span, args)
        view.release()
        whole.close()
    finally:
        os.close(fd)
        os.unlink(path)


if __name__ == "__main__":
    main()
