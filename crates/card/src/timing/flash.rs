//! `FlashTiming`: a card built from its parts — controller, NAND, FTL, volatile cache,
//! background operations, erase family — answering the card's "how long?".
//!
//! Sectors arrive as absolute image sectors. The boot and RPMB partitions sit before the
//! user area in the image; on a real card they are separate (usually SLC) areas, so here
//! they are a small page-programmed system area, and the FTL's AUs start at the user
//! area, as a card's AU boundaries do.

use super::bkops::Bkops;
use super::cache::CacheTiming;
use super::controller::Controller;
use super::erase::EraseTiming;
use super::ftl::{Ftl, FtlCounters};
use super::nand::{Nand, NandCounters, PageKind};
use super::{Cost, Erase, Nanos, Program, ProgramTarget, SwitchKind, Timing};
use crate::model::{DeviceModel, FlashTimingModel};

/// What a flash card has done, for reports and tests.
#[derive(Debug, Clone, Copy, Default, PartialEq, serde::Serialize)]
pub struct FlashStats {
    /// Sectors the host wrote (into the cache or to the medium).
    pub host_sectors: u64,
    /// Bytes the NAND programmed for them (log, SLC, read-modify-write, GC copies …).
    pub nand_bytes_programmed: u64,
    /// NAND bytes programmed per host byte.
    pub write_amplification: f64,
    pub nand: NandCounters,
    pub ftl: FtlCounters,
    /// P/E cycles of the most and least erased erase block, and the mean.
    pub pe_max: u32,
    pub pe_min: u32,
    pub pe_mean: f64,
    /// Outstanding background work.
    pub debt_ns: Nanos,
    pub open_aus: usize,
}

#[derive(Debug)]
pub struct FlashTiming {
    controller: Controller,
    nand: Nand,
    ftl: Ftl,
    cache: CacheTiming,
    bkops: Bkops,
    erase: EraseTiming,
    /// First absolute sector of the user area.
    user_start: u64,
    host_sectors: u64,
}

impl FlashTiming {
    /// The flash timing of `model` (whose `[timing]` must be `model = "flash"`).
    pub fn new(model: &DeviceModel) -> Option<FlashTiming> {
        let f = model.timing.as_flash()?;
        let user_start = (2 * model.boot_partition_bytes() + model.rpmb_bytes()) / 512;
        Some(FlashTiming::with_parts(
            f,
            &model.ext_csd,
            user_start,
            model.user_bytes() / 512,
        ))
    }

    /// From the flash parameters alone: a user area of `user_sectors` starting at absolute
    /// sector `user_start`.
    pub fn with_parts(
        f: &FlashTimingModel,
        ext_csd: &crate::model::ExtCsdModel,
        user_start: u64,
        user_sectors: u64,
    ) -> FlashTiming {
        FlashTiming {
            controller: Controller::new(&f.controller),
            nand: Nand::new(&f.nand, f.seed),
            ftl: Ftl::new(&f.ftl, &f.nand, user_sectors, f.seed),
            cache: CacheTiming::new(&f.cache),
            bkops: Bkops::new(&f.bkops),
            erase: EraseTiming::new(&f.erase, ext_csd),
            user_start,
            host_sectors: 0,
        }
    }

    pub fn stats(&self) -> FlashStats {
        let nand_bytes = self.nand.counters.pages_programmed * self.nand.page_bytes();
        let host_bytes = self.host_sectors * 512;
        let (pe_max, pe_min, pe_mean) = self.ftl.pe_cycles();
        FlashStats {
            host_sectors: self.host_sectors,
            nand_bytes_programmed: nand_bytes,
            write_amplification: if host_bytes == 0 {
                0.0
            } else {
                nand_bytes as f64 / host_bytes as f64
            },
            nand: self.nand.counters,
            ftl: self.ftl.counters,
            pe_max,
            pe_min,
            pe_mean,
            debt_ns: self.ftl.debt_ns(),
            open_aus: self.ftl.open_aus(),
        }
    }

