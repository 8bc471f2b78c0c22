//! NAND flash: geometry and the time of its primitive operations, and counters of what
//! was done to the array (pages read and programmed, blocks erased).
//!
//! A *page* is what one program or read command moves in one plane; multi-plane commands
//! handle `planes` pages of one die at once, and the controller stripes a *write unit* of
//! page × planes × dies over its dies, so one write unit costs one program time. A read
//! unit is page × planes (one multi-plane read). Data moves between the controller and
//! the dies over a channel at `channel_ns_per_kib`, ECC included. MLC pages come in
//! fast (lower) and slow (upper) halves of a pair: when the model gives slow times, odd
//! page rows are slow.

use super::prng::Prng;
use super::Nanos;
use crate::model::NandModel;

/// What the array has done since power-on.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct NandCounters {
    pub pages_read: u64,
    pub pages_programmed: u64,
    /// Pages programmed in SLC mode (also counted in `pages_programmed`).
    pub slc_pages_programmed: u64,
    /// Erase blocks erased (each plane of each die counts).
    pub blocks_erased: u64,
}

/// Which program time applies.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PageKind {
    /// An MLC page at page row `row` of its block (odd rows are slow when the model says so).
    Mlc { row: u64 },
    /// SLC mode: always the fast time.
    Slc,
}

#[derive(Debug, Clone)]
pub struct Nand {
    page_bytes: u64,
    planes: u64,
    dies: u64,
    block_pages: u64,
    t_read: Nanos,
    t_read_slow: Nanos,
    t_prog: Nanos,
    t_prog_slow: Nanos,
    t_prog_slc: Nanos,
    t_erase: Nanos,
    channel_ns_per_kib: u64,
    jitter_permille: u64,
    rng: Prng,
    pub counters: NandCounters,
}

impl Nand {
    pub fn new(m: &NandModel, seed: u64) -> Nand {
        Nand {
            page_bytes: m.page_bytes.max(512),
            planes: m.planes.max(1),
            dies: m.dies.max(1),
            block_pages: m.block_pages.max(1),
            t_read: m.read_page_ns,
            t_read_slow: if m.read_page_slow_ns == 0 {
                m.read_page_ns
            } else {
                m.read_page_slow_ns
            },
            t_prog: m.program_page_ns,
            t_prog_slow: if m.program_page_slow_ns == 0 {
                m.program_page_ns
            } else {
                m.program_page_slow_ns
            },
            t_prog_slc: if m.slc_program_page_ns == 0 {
                m.program_page_ns
            } else {
                m.slc_program_page_ns
            },
            t_erase: m.erase_block_ns,
            channel_ns_per_kib: m.channel_ns_per_kib,
            jitter_permille: m.jitter_permille.min(999),
            rng: Prng::new(seed ^ 0x4E41_4E44),
            counters: NandCounters::default(),
        }
    }

    pub fn page_bytes(&self) -> u64 {
        self.page_bytes
    }

    /// Pages programmed together by one (multi-plane, multi-die) program.
    pub fn unit_pages(&self) -> u64 {
        self.planes * self.dies
    }

    pub fn write_unit_bytes(&self) -> u64 {
        self.page_bytes * self.unit_pages()
    }

    pub fn read_unit_bytes(&self) -> u64 {
        self.page_bytes * self.planes
    }

    /// Bytes one erase (of a block in every plane of every die) clears.
    pub fn erase_unit_bytes(&self) -> u64 {
        self.block_pages * self.write_unit_bytes()
    }

    /// Channel time for `bytes`.
    pub fn transfer_ns(&self, bytes: u64) -> Nanos {
        (u128::from(bytes) * u128::from(self.channel_ns_per_kib)).div_ceil(1024) as Nanos
    }

    fn jitter(&mut self, t: Nanos) -> Nanos {
        if self.jitter_permille == 0 || t == 0 {
            return t;
        }
        let span = 2 * self.jitter_permille + 1;
        let k = self.rng.below(span); // 0..=2j
        let delta = u128::from(t) * u128::from(k) / 1000;
        let base = u128::from(t) * u128::from(1000 - self.jitter_permille) / 1000;
        (base + delta) as Nanos
    }

