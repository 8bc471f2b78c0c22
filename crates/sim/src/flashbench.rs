//! Arnd Bergmann's flashbench tests as workloads on a [`BlockDevice`], scheduled and
//! timed the way flashbench does it, so a simulated card can be measured with the same
//! procedure as the cards of seed 003:
//!
//! * [`align`] — `-a` (reads) and the `-A` write variant Andrei Warkentin added in the
//!   thread: at every power-of-two alignment, time a block just before, across and just
//!   after `count` boundaries spread over the device (`pre`/`on`/`post`/`diff`);
//! * [`open_au`] — `-O --open-au-nr N [--random]`: for every block size from the erase
//!   size down, write one erase block's worth in each of N erase blocks 12 erase blocks
//!   apart, interleaved, linearly or in flashbench's pseudo-random order;
//! * [`size_sweep`] — write throughput against block size inside one AU, linear and
//!   random (the thread's `-O -0 1` and `-O -0 1 -r`);
//! * [`scatter`] — `-s --scatter-span=1`: the read time of one block at each consecutive
//!   block offset (the thread's fast and slow MLC pages).
//!
//! Every access is one block request, as flashbench's `pread`/`pwrite` on an `O_DIRECT`
//! device is, split at the host's largest request like the block layer splits it.
//! Offsets wrap around the device, as flashbench's do.

use std::fmt;

use super::device::{BlockDevice, IoError};
use super::report::sig3;
use emmc_card::timing::Nanos;

/// flashbench's pseudo-random sequence: a maximal-length Fibonacci LFSR of `bits` bits
/// (8..=16) that visits every non-zero value once; a zero state starts from 0xACE1.
pub fn lfsr(v: u32, bits: u32) -> u32 {
    // Feedback taps (bit positions XORed into the new top bit), one row per width.
    const TAPS: [&[u32]; 9] = [
        &[0, 2, 3, 4],  // 8:  x^8 + x^6 + x^5 + x^4 + 1
        &[0, 4],        // 9:  x^9 + x^5 + 1
        &[0, 3],        // 10: x^10 + x^7 + 1
        &[0, 2],        // 11: x^11 + x^9 + 1
        &[0, 1, 2, 8],  // 12
        &[0, 1, 2, 5],  // 13: x^13 + x^12 + x^11 + x^8 + 1
        &[0, 1, 2, 12], // 14: x^14 + x^13 + x^12 + x^2 + 1
        &[0, 1],        // 15: x^15 + x^14 + 1
        &[0, 2, 3, 5],  // 16: x^16 + x^14 + x^13 + x^11 + 1
    ];
    assert!((8..=16).contains(&bits), "lfsr width {bits}");
    let mask = (1u32 << bits) - 1;
    let v = if v == 0 { 0xACE1 & mask } else { v };
    let fb = TAPS[(bits - 8) as usize]
        .iter()
        .fold(0, |acc, &t| acc ^ (v >> t))
        & 1;
    (v >> 1) | (fb << (bits - 1))
}

/// The order flashbench's random offset generator visits `num` slots: slot numbers
/// 1..=num (slot 0 never comes up, slot `num` does).
pub fn random_slots(num: u32) -> Vec<u32> {
    let mut bits = 0;
    let mut i = num;
    while i > 0 {
        bits += 1;
        i /= 2;
    }
    let bits = bits.max(8);
    let mut pos = 0;
    (0..num)
        .map(|_| {
            loop {
                pos = lfsr(pos, bits);
                if pos <= num {
                    break;
                }
            }
            pos
        })
        .collect()
}

/// A region of the device the test runs in (flashbench runs on a partition).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Region {
    /// First sector.
    pub start: u64,
    pub sectors: u64,
}

impl Region {
    pub fn whole(dev: &dyn BlockDevice) -> Region {
        Region {
            start: 0,
            sectors: dev.sectors(),
        }
    }

    fn bytes(&self) -> u64 {
        self.sectors * 512
    }
}

