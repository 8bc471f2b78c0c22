//! How long card operations take, in nanoseconds of card time.
//!
//! The card asks; a [`Timing`] implementation answers. The card never reads a clock: it is
//! told the current card time by its caller and keeps operations busy until the instant
//! the timing model computed. Operations are described by absolute sector numbers in the
//! image layout (see `store`), so a flash translation layer can model physical placement
//! without knowing partitions or commands.

pub mod bkops;
pub mod bus;
pub mod cache;
mod constant;
pub mod controller;
pub mod erase;
pub mod flash;
pub mod ftl;
pub mod nand;
pub mod prng;

pub use bus::Bus;
pub use constant::ConstantTiming;
pub use flash::{FlashStats, FlashTiming};

use crate::model::{DeviceModel, TimingModel};

/// The timing model a device model asks for.
pub fn from_model(model: &DeviceModel) -> Box<dyn Timing + Send> {
    match &model.timing {
        TimingModel::Constant(c) => Box::new(ConstantTiming::new(c.clone())),
        TimingModel::Flash(_) => {
            Box::new(FlashTiming::new(model).expect("a flash [timing] section builds"))
        }
    }
}

/// Card time in nanoseconds since power-on of the simulated system.
pub type Nanos = u64;

/// The answer to "how long?": the busy time the host sees, and the background work
/// (garbage-collection debt) the operation left behind for BKOPS to work off.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Cost {
    pub busy_ns: Nanos,
    pub background_ns: Nanos,
}

impl Cost {
    pub const ZERO: Cost = Cost {
        busy_ns: 0,
        background_ns: 0,
    };

    pub fn busy(busy_ns: Nanos) -> Cost {
        Cost {
            busy_ns,
            background_ns: 0,
        }
    }
}

impl std::ops::Add for Cost {
    type Output = Cost;
    fn add(self, rhs: Cost) -> Cost {
        Cost {
            busy_ns: self.busy_ns.saturating_add(rhs.busy_ns),
            background_ns: self.background_ns.saturating_add(rhs.background_ns),
        }
    }
}

impl std::ops::AddAssign for Cost {
    fn add_assign(&mut self, rhs: Cost) {
        *self = *self + rhs;
    }
}

/// Where programmed data goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProgramTarget {
    /// Into the volatile cache (acknowledged, not yet durable).
    Cache,
    /// Straight to the non-volatile medium (cache off, forced programming, reliable write).
    Medium,
}

/// One write as the timing model sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Program {
    /// First absolute sector in the image layout.
    pub sector: u64,
    /// Number of 512-byte sectors.
    pub count: u32,
    pub target: ProgramTarget,
    /// Reliable write (CMD23 bit 31).
    pub reliable: bool,
    /// Entry of a packed command (the per-entry overhead differs from a plain command).
    pub packed_entry: bool,
}

/// The erase family as the timing model sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EraseKind {
    Erase,
    Trim,
    Discard,
    SecureErase,
    SecureTrim1,
    SecureTrim2,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Erase {
    pub kind: EraseKind,
    /// First absolute sector and number of sectors affected.
    pub sector: u64,
    pub count: u64,
    /// Number of erase groups touched (the unit the EXT_CSD timeouts are given in).
    pub groups: u64,
}

/// CMD6 operations whose busy time the timing model decides.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SwitchKind {
    /// Any EXT_CSD write without a cost of its own (bounded by GENERIC_CMD6_TIME).
    Generic,
    /// PARTITION_ACCESS change (bounded by PARTITION_SWITCH_TIME).
    PartitionAccess,
    /// POWER_OFF_NOTIFICATION := POWER_OFF_LONG (bounded by POWER_OFF_LONG_TIME).
    PowerOffLong,
    /// SANITIZE_START.
    Sanitize,
}

/// The cost model of one card. Implementations are deterministic: the same sequence of
/// calls gives the same answers (randomness only from a seed owned by the model).
pub trait Timing {
    /// Time from the end of a read command until the first block of `count` sectors
    /// starting at `sector` is ready, plus the internal read time of the whole transfer.
    fn read(&mut self, now: Nanos, sector: u64, count: u32) -> Cost;
    /// Time to program (or cache) one write after its last data block arrived.
    fn program(&mut self, now: Nanos, op: &Program) -> Cost;
    /// Time to write back `count` cached sectors at `sector` to the medium (cache full).
    fn destage(&mut self, now: Nanos, sector: u64, count: u32) -> Cost;
    /// Fixed cost of a cache flush; the destaging of the dirty sectors is reported
    /// separately through [`Timing::destage`].
    fn flush(&mut self, now: Nanos) -> Cost;
    fn erase(&mut self, now: Nanos, op: &Erase) -> Cost;
    fn switch(&mut self, now: Nanos, kind: SwitchKind) -> Cost;
    /// CMD5 sleep or awake transition.
    fn sleep_awake(&mut self, now: Nanos) -> Cost;
    /// Time from an HPI until the card leaves prg.
    fn hpi_exit(&mut self, now: Nanos) -> Nanos;
    /// BKOPS ran for `elapsed_ns` of card time; return how much background work it did.
    fn background_work(&mut self, _now: Nanos, elapsed_ns: Nanos) -> Nanos {
        elapsed_ns
    }
    /// BKOPS_STATUS level (0..=3) for this much outstanding background work.
    fn bkops_level(&self, outstanding_ns: Nanos) -> u8;
    /// A model that keeps its own background debt (because foreground work can also
    /// reduce it) reports it here and leaves [`Cost::background_ns`] zero; the card then
    /// adds only work added from outside (`Card::add_background_work`). `None`: the card
    /// accumulates `background_ns` itself.
    fn background_debt(&self) -> Option<Nanos> {
        None
    }
    /// Counters of a flash model (write amplification, P/E cycles, GC), if it is one.
    fn flash_stats(&self) -> Option<FlashStats> {
        None
    }
}
