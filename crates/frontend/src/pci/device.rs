//! What the PCI function needs from the device behind BAR0 ([`PciMmio`]) and what it
//! gives the device for bus-master DMA ([`DmaMemory`]).
//!
//! `DmaMemory` and `DmaError` are defined here for now. The SDHCI register model in
//! emmc-host will need the same trait (its ADMA/SDMA engines read descriptors and move
//! data through it), and emmc-host cannot see this crate: once that model lands, the one
//! definition belongs in emmc-host and this module re-exports it.

use emmc_card::timing::Nanos;

/// Why a DMA access failed. The device model turns it into its own error status (for an
/// SDHCI controller: ADMA error or a data error interrupt); it never panics over it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum DmaError {
    /// The access is not entirely inside one region the client mapped with a file.
    #[error("DMA of {len} bytes at bus address {addr:#x}: not inside one mapped region")]
    NotMapped { addr: u64, len: usize },
    /// The region is mapped, but not for this direction (a read-only map written to).
    #[error("DMA {} of {len} bytes at bus address {addr:#x}: the region is not mapped for it", if *write { "write" } else { "read" })]
    NotPermitted { addr: u64, len: usize, write: bool },
    /// Bus mastering is off in the command register, or the function is not in D0.
    #[error("DMA at bus address {addr:#x} while the function may not master the bus")]
    Disabled { addr: u64 },
}

/// Guest memory as the device sees it: bus addresses, as the client mapped them.
pub trait DmaMemory {
    /// Fill `buf` from bus address `addr`.
    fn read(&self, addr: u64, buf: &mut [u8]) -> Result<(), DmaError>;
    /// Write `buf` at bus address `addr`.
    fn write(&self, addr: u64, buf: &[u8]) -> Result<(), DmaError>;
}

/// The device model behind BAR0: a register file that keeps card time.
///
/// Every call gets the current card time `now` (never less than in the call before) and,
/// where the device may master the bus, the guest's memory. The function calls
/// [`PciMmio::irq_asserted`] after every call to set the INTx line.
pub trait PciMmio: Send + 'static {
    /// The size of BAR0 in bytes: a power of two from 16 on (256 for one SDHCI slot).
    fn bar0_size(&self) -> u64 {
        256
    }
    /// A register read of 1, 2, 4 or 8 bytes at `offset`, naturally aligned, inside BAR0.
    fn read(&mut self, now: Nanos, offset: u64, data: &mut [u8], dma: &dyn DmaMemory);
    /// A register write of 1, 2, 4 or 8 bytes at `offset`, naturally aligned, inside BAR0.
    fn write(&mut self, now: Nanos, offset: u64, data: &[u8], dma: &dyn DmaMemory);
    /// Card time has reached `now`: finish whatever was due by then.
    fn advance(&mut self, now: Nanos, dma: &dyn DmaMemory);
    /// The card time of the next thing the device will do on its own, if any. With
    /// `--timing off` every event runs at once, so a device that always has one keeps the
    /// timer thread busy: report `None` when nothing is pending.
    fn next_event(&self) -> Option<Nanos>;
    /// Whether the device drives its interrupt line now.
    fn irq_asserted(&self) -> bool;
    /// Device reset (VFIO_USER_DEVICE_RESET, the function's reset): registers to their
    /// reset values.
    fn reset(&mut self);
    /// The client went away: power the card down cleanly and up again, as the other
    /// transports do between sessions. By default a device reset.
    fn power_cycle(&mut self, now: Nanos) {
        let _ = now;
        self.reset();
    }
}
