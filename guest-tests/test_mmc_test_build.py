#!/usr/bin/env python3
"""Tests of mmc-test-build.sh that need no network and no kernel build: what it makes of a
kernel build directory (mmc_test built in, a module already built, no .config), and how
it reads a kernel image's version string."""

import os
import struct
import subprocess
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
SCRIPT = os.path.join(HERE, "mmc-test-build.sh")


def run(*args, cache):
    return subprocess.run([SCRIPT, *args, "--cache", cache], capture_output=True, text=True,
                          check=False)


def fake_bzimage(path, version):
    """The fields of an x86 boot header mmc-test-build.sh reads: "HdrS" at 0x202 and the
    kernel_version pointer at 0x20e (offset by 0x200) to a NUL-terminated string."""
    data = bytearray(0x1000)
    data[0x202:0x206] = b"HdrS"
    at = 0x800
    struct.pack_into("<H", data, 0x20E, at - 0x200)
    text = version.encode() + b"\0"
    data[at:at + len(text)] = text
    with open(path, "wb") as f:
        f.write(data)


class KernelBuildTest(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()
        self.dir = self.tmp.name
        self.tree = os.path.join(self.dir, "linux")
        os.makedirs(os.path.join(self.tree, "drivers", "mmc", "core"))
        self.out = os.path.join(self.dir, "out.ko")

    def tearDown(self):
        self.tmp.cleanup()

    def config(self, text):
        with open(os.path.join(self.tree, ".config"), "w", encoding="utf-8") as f:
            f.write(text)

    def test_no_config_is_a_setup_error(self):
        r = run("--kernel-build", self.tree, "--out", self.out, cache=self.dir)
        self.assertEqual(r.returncode, 2)
        self.assertIn("has no .config", r.stderr)

    def test_built_in_needs_no_module(self):
        self.config("CONFIG_MMC=y\nCONFIG_MMC_TEST=y\n")
        r = run("--kernel-build", self.tree, "--out", self.out, cache=self.dir)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertEqual(r.stdout.strip(), "built-in")
        self.assertFalse(os.path.exists(self.out))

    def test_a_module_the_tree_built_is_used(self):
        self.config("CONFIG_MMC=y\nCONFIG_MMC_TEST=m\n")
        with open(os.path.join(self.tree, "drivers/mmc/core/mmc_test.ko"), "wb") as f:
            f.write(b"\x7fELF module")
        r = run("--kernel-build", self.tree, "--out", self.out, cache=self.dir)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertEqual(r.stdout.strip(), self.out)
        with open(self.out, "rb") as f:
            self.assertEqual(f.read(), b"\x7fELF module")

    def test_an_unbuilt_tree_is_refused_before_make(self):
        self.config("CONFIG_MMC=y\n# CONFIG_MMC_TEST is not set\n")
        r = run("--kernel-build", self.tree, "--out", self.out, cache=self.dir)
        self.assertEqual(r.returncode, 2)
        self.assertIn("no Module.symvers", r.stderr)


class DebianKernelTest(unittest.TestCase):
    def test_version_string_is_read_and_a_trixie_kernel_is_refused(self):
        with tempfile.TemporaryDirectory() as d:
            image = os.path.join(d, "vmlinuz")
            fake_bzimage(image, "6.12.117+deb13-amd64 (debian-kernel@lists.debian.org) #1 "
                                "SMP PREEMPT_DYNAMIC Debian 6.12.117-1 (2026-11-01)")
            r = run("--vmlinuz", image, "--out", os.path.join(d, "m.ko"), cache=d)
            self.assertEqual(r.returncode, 2)
            self.assertIn("6.12.117+deb13-amd64 is a trixie kernel", r.stderr)

    def test_a_kernel_without_a_debian_version_is_refused(self):
        with tempfile.TemporaryDirectory() as d:
            image = os.path.join(d, "vmlinuz")
            fake_bzimage(image, "6.1.176 (me@host) #1 SMP PREEMPT_DYNAMIC Tue Dec 1 2026")
            r = run("--vmlinuz", image, "--out", os.path.join(d, "m.ko"), cache=d)
            self.assertEqual(r.returncode, 2)
            self.assertIn("carries no Debian version", r.stderr)

    def test_not_a_kernel_image(self):
        with tempfile.TemporaryDirectory() as d:
            image = os.path.join(d, "vmlinuz")
            with open(image, "wb") as f:
                f.write(b"\0" * 4096)
            r = run("--vmlinuz", image, "--out", os.path.join(d, "m.ko"), cache=d)
            self.assertEqual(r.returncode, 2)
            self.assertIn("cannot read the kernel version", r.stderr)


if __name__ == "__main__":
    unittest.main()
