//! emmc-host: what a host does to an eMMC card — the controller, the Linux MMC core and
//! block driver as this process models them, and the faults injected between host and card.
//!
//! It depends on the card crate (`emmc-card`) and nothing above it: never on the
//! simulator, the frontends, vhost or virtio, guest memory, plotting or terminal crates.
//! A frontend whose guest brings its own driver uses the controller (`sdhci`) and the MMC
//! core helpers; the simulator and the blk frontend use the whole driver.
//!
//! - `sdhci`: the SDHCI v3.00 controller that executes one MMC request on the bus, and
//!   the same controller as a register file for a guest's own driver (`sdhci::mmio`);
//! - `mmc`: the MMC core operations (bring-up, switch, status, block transfers), named as
//!   in Linux, sending every command through the controller;
//! - `blkdrv`: the MMC block driver (Linux's `block.c`/`queue.c`): request queue,
//!   two-deep pipeline, packing, reliable write, flush, discard, HPI and BKOPS policies;
//! - `iosched`: the I/O scheduler models (noop, deadline, CFQ-like) that order block
//!   requests;
//! - `packing`: which queued block requests form a packed command, and write packing
//!   control (seed 000);
//! - `policy`: the packing and scheduler choices as a command line names them;
//! - `fault`: fault plans and the injector the controller consults for every command;
//! - `cmdlog`: the MMC command log (`--cmd-log`);
//! - `trace`, `histogram`: the block trace format and the latency histogram, which the
//!   daemon records and the simulator replays and reports: they live here, the lowest
//!   crate both use.

pub mod blkdrv;
pub mod cmdlog;
pub mod fault;
pub mod histogram;
pub mod iosched;
pub mod mmc;
pub mod packing;
pub mod policy;
pub mod sdhci;
pub mod trace;

#[cfg(any(test, feature = "test-support"))]
pub mod testing;
