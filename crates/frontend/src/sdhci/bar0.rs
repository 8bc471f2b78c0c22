//! BAR0 of the SDHCI function: the register-level controller of emmc-host
//! ([`SdhciMmio`]) in its first 256 bytes, and the identity's vendor registers above;
//! with `--trace`, the trace of its commands, drained after every access.

use emmc_card::timing::Nanos;
use emmc_card::PowerDown;
use emmc_host::sdhci::SdhciMmio;

use super::trace::SdhciTracer;
use crate::pci::identity::PciIds;
use crate::pci::{DmaMemory, PciMmio};
use crate::trace::{stop_on_error, TraceSink};

/// `serve --trace`'s tracer behind BAR0.
type Tracer = SdhciTracer<std::io::BufWriter<std::fs::File>>;

/// The standard SDHCI register space of one slot.
const SDHCI_SPACE: u64 = 0x100;

/// The SDHCI controller behind BAR0.
pub struct SdhciBar0 {
    mmio: SdhciMmio,
    bar0_size: u64,
    /// Registers above the standard space (Intel's LTR registers at 0x804 and 0x808):
    /// they hold what the guest writes and do nothing else.
    vendor: Vec<u8>,
    trace: Option<Tracer>,
}

impl SdhciBar0 {
    /// The controller `mmio` presented as the identity `ids` has it: BAR0's size, and
    /// whether Power Control bit 4 drives the card's RST_n.
    pub fn new(mut mmio: SdhciMmio, ids: &PciIds) -> SdhciBar0 {
        mmio.set_rst_n_in_power_control(ids.rst_n_in_power_control);
        let bar0_size = ids.bar0_size.max(SDHCI_SPACE);
        SdhciBar0 {
            mmio,
            bar0_size,
            vendor: vec![0; (bar0_size - SDHCI_SPACE) as usize],
            trace: None,
        }
    }

    /// Trace the guest's commands into `out` from now on.
    pub fn set_trace(&mut self, out: TraceSink) {
        self.trace = Some(SdhciTracer::new(out, &mut self.mmio));
    }

    /// Trace the commands completed since the last access.
    fn drain_trace(&mut self) {
        if let Some(result) = self.trace.as_mut().map(|t| t.drain(&mut self.mmio)) {
            stop_on_error(&mut self.trace, result);
            if self.trace.is_none() {
                self.mmio.set_command_records(false);
            }
        }
    }

    /// Write the whole trace out (nothing is in flight).
    fn flush_trace(&mut self) {
        self.drain_trace();
        if let Some(result) = self.trace.as_mut().map(Tracer::flush) {
            stop_on_error(&mut self.trace, result);
        }
    }

    pub fn mmio(&self) -> &SdhciMmio {
        &self.mmio
    }

    pub fn mmio_mut(&mut self) -> &mut SdhciMmio {
        &mut self.mmio
    }

    /// Clean shutdown at card time `now`: what is due runs, the card's cache is written
    /// back and the card powered off, the command log flushed.
    pub fn shutdown(&mut self, now: Nanos) {
        self.mmio.advance(now, &emmc_host::sdhci::mmio::NoDmaMemory);
        let at = self.mmio.now();
        self.mmio.card_mut().power_off(at, PowerDown::Clean);
        self.mmio.flush_cmd_log();
        self.flush_trace();
    }

    /// The vendor bytes of an access at `offset` (at or above the standard space), if
    /// the whole access is inside BAR0.
    fn vendor_range(&self, offset: u64, len: usize) -> Option<std::ops::Range<usize>> {
        let start = offset.checked_sub(SDHCI_SPACE)? as usize;
        let end = start.checked_add(len)?;
        (end <= self.vendor.len()).then_some(start..end)
    }
}

impl PciMmio for SdhciBar0 {
    fn bar0_size(&self) -> u64 {
        self.bar0_size
    }

    fn read(&mut self, now: Nanos, offset: u64, data: &mut [u8], dma: &dyn DmaMemory) {
        if offset < SDHCI_SPACE {
            self.mmio.read(now, offset, data, dma);
        } else if let Some(r) = self.vendor_range(offset, data.len()) {
            self.mmio.advance(now, dma);
            data.copy_from_slice(&self.vendor[r]);
        } else {
            data.fill(0);
        }
        self.drain_trace();
    }

    fn write(&mut self, now: Nanos, offset: u64, data: &[u8], dma: &dyn DmaMemory) {
        if offset < SDHCI_SPACE {
            self.mmio.write(now, offset, data, dma);
        } else if let Some(r) = self.vendor_range(offset, data.len()) {
            self.mmio.advance(now, dma);
            self.vendor[r].copy_from_slice(data);
        }
        self.drain_trace();
    }

    fn advance(&mut self, now: Nanos, dma: &dyn DmaMemory) {
        self.mmio.advance(now, dma);
        self.drain_trace();
    }

    fn next_event(&self) -> Option<Nanos> {
        self.mmio.next_event()
    }

    fn irq_asserted(&self) -> bool {
        self.mmio.irq_asserted()
    }

    fn reset(&mut self) {
        self.mmio.reset();
        self.vendor.fill(0);
        self.drain_trace();
    }

    fn power_cycle(&mut self, now: Nanos) {
        self.mmio.advance(now, &emmc_host::sdhci::mmio::NoDmaMemory);
        self.mmio.flush_cmd_log();
        self.reset();
        self.flush_trace();
    }
}