    /// Program `count` sectors at absolute `sector` to the medium (no command overhead).
    fn write_medium(&mut self, sector: u64, count: u64, reliable: bool) -> Nanos {
        let end = sector + count;
        let mut t = 0;
        if sector < self.user_start {
            // System area (boot, RPMB): SLC-mode pages, read-modify-write at the edges.
            let sys_end = end.min(self.user_start);
            let ps = self.nand.page_bytes() / 512;
            let first = sector / ps;
            let last = (sys_end - 1) / ps;
            let partial = u64::from(sector % ps != 0) + u64::from(sys_end % ps != 0);
            t += self.nand.read_pages(partial.min(last - first + 1), 0);
            t += self.nand.program_pages(last - first + 1, PageKind::Slc);
        }
        if end > self.user_start {
            let s = sector.max(self.user_start) - self.user_start;
            t += self
                .ftl
                .write(&mut self.nand, s, end - self.user_start - s, reliable);
        }
        t
    }

    /// At critical debt, collect in the foreground first.
    fn foreground_gc(&mut self) -> Nanos {
        match self.bkops.foreground_target(self.ftl.debt_ns()) {
            Some(target) => self.ftl.work_until(&mut self.nand, target),
            None => 0,
        }
    }

    fn user_range(&self, sector: u64, count: u64) -> Option<(u64, u64)> {
        let end = sector + count;
        (end > self.user_start).then(|| {
            (
                sector.max(self.user_start) - self.user_start,
                end - self.user_start,
            )
        })
    }
}

impl Timing for FlashTiming {
    fn read(&mut self, _now: Nanos, sector: u64, count: u32) -> Cost {
        let bytes = u64::from(count) * 512;
        let offset = if sector >= self.user_start {
            (sector - self.user_start) * 512
        } else {
            sector * 512
        };
        Cost::busy(self.controller.read_command() + self.nand.read_range(offset, bytes))
    }

    fn program(&mut self, _now: Nanos, op: &Program) -> Cost {
        let count = u64::from(op.count);
        self.host_sectors += count;
        let command = self.controller.write_command(op.packed_entry);
        let busy = match op.target {
            ProgramTarget::Cache => command + self.cache.accept(op.sector, count),
            ProgramTarget::Medium => {
                command + self.foreground_gc() + self.write_medium(op.sector, count, op.reliable)
            }
        };
        // The model owns its background debt (`background_debt`), so none is reported here.
        Cost::busy(busy)
    }

    fn destage(&mut self, _now: Nanos, _sector: u64, count: u32) -> Cost {
        // The card destages its oldest cached sectors; the cache model knows where they are.
        let mut left = u64::from(count);
        let mut t = 0;
        while left > 0 {
            let Some((s, k)) = self.cache.pop_oldest(left) else {
                break;
            };
            t += self.write_medium(s, k, false);
            left -= k;
        }
        Cost::busy(t)
    }

    fn flush(&mut self, _now: Nanos) -> Cost {
        Cost::busy(self.cache.flush() + self.ftl.flush_pending(&mut self.nand))
    }

    fn erase(&mut self, _now: Nanos, op: &Erase) -> Cost {
        let range = self.user_range(op.sector, op.count);
        Cost::busy(
            self.erase
                .erase(&mut self.ftl, &mut self.nand, op.kind, range, op.groups),
        )
    }

    fn switch(&mut self, _now: Nanos, kind: SwitchKind) -> Cost {
        let mut t = self.controller.switch(kind);
        match kind {
            SwitchKind::Sanitize => t += self.erase.sanitize(&mut self.ftl, &mut self.nand),
            SwitchKind::PowerOffLong => t += self.ftl.flush_pending(&mut self.nand),
            SwitchKind::Generic | SwitchKind::PartitionAccess => {}
        }
        Cost::busy(t)
    }

    fn sleep_awake(&mut self, _now: Nanos) -> Cost {
        Cost::busy(self.controller.sleep_awake())
    }

    fn hpi_exit(&mut self, _now: Nanos) -> Nanos {
        self.controller.hpi_exit()
    }

    fn background_work(&mut self, _now: Nanos, elapsed_ns: Nanos) -> Nanos {
        self.ftl.work(&mut self.nand, elapsed_ns)
    }

    fn bkops_level(&self, outstanding_ns: Nanos) -> u8 {
        self.bkops.level(outstanding_ns)
    }

    fn background_debt(&self) -> Option<Nanos> {
        Some(self.ftl.debt_ns())
    }

    fn flash_stats(&self) -> Option<FlashStats> {
        Some(self.stats())
    }
}

#[cfg(test)]
mod tests;