/// Issue one flashbench access of `len` bytes at byte offset `pos` of `region` (wrapped,
/// split at `max_request` sectors). Returns its time.
fn access(
    dev: &mut dyn BlockDevice,
    region: Region,
    pos: u64,
    len: u64,
    write: bool,
    max_request: u32,
) -> Result<Nanos, IoError> {
    let pos = pos % region.bytes();
    let mut lba = region.start + pos / 512;
    let mut left = (len / 512).max(1);
    let mut t = 0;
    while left > 0 {
        // A request never runs past the region's end: flashbench's pwrite would fail there.
        let room = region.start + region.sectors - lba;
        let n = left.min(u64::from(max_request.max(1))).min(room);
        t += if write {
            dev.write(lba, n as u32, false)?
        } else {
            dev.read(lba, n as u32)?
        };
        left -= n;
        lba += n;
        if lba >= region.start + region.sectors {
            lba = region.start;
        }
    }
    Ok(t)
}

/// Options of the align test (`-a`, or `-A` with `write`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AlignOptions {
    /// `-b`: the block size in bytes (the thread used 1024).
    pub blocksize: u64,
    /// `-c`: tries per measurement; each position keeps its fastest try.
    pub tries: u32,
    /// Boundaries measured per alignment. The 2011 flashbench used 32 (the thread's
    /// "maxalign is 8mb due to count 32"); later versions use 7.
    pub positions: u32,
    /// `-A`: write instead of read.
    pub write: bool,
    /// The host's largest request in sectors.
    pub max_request: u32,
}

impl Default for AlignOptions {
    fn default() -> Self {
        AlignOptions {
            blocksize: 1024,
            tries: 8,
            positions: 32,
            write: false,
            max_request: 1024,
        }
    }
}

/// One line of `flashbench -a`/`-A`: average times of the blocks before, across and after
/// the boundaries, and `on − (pre + post) / 2`.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize)]
pub struct AlignRow {
    pub align: u64,
    pub pre_ns: f64,
    pub on_ns: f64,
    pub post_ns: f64,
    pub diff_ns: f64,
}

#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct AlignResult {
    pub write: bool,
    pub rows: Vec<AlignRow>,
}

impl AlignResult {
    pub fn row(&self, align: u64) -> Option<&AlignRow> {
        self.rows.iter().find(|r| r.align == align)
    }
}

/// `flashbench -a` / `-A`.
pub fn align(
    dev: &mut dyn BlockDevice,
    region: Region,
    o: &AlignOptions,
) -> Result<AlignResult, IoError> {
    let bs = o.blocksize.max(512);
    let count = u64::from(o.positions.max(1));
    // The largest alignment: the smallest power of two (from two blocks) that spreads
    // `count` positions over the device.
    let mut maxalign = bs * 2;
    while maxalign < region.bytes() / count {
        maxalign *= 2;
    }
    let mut rows = Vec::new();
    let mut align = maxalign;
    while align >= bs * 2 {
        let mut pre = vec![0; count as usize];
        let mut on = vec![0; count as usize];
        let mut post = vec![0; count as usize];
        for _ in 0..o.tries.max(1) {
            for (results, offset) in [
                (&mut pre, align - bs),
                (&mut on, align - bs / 2),
                (&mut post, align),
            ] {
                for (i, r) in results.iter_mut().enumerate() {
                    let pos = offset + i as u64 * maxalign;
                    let t = access(dev, region, pos, bs, o.write, o.max_request)?;
                    if *r == 0 || *r > t {
                        *r = t;
                    }
                }
            }
        }
        let avg = |v: &[Nanos]| v.iter().sum::<Nanos>() as f64 / v.len() as f64;
        let (p, n, q) = (avg(&pre), avg(&on), avg(&post));
        rows.push(AlignRow {
            align,
            pre_ns: p,
            on_ns: n,
            post_ns: q,
            diff_ns: n - (p + q) / 2.0,
        });
        align /= 2;
    }
    Ok(AlignResult {
        write: o.write,
        rows,
    })
}

