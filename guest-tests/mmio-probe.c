/*
 * mmio-probe: the cost of one MMIO round trip as the guest sees it (issue 14).
 *
 * Maps BAR0 of the PCI function given (its sysfs resource0) and reads the 32-bit
 * register at OFFSET (default 0x24, the SDHCI Present State) COUNT times, timing the
 * loop with CLOCK_MONOTONIC. Prints one line:
 *   MMIO-ROUNDTRIP: <ns> ns per read, <count> reads of <offset> on <device>
 *
 *   mmio-probe /sys/bus/pci/devices/0000:00:02.0 [COUNT [OFFSET]]
 *
 * Reading Present State has no side effect; the caller keeps the function in D0
 * (power/control = on) while it runs.
 */
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

static double now_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec * 1e9 + ts.tv_nsec;
}

int main(int argc, char **argv)
{
	char path[512];
	long count = argc > 2 ? strtol(argv[2], NULL, 0) : 20000;
	long offset = argc > 3 ? strtol(argv[3], NULL, 0) : 0x24;
	volatile uint32_t *bar;
	uint32_t sink = 0;
	double t0, t1;
	int fd;

	if (argc < 2 || count <= 0 || offset < 0 || offset > 0xffc || offset % 4) {
		fprintf(stderr, "usage: mmio-probe PCI-DEVICE-DIR [COUNT [OFFSET]]\n");
		return 2;
	}
	snprintf(path, sizeof(path), "%s/resource0", argv[1]);
	fd = open(path, O_RDWR | O_SYNC);
	if (fd < 0) {
		perror(path);
		return 1;
	}
	bar = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	if (bar == MAP_FAILED) {
		perror("mmap");
		return 1;
	}
	sink ^= bar[offset / 4]; /* warm up */
	t0 = now_ns();
	for (long i = 0; i < count; i++)
		sink ^= bar[offset / 4];
	t1 = now_ns();
	printf("MMIO-ROUNDTRIP: %.0f ns per read, %ld reads of %#lx on %s (last %#x)\n",
	       (t1 - t0) / count, count, offset, argv[1], bar[offset / 4]);
	(void)sink;
	return 0;
}