    /// tPROG of one program command of `pages` pages (at most one write unit).
    pub fn program(&mut self, pages: u64, kind: PageKind) -> Nanos {
        self.counters.pages_programmed += pages;
        let t = match kind {
            PageKind::Mlc { row } if row % 2 == 1 => self.t_prog_slow,
            PageKind::Mlc { .. } => self.t_prog,
            PageKind::Slc => {
                self.counters.slc_pages_programmed += pages;
                self.t_prog_slc
            }
        };
        self.jitter(t)
    }

    /// tR of one (multi-plane) read of the page row `row`.
    pub fn read(&mut self, pages: u64, row: u64) -> Nanos {
        self.counters.pages_read += pages;
        if row % 2 == 1 {
            self.t_read_slow
        } else {
            self.t_read
        }
    }

    /// Program a whole write unit whose data is in the controller: transfer plus tPROG.
    pub fn program_write_unit(&mut self, kind: PageKind) -> Nanos {
        let bytes = self.write_unit_bytes();
        self.transfer_ns(bytes) + self.program(self.unit_pages(), kind)
    }

    /// Program `pages` pages (rounded up to whole multi-plane commands of `planes` pages
    /// on one die) whose data is in the controller.
    pub fn program_pages(&mut self, pages: u64, kind: PageKind) -> Nanos {
        let mut t = self.transfer_ns(pages * self.page_bytes);
        let mut left = pages;
        while left > 0 {
            let n = left.min(self.planes);
            t += self.program(n, kind);
            left -= n;
        }
        t
    }

    /// Program `bytes` (less than a page) into an SLC-mode page already partly written (a
    /// partial-page program) taking `t_prog`, but never longer than a whole SLC page's
    /// program: channel time of the data plus the program.
    pub fn program_partial_slc(&mut self, bytes: u64, t_prog: Nanos) -> Nanos {
        let whole = self.transfer_ns(self.page_bytes) + self.program(1, PageKind::Slc);
        (self.transfer_ns(bytes) + t_prog).min(whole)
    }

    /// Read `pages` pages of one page row into the controller (as a read-modify-write
    /// does): multi-plane reads of up to `planes` pages, then the transfer of each.
    pub fn read_pages(&mut self, pages: u64, row: u64) -> Nanos {
        let mut t = self.transfer_ns(pages * self.page_bytes);
        let mut left = pages;
        while left > 0 {
            let n = left.min(self.planes);
            t += self.read(n, row);
            left -= n;
        }
        t
    }

    /// Copy one write unit of valid data to a new place, as garbage collection does.
    pub fn copy_write_unit(&mut self, copyback: bool, row: u64) -> Nanos {
        if copyback {
            let pages = self.unit_pages();
            self.read(pages, row) + self.program(pages, PageKind::Mlc { row })
        } else {
            let mut t = 0;
            for _ in 0..self.unit_pages() {
                t += self.read(1, row)
                    + 2 * self.transfer_ns(self.page_bytes)
                    + self.program(1, PageKind::Mlc { row });
            }
            t
        }
    }

    /// Erase `bytes` of whole erase units (rounded up).
    pub fn erase(&mut self, bytes: u64) -> Nanos {
        let units = bytes.div_ceil(self.erase_unit_bytes()).max(1);
        self.counters.blocks_erased += units * self.planes * self.dies;
        units * self.t_erase
    }