/// Options of the open-AU test (`-O`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OpenAuOptions {
    /// `--open-au-nr`: erase blocks written in turn.
    pub open_aus: u32,
    /// `-r`: pseudo-random order inside each erase block.
    pub random: bool,
    /// `-e`: the erase block size flashbench assumes (default 4 MiB).
    pub erasesize: u64,
    /// `-b`: the smallest block size (the thread used 512).
    pub blocksize: u64,
    /// `--offset`: where the first erase block is; flashbench's default is 16 MiB rounded
    /// up to the erase size, to skip a FAT.
    pub offset: Option<u64>,
    /// Distance between the erase blocks (flashbench: 12 erase blocks).
    pub spacing: Option<u64>,
    /// Stop after this block size (flashbench runs down to `blocksize`; the thread often
    /// interrupted it earlier).
    pub smallest: Option<u64>,
    /// The host's largest request in sectors.
    pub max_request: u32,
}

impl Default for OpenAuOptions {
    fn default() -> Self {
        OpenAuOptions {
            open_aus: 2,
            random: false,
            erasesize: 4 << 20,
            blocksize: 512,
            offset: None,
            spacing: None,
            smallest: None,
            max_request: 1024,
        }
    }
}

/// One line of `flashbench -O`: block size and write throughput.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize)]
pub struct OpenAuRow {
    pub block_bytes: u64,
    /// Mean time per write.
    pub mean_ns: f64,
    /// Bytes per second, as flashbench computes it from the mean.
    pub bytes_per_sec: f64,
}

#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct OpenAuResult {
    pub open_aus: u32,
    pub random: bool,
    pub rows: Vec<OpenAuRow>,
}

impl OpenAuResult {
    pub fn row(&self, block_bytes: u64) -> Option<&OpenAuRow> {
        self.rows.iter().find(|r| r.block_bytes == block_bytes)
    }

    /// Throughput at `block_bytes` in MB/s (10^6 bytes per second, as flashbench prints).
    pub fn mb_per_sec(&self, block_bytes: u64) -> Option<f64> {
        self.row(block_bytes).map(|r| r.bytes_per_sec / 1e6)
    }
}

/// `flashbench -O --open-au-nr N [-r]`.
pub fn open_au(
    dev: &mut dyn BlockDevice,
    region: Region,
    o: &OpenAuOptions,
) -> Result<OpenAuResult, IoError> {
    let erase = o.erasesize.max(512);
    let offset = o.offset.unwrap_or((16u64 << 20).div_ceil(erase) * erase);
    let spacing = o.spacing.unwrap_or(12 * erase);
    let aus = random_slots(o.open_aus.max(1));
    let smallest = o.smallest.unwrap_or(o.blocksize).max(o.blocksize).max(512);
    let mut rows = Vec::new();
    let mut len = erase;
    while len >= smallest {
        let num = (erase / len) as u32;
        let slots: Vec<u32> = if o.random {
            random_slots(num)
        } else {
            (0..num).collect()
        };
        let mut total = 0f64;
        for &slot in &slots {
            let mut sum = 0;
            for &au in &aus {
                let pos = offset + u64::from(au) * spacing + u64::from(slot) * len;
                sum += access(dev, region, pos, len, true, o.max_request)?;
            }
            total += sum as f64 / aus.len() as f64;
        }
        let mean = total / slots.len() as f64;
        rows.push(OpenAuRow {
            block_bytes: len,
            mean_ns: mean,
            bytes_per_sec: len as f64 * 1e9 / mean,
        });
        len /= 2;
    }
    Ok(OpenAuResult {
        open_aus: o.open_aus,
        random: o.random,
        rows,
    })
}

/// Write throughput against block size inside one AU, linear and random.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct SizeSweep {
    pub linear: OpenAuResult,
    pub random: OpenAuResult,
}

