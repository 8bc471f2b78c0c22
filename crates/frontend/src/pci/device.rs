//! What the PCI function needs from the device behind BAR0 ([`PciMmio`]) and what it
//! gives the device for bus-master DMA ([`DmaMemory`]).
//!
//! `DmaMemory` and `DmaError` are the SDHCI register model's own (emmc-host defines
//! them, for its ADMA/SDMA engines); this module re-exports them.

use emmc_card::timing::Nanos;
pub use emmc_host::sdhci::mmio::{DmaError, DmaMemory};

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