    /// Read `bytes` at byte offset `offset` (of the card's address space): one tR per read
    /// unit touched plus the channel time of the data.
    pub fn read_range(&mut self, offset: u64, bytes: u64) -> Nanos {
        if bytes == 0 {
            return 0;
        }
        let unit = self.read_unit_bytes();
        let first = offset / unit;
        let last = (offset + bytes - 1) / unit;
        let mut t = self.transfer_ns(bytes);
        for u in first..=last {
            let row = u / self.dies;
            t += self.read(self.planes, row);
        }
        t
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    pub fn model() -> NandModel {
        NandModel {
            page_bytes: 8192,
            planes: 2,
            dies: 2,
            block_pages: 128,
            read_page_ns: 200,
            read_page_slow_ns: 0,
            program_page_ns: 1000,
            program_page_slow_ns: 0,
            slc_program_page_ns: 0,
            erase_block_ns: 5000,
            channel_ns_per_kib: 10,
            jitter_permille: 0,
        }
    }

    #[test]
    fn geometry_derives_write_read_and_erase_units() {
        let n = Nand::new(&model(), 0);
        assert_eq!(n.write_unit_bytes(), 32768);
        assert_eq!(n.read_unit_bytes(), 16384);
        assert_eq!(n.erase_unit_bytes(), 4 << 20);
        assert_eq!(n.transfer_ns(32768), 320);
    }

    #[test]
    fn a_write_unit_costs_one_program_time_whatever_its_pages() {
        let mut n = Nand::new(&model(), 0);
        assert_eq!(n.program_write_unit(PageKind::Mlc { row: 0 }), 320 + 1000);
        assert_eq!(n.counters.pages_programmed, 4);
        // Two single-plane-die pages take two multi-plane commands' worth of pages/planes.
        assert_eq!(n.program_pages(3, PageKind::Mlc { row: 0 }), 240 + 2000);
    }

    #[test]
    fn mlc_slow_pages_alternate_and_slc_is_always_fast() {
        let mut m = model();
        m.program_page_slow_ns = 3000;
        m.read_page_slow_ns = 230;
        m.slc_program_page_ns = 400;
        let mut n = Nand::new(&m, 0);
        assert_eq!(n.program(1, PageKind::Mlc { row: 0 }), 1000);
        assert_eq!(n.program(1, PageKind::Mlc { row: 1 }), 3000);
        assert_eq!(n.program(1, PageKind::Slc), 400);
        assert_eq!(n.counters.slc_pages_programmed, 1);
        assert_eq!(n.read(1, 0), 200);
        assert_eq!(n.read(1, 1), 230);
    }

    #[test]
    fn reads_pay_one_tr_per_read_unit_touched() {
        let mut n = Nand::new(&model(), 0);
        let inside = n.read_range(0, 1024);
        let across = n.read_range(16384 - 512, 1024);
        assert_eq!(inside, 10 + 200);
        assert_eq!(
            across,
            10 + 400,
            "crossing a 16 KiB read unit costs a second tR"
        );
    }

    #[test]
    fn copyback_skips_the_channel_and_is_cheaper() {
        let mut n = Nand::new(&model(), 0);
        let cb = n.copy_write_unit(true, 0);
        let through = n.copy_write_unit(false, 0);
        assert_eq!(cb, 200 + 1000);
        assert_eq!(through, 4 * (200 + 2 * 80 + 1000));
    }

    #[test]
    fn erase_counts_blocks_in_every_plane_and_die() {
        let mut n = Nand::new(&model(), 0);
        assert_eq!(n.erase(4 << 20), 5000);
        assert_eq!(n.counters.blocks_erased, 4);
        assert_eq!(n.erase(8 << 20), 10000);
    }

    #[test]
    fn jitter_stays_within_its_bound_and_replays() {
        let mut m = model();
        m.jitter_permille = 100;
        let mut a = Nand::new(&m, 9);
        let mut b = Nand::new(&m, 9);
        let ta: Vec<Nanos> = (0..50)
            .map(|_| a.program(1, PageKind::Mlc { row: 0 }))
            .collect();
        let tb: Vec<Nanos> = (0..50)
            .map(|_| b.program(1, PageKind::Mlc { row: 0 }))
            .collect();
        assert_eq!(ta, tb);
        assert!(ta.iter().all(|&t| (900..=1100).contains(&t)), "{ta:?}");
        assert!(ta.iter().any(|&t| t != 1000));
    }
}