/// The thread's `flashbench -O -0 1 -b 512` and the same with `-r`.
pub fn size_sweep(
    dev: &mut dyn BlockDevice,
    region: Region,
    o: &OpenAuOptions,
) -> Result<SizeSweep, IoError> {
    let linear = open_au(
        dev,
        region,
        &OpenAuOptions {
            open_aus: 1,
            random: false,
            ..*o
        },
    )?;
    let random = open_au(
        dev,
        region,
        &OpenAuOptions {
            open_aus: 1,
            random: true,
            ..*o
        },
    )?;
    Ok(SizeSweep { linear, random })
}

/// Options of the scatter test (`-s`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ScatterOptions {
    /// `-b`: bytes read at each position, and the distance between positions.
    pub blocksize: u64,
    /// Positions read: flashbench's `2^--scatter-order` (the thread used order 10).
    pub positions: u32,
    /// `-c`: tries per position; each keeps its fastest.
    pub tries: u32,
    /// The host's largest request in sectors.
    pub max_request: u32,
}

impl Default for ScatterOptions {
    fn default() -> Self {
        ScatterOptions {
            blocksize: 8192,
            positions: 1024,
            tries: 32,
            max_request: 1024,
        }
    }
}

/// What `flashbench -s --scatter-span=1` plots: the read time of one block at each
/// consecutive block offset.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct ScatterResult {
    pub blocksize: u64,
    /// Fastest try per position, in position order.
    pub read_ns: Vec<Nanos>,
}

impl ScatterResult {
    /// The two lines of the plot: the mean time of the positions below the midpoint of the
    /// fastest and slowest, and of those above it (equal when every read takes as long).
    pub fn levels(&self) -> (f64, f64) {
        let (Some(&lo), Some(&hi)) = (self.read_ns.iter().min(), self.read_ns.iter().max()) else {
            return (0.0, 0.0);
        };
        let mid = (lo + hi) as f64 / 2.0;
        let mean = |v: Vec<f64>| {
            if v.is_empty() {
                None
            } else {
                Some(v.iter().sum::<f64>() / v.len() as f64)
            }
        };
        let times = || self.read_ns.iter().map(|&t| t as f64);
        let fast = mean(times().filter(|&t| t <= mid).collect()).unwrap_or(lo as f64);
        let slow = mean(times().filter(|&t| t > mid).collect()).unwrap_or(fast);
        (fast, slow)
    }
}

/// `flashbench -s --scatter-span=1`: read one block at each of `positions` consecutive
/// block offsets of the region, `tries` times, keeping the fastest per position.
pub fn scatter(
    dev: &mut dyn BlockDevice,
    region: Region,
    o: &ScatterOptions,
) -> Result<ScatterResult, IoError> {
    let bs = o.blocksize.max(512);
    let mut read_ns = vec![0; o.positions as usize];
    for _ in 0..o.tries.max(1) {
        for (i, r) in read_ns.iter_mut().enumerate() {
            let t = access(dev, region, i as u64 * bs, bs, false, o.max_request)?;
            if *r == 0 || *r > t {
                *r = t;
            }
        }
    }
    Ok(ScatterResult {
        blocksize: bs,
        read_ns,
    })
}

/// A host that splits writes at page boundaries the way Andrei Warkentin's
/// `mmc_adjust_write` did (seed 003, `page_size` sysfs attribute): a write that starts
/// inside a page and runs past its end is sent as the part up to the page boundary, then
/// the rest.
pub struct PageSplit<'a> {
    pub inner: &'a mut dyn BlockDevice,
    pub page_sectors: u32,
}

impl BlockDevice for PageSplit<'_> {
    fn sectors(&self) -> u64 {
        self.inner.sectors()
    }

    fn now(&self) -> Nanos {
        self.inner.now()
    }

    fn idle(&mut self, ns: Nanos) {
        self.inner.idle(ns)
    }

    fn read(&mut self, lba: u64, sectors: u32) -> Result<Nanos, IoError> {
        self.inner.read(lba, sectors)
    }

    fn write(&mut self, lba: u64, sectors: u32, reliable: bool) -> Result<Nanos, IoError> {
        let page = u64::from(self.page_sectors.max(1));
        let left_in_page = page - lba % page;
        if left_in_page == page || u64::from(sectors) <= left_in_page {
            return self.inner.write(lba, sectors, reliable);
        }
        let first = self.inner.write(lba, left_in_page as u32, reliable)?;
        let rest = self
            .inner
            .write(lba + left_in_page, sectors - left_in_page as u32, reliable)?;
        Ok(first + rest)
    }

    fn flush(&mut self) -> Result<Nanos, IoError> {
        self.inner.flush()
    }

    fn discard(&mut self, lba: u64, sectors: u32) -> Result<Nanos, IoError> {
        self.inner.discard(lba, sectors)
    }
}

