//! The driver policies a command line chooses among (`serve`, `simulate`, `compare`):
//! packing and the I/O scheduler, each turned into the block driver's own setting. With
//! the `clap` feature they are `clap::ValueEnum`s, so every command line spells them alike.

/// `--packing`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "clap", derive(clap::ValueEnum))]
pub enum PackingArg {
    Off,
    Always,
    /// Write packing control (seed 000) with `--wr-threshold`.
    Controlled,
}

/// `--scheduler`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "clap", derive(clap::ValueEnum))]
pub enum SchedulerArg {
    Noop,
    Deadline,
    Cfq,
}

impl PackingArg {
    /// The driver's packing mode, with `threshold` for write packing control.
    pub fn mode(self, threshold: u32) -> crate::packing::PackingMode {
        use crate::packing::PackingMode;
        match self {
            PackingArg::Off => PackingMode::Off,
            PackingArg::Always => PackingMode::Always,
            PackingArg::Controlled => PackingMode::Controlled { threshold },
        }
    }
}

impl SchedulerArg {
    /// The scheduler, with CFQ's `slice_idle` in microseconds.
    pub fn elevator(self, slice_idle_us: u64) -> crate::iosched::Elevator {
        use crate::iosched::{CfqTunables, Elevator};
        match self {
            SchedulerArg::Noop => Elevator::Noop,
            SchedulerArg::Deadline => Elevator::Deadline(Default::default()),
            SchedulerArg::Cfq => Elevator::Cfq(CfqTunables {
                // CFQ takes slice_idle in ms up to seconds; more than 10 s means nothing.
                slice_idle_ns: slice_idle_us.min(10_000_000) * 1000,
                ..Default::default()
            }),
        }
    }
}