/// flashbench's time format: three significant digits and a unit.
pub fn format_ns(ns: f64) -> String {
    let (v, unit) = if ns.abs() < 1e3 {
        return format!("{}ns", ns as i64);
    } else if ns.abs() < 1e6 {
        (ns / 1e3, "µs")
    } else if ns.abs() < 1e9 {
        (ns / 1e6, "ms")
    } else {
        (ns / 1e9, "s")
    };
    format!("{}{unit}", sig3(v))
}

/// Byte counts as flashbench prints block sizes ("4MiB", "512KiB", "512B").
pub fn format_bytes(b: u64) -> String {
    if b < 1024 {
        format!("{b}B")
    } else if b < 1 << 20 {
        format!("{}KiB", sig3(b as f64 / 1024.0))
    } else {
        format!("{}MiB", sig3(b as f64 / (1u64 << 20) as f64))
    }
}

/// Throughput as flashbench prints it ("7.17M/s", "845K/s").
pub fn format_rate(bps: f64) -> String {
    if bps < 1e3 {
        format!("{}B/s", bps as i64)
    } else if bps < 1e6 {
        format!("{}K/s", sig3(bps / 1e3))
    } else {
        format!("{}M/s", sig3(bps / 1e6))
    }
}

impl fmt::Display for AlignResult {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let prefix = if self.write { "write align" } else { "align" };
        for r in &self.rows {
            writeln!(
                f,
                "{prefix} {}\tpre {}\ton {}\tpost {}\tdiff {}",
                r.align,
                format_ns(r.pre_ns),
                format_ns(r.on_ns),
                format_ns(r.post_ns),
                format_ns(r.diff_ns)
            )?;
        }
        Ok(())
    }
}

impl fmt::Display for OpenAuResult {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for r in &self.rows {
            writeln!(
                f,
                "{:<8}{:<8}",
                format_bytes(r.block_bytes),
                format_rate(r.bytes_per_sec)
            )?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A device that records requests and charges a fixed time per sector.
    struct Recorder {
        sectors: u64,
        now: Nanos,
        log: Vec<(bool, u64, u32)>,
    }

    impl Recorder {
        fn new(sectors: u64) -> Recorder {
            Recorder {
                sectors,
                now: 0,
                log: Vec::new(),
            }
        }
    }

    impl BlockDevice for Recorder {
        fn sectors(&self) -> u64 {
            self.sectors
        }
        fn now(&self) -> Nanos {
            self.now
        }
        fn idle(&mut self, ns: Nanos) {
            self.now += ns;
        }
        fn read(&mut self, lba: u64, sectors: u32) -> Result<Nanos, IoError> {
            self.log.push((false, lba, sectors));
            Ok(1000 * u64::from(sectors))
        }
        fn write(&mut self, lba: u64, sectors: u32, _reliable: bool) -> Result<Nanos, IoError> {
            self.log.push((true, lba, sectors));
            Ok(1000 * u64::from(sectors))
        }
        fn flush(&mut self) -> Result<Nanos, IoError> {
            Ok(0)
        }
        fn discard(&mut self, _lba: u64, _sectors: u32) -> Result<Nanos, IoError> {
            Ok(0)
        }
    }

    #[test]
    fn lfsr_is_maximal_length_for_every_width() {
        for bits in 8..=16 {
            let mut v = lfsr(0, bits);
            let start = v;
            let mut n = 1u32;
            loop {
                v = lfsr(v, bits);
                assert_ne!(v, 0);
                if v == start {
                    break;
                }
                n += 1;
                assert!(n < 1 << bits, "width {bits} does not cycle");
            }
            assert_eq!(n, (1 << bits) - 1, "width {bits}");
        }
    }

    #[test]
    fn random_slots_visit_one_to_num_once_each() {
        for num in [1u32, 2, 7, 8, 21, 64, 8192] {
            let mut s = random_slots(num);
            assert_eq!(s.len(), num as usize);
            s.sort_unstable();
            assert_eq!(s, (1..=num).collect::<Vec<_>>(), "num {num}");
        }
        assert_ne!(random_slots(8), (1..=8).collect::<Vec<_>>(), "not in order");
    }

    #[test]
    fn align_places_pre_on_post_around_each_boundary_and_keeps_the_fastest_try() {
        let mut dev = Recorder::new(2 << 20 >> 9); // 2 MiB
        let o = AlignOptions {
            blocksize: 1024,
            tries: 2,
            positions: 4,
            write: true,
            max_request: 1024,
        };
        let region = Region::whole(&dev);
        let r = align(&mut dev, region, &o).unwrap();
        // maxalign: smallest power of two >= 2 MiB / 4 → 512 KiB; rows from there to 2 KiB.
        assert_eq!(r.rows.first().unwrap().align, 512 << 10);
        assert_eq!(r.rows.last().unwrap().align, 2048);
        assert_eq!(r.rows.len(), 9);
        // First row, first try: pre at align-bs, on at align-bs/2, post at align.
        let first: Vec<_> = dev.log.iter().take(10).copied().collect();
        assert_eq!(first[0], (true, (512 * 1024 - 1024) / 512, 2));
        assert_eq!(first[1], (true, (1024 * 1024 - 1024) / 512, 2));
        assert_eq!(first[3], (true, (2048 * 1024 - 1024) / 512, 2));
        assert_eq!(first[4], (true, (512 * 1024 - 512) / 512, 2));
        // The last "on" block runs past the end of the device and wraps to its start.
        assert_eq!(first[7], (true, (2048 * 1024 - 512) / 512, 1));
        assert_eq!(first[8], (true, 0, 1));
        assert_eq!(first[9], (true, 512 * 1024 / 512, 2));
        assert!(r
            .rows
            .iter()
            .all(|row| row.pre_ns == 2000.0 && row.diff_ns == 0.0));
        // Only the largest alignment wraps, once per try.
        assert_eq!(dev.log.len(), 9 * 2 * 3 * 4 + 2);
    }

    #[test]
    fn open_au_interleaves_erase_blocks_and_halves_the_block_size() {
        let mut dev = Recorder::new(1 << 30 >> 9);
        let o = OpenAuOptions {
            open_aus: 3,
            erasesize: 64 << 10,
            blocksize: 16 << 10,
            offset: Some(0),
            spacing: Some(1 << 20),
            ..Default::default()
        };
        let region = Region::whole(&dev);
        let r = open_au(&mut dev, region, &o).unwrap();
        assert_eq!(
            r.rows.iter().map(|r| r.block_bytes).collect::<Vec<_>>(),
            [64 << 10, 32 << 10, 16 << 10]
        );
        let aus = random_slots(3);
        // 64 KiB: one write per AU; 32 KiB: two positions, each visiting every AU.
        let writes: Vec<_> = dev.log.iter().map(|&(_, lba, n)| (lba, n)).collect();
        assert_eq!(writes.len(), 3 + 6 + 12);
        for (i, &au) in aus.iter().enumerate() {
            assert_eq!(writes[i], (u64::from(au) * 2048, 128));
            assert_eq!(writes[3 + i], (u64::from(au) * 2048, 64));
            assert_eq!(writes[6 + i], (u64::from(au) * 2048 + 64, 64));
        }
        let row = r.row(16 << 10).unwrap();
        assert_eq!(row.mean_ns, 32_000.0);
        assert!((row.bytes_per_sec - 16384.0 * 1e9 / 32_000.0).abs() < 1e-6);
    }

    #[test]
    fn random_open_au_uses_flashbench_slot_order_within_the_erase_block() {
        let mut dev = Recorder::new(1 << 30 >> 9);
        let o = OpenAuOptions {
            open_aus: 1,
            random: true,
            erasesize: 64 << 10,
            blocksize: 8 << 10,
            smallest: Some(8 << 10),
            offset: Some(0),
            spacing: Some(1 << 20),
            ..Default::default()
        };
        let region = Region::whole(&dev);
        open_au(&mut dev, region, &o).unwrap();
        let eights: Vec<u64> = dev.log[dev.log.len() - 8..]
            .iter()
            .map(|&(_, lba, _)| lba - 2048)
            .collect();
        let expect: Vec<u64> = random_slots(8).iter().map(|&s| u64::from(s) * 16).collect();
        assert_eq!(eights, expect);
    }

    #[test]
    fn large_writes_are_split_at_the_hosts_largest_request() {
        let mut dev = Recorder::new(1 << 30 >> 9);
        let region = Region::whole(&dev);
        access(&mut dev, region, 0, 4 << 20, true, 1024).unwrap();
        assert_eq!(dev.log.len(), 8);
        assert!(dev.log.iter().all(|&(_, _, n)| n == 1024));
    }

    #[test]
    fn page_split_cuts_only_writes_that_straddle_a_page_boundary() {
        let mut rec = Recorder::new(1 << 20);
        {
            let mut dev = PageSplit {
                inner: &mut rec,
                page_sectors: 16,
            };
            dev.write(15, 2, false).unwrap(); // straddles: 15 | 16
            dev.write(16, 32, false).unwrap(); // aligned: untouched
            dev.write(3, 4, true).unwrap(); // inside a page: untouched
        }
        assert_eq!(
            rec.log,
            [(true, 15, 1), (true, 16, 1), (true, 16, 32), (true, 3, 4)]
        );
    }

    #[test]
    fn scatter_reads_consecutive_blocks_and_splits_two_levels() {
        let mut dev = Recorder::new(1 << 20);
        let region = Region::whole(&dev);
        let o = ScatterOptions {
            blocksize: 8192,
            positions: 4,
            tries: 2,
            max_request: 1024,
        };
        let r = scatter(&mut dev, region, &o).unwrap();
        let lbas: Vec<u64> = dev.log.iter().map(|&(_, lba, _)| lba).collect();
        assert_eq!(lbas, [0, 16, 32, 48, 0, 16, 32, 48]);
        assert!(dev.log.iter().all(|&(w, _, n)| !w && n == 16));
        assert_eq!(r.read_ns, [16_000; 4]);
        assert_eq!(r.levels(), (16_000.0, 16_000.0));
        let two = ScatterResult {
            blocksize: 8192,
            read_ns: vec![100, 130, 100, 131, 99, 130],
        };
        let (fast, slow) = two.levels();
        assert!((fast - 99.666).abs() < 0.01, "{fast}");
        assert!((slow - 130.333).abs() < 0.01, "{slow}");
    }

    #[test]
    fn output_looks_like_flashbench() {
        assert_eq!(format_ns(613_000.0), "613µs");
        assert_eq!(format_ns(3_590_000.0), "3.59ms");
        assert_eq!(format_ns(117_000_000.0), "117ms");
        assert_eq!(format_ns(-2937.0), "-2.94µs");
        assert_eq!(format_bytes(4 << 20), "4MiB");
        assert_eq!(format_bytes(512 << 10), "512KiB");
        assert_eq!(format_bytes(512), "512B");
        assert_eq!(format_rate(7_170_000.0), "7.17M/s");
        assert_eq!(format_rate(845_000.0), "845K/s");
        let r = OpenAuResult {
            open_aus: 1,
            random: false,
            rows: vec![OpenAuRow {
                block_bytes: 16 << 10,
                mean_ns: 0.0,
                bytes_per_sec: 3_710_000.0,
            }],
        };
        assert_eq!(r.to_string(), "16KiB   3.71M/s \n");
    }
}
