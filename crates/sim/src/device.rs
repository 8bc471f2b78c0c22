//! What a simulator workload sees: a block device whose every request takes card time.
//!
//! [`CardDevice`] is the path `serve` runs: a card of a device model on a data-less store
//! behind the SDHCI controller model, driven by the MMC block driver
//! ([`emmc_host::blkdrv::MmcBlk`]) with serve's configuration ([`BlkConfig::served`]) and
//! the host of the model's `[host]` section. Each block request is submitted, waits for
//! the driver and the card, and its latency is what a guest of `serve --timing realtime`
//! would see beside the transport: the host's preparation (`prepare_ns`), the command
//! exchanges and their per-request host time (`request_overhead_ns`), data on the bus,
//! the card's access and programming time, and after a write the CMD13 status check.
//! Calibration measures the cards through it, so the figures the tests hold are the
//! figures users get.

use emmc_card::model::DeviceModel;
use emmc_card::store::NullStore;
use emmc_card::timing::{Bus, Nanos};
use emmc_card::{Card, CardError};
use emmc_host::blkdrv::{Advance, BlkConfig, BlkError, MmcBlk};
use emmc_host::mmc::{MmcError, MmcHost, MmcHostOps};
use emmc_host::packing::{BlkOp, BlkRequest};
use emmc_host::sdhci::SdhciConfig;

/// Errors a block request can end with.
#[derive(Debug, thiserror::Error)]
pub enum IoError {
    #[error("card: {0}")]
    Card(#[from] CardError),
    #[error("bring-up: {0}")]
    BringUp(#[from] MmcError),
    #[error("{op:?} of {sectors} sectors at {lba}: {error}")]
    Request {
        op: BlkOp,
        lba: u64,
        sectors: u32,
        error: BlkError,
    },
    #[error("request of {sectors} sectors at {lba} is outside the {size}-sector device")]
    OutOfRange { lba: u64, sectors: u32, size: u64 },
    #[error("the block driver went idle before request {0} completed")]
    Lost(u64),
}

/// A block device in card time.
pub trait BlockDevice {
    /// Size in 512-byte sectors.
    fn sectors(&self) -> u64;
    /// Current card time.
    fn now(&self) -> Nanos;
    /// Let card time pass with no request outstanding.
    fn idle(&mut self, ns: Nanos);
    /// Read `sectors` at `lba`; returns the request's latency.
    fn read(&mut self, lba: u64, sectors: u32) -> Result<Nanos, IoError>;
    /// Write `sectors` at `lba` (reliable write when `reliable`); returns the latency.
    fn write(&mut self, lba: u64, sectors: u32, reliable: bool) -> Result<Nanos, IoError>;
    /// Make every acknowledged write durable; returns the latency.
    fn flush(&mut self) -> Result<Nanos, IoError>;
    /// Tell the device `sectors` at `lba` are unused; returns the latency.
    fn discard(&mut self, lba: u64, sectors: u32) -> Result<Nanos, IoError>;
}

/// A card of a device model behind the SDHCI controller model and the MMC block driver,
/// configured as `serve` configures them.
pub struct CardDevice {
    drv: MmcBlk<MmcHost>,
    next_id: u64,
}

impl CardDevice {
    /// A freshly powered card of `model` on a data-less store, brought up as Linux would.
    pub fn new(model: &DeviceModel) -> Result<CardDevice, IoError> {
        let layout = Card::layout_for(model);
        let card = Card::new(model.clone(), Box::new(NullStore::new(layout)))?;
        CardDevice::with_card(card, model)
    }

    /// Drive an existing card (any store, any timing) with the host of `model.host` and
    /// serve's block driver.
    pub fn with_card(card: Card, model: &DeviceModel) -> Result<CardDevice, IoError> {
        CardDevice::with_config(card, model, BlkConfig::served(&model.host))
    }

    /// Drive an existing card with the block driver configured as `cfg` says (an
    /// experiment on another policy: the pipeline off, packing on).
    pub fn with_config(
        card: Card,
        model: &DeviceModel,
        cfg: BlkConfig,
    ) -> Result<CardDevice, IoError> {
        let host = MmcHost::with_config(card, SdhciConfig::for_model(&model.host));
        let drv = MmcBlk::probe(host, cfg)?;
        Ok(CardDevice { drv, next_id: 0 })
    }

    pub fn card(&self) -> &Card {
        &self.drv.host().card
    }

    pub fn card_mut(&mut self) -> &mut Card {
        &mut self.drv.host_mut().card
    }

    /// The block driver (its statistics and configuration).
    pub fn driver(&self) -> &MmcBlk<MmcHost> {
        &self.drv
    }

    /// Install a fault injector on the controller (`None` removes it).
    pub fn set_fault_injector(&mut self, faults: Option<emmc_host::fault::FaultInjector>) {
        self.drv.host_mut().sdhci.set_fault_injector(faults);
    }

    /// Install a command log on the controller (`None` removes it).
    pub fn set_cmd_log(&mut self, log: Option<emmc_host::cmdlog::CmdLog>) {
        self.drv.host_mut().sdhci.set_cmd_log(log);
    }

    /// Write out what the command log holds.
    pub fn flush_cmd_log(&mut self) {
        self.drv.host_mut().sdhci.flush_cmd_log();
    }

    pub fn fault_injector(&self) -> Option<&emmc_host::fault::FaultInjector> {
        self.drv.host().sdhci.fault_injector()
    }

    /// The bus as the host has set it up.
    pub fn bus(&self) -> Bus {
        self.drv.host().sdhci.bus()
    }

    fn check_range(&self, lba: u64, sectors: u32) -> Result<(), IoError> {
        let size = self.drv.sectors();
        if sectors == 0
            || sectors > 65_535
            || lba
                .checked_add(u64::from(sectors))
                .is_none_or(|end| end > size)
        {
            return Err(IoError::OutOfRange { lba, sectors, size });
        }
        Ok(())
    }

    /// Submit one block request now and run the driver until all of it has completed
    /// (the queue may have split it); returns its latency.
    fn run(&mut self, req: BlkRequest) -> Result<Nanos, IoError> {
        let start = self.drv.now();
        self.drv.submit(req, start);
        let mut left = if req.op == BlkOp::Flush {
            1
        } else {
            u64::from(req.sectors)
        };
        let mut end = start;
        let mut failed = None;
        while left > 0 {
            if self.drv.advance(Nanos::MAX) == Advance::Idle {
                return Err(IoError::Lost(req.id));
            }
            for c in self.drv.take_completions() {
                if c.req.id != req.id {
                    continue;
                }
                end = end.max(c.at);
                left = left.saturating_sub(if req.op == BlkOp::Flush {
                    1
                } else {
                    u64::from(c.req.sectors)
                });
                if let Err(error) = c.result {
                    failed.get_or_insert(error);
                }
            }
        }
        match failed {
            Some(error) => Err(IoError::Request {
                op: req.op,
                lba: req.lba,
                sectors: req.sectors,
                error,
            }),
            None => Ok(end - start),
        }
    }

    /// A request of the synchronous caller: it waits for each one (flashbench opens the
    /// device O_DIRECT | O_SYNC), so every request is sync in CFQ's sense, writes too.
    fn request(&mut self, op: BlkOp, lba: u64, sectors: u32) -> BlkRequest {
        self.next_id += 1;
        BlkRequest {
            sync: true,
            ..BlkRequest::new(self.next_id, op, lba, sectors)
        }
    }
}

impl BlockDevice for CardDevice {
    fn sectors(&self) -> u64 {
        self.drv.sectors()
    }

    fn now(&self) -> Nanos {
        self.drv.now()
    }

    fn idle(&mut self, ns: Nanos) {
        let until = self.drv.now().saturating_add(ns);
        // Nothing is outstanding; the driver may start idle BKOPS on its own, as it would
        // under serve.
        while self.drv.advance(until) == Advance::Completed {
            self.drv.take_completions();
        }
        self.drv.host_mut().idle_until(until);
    }

    fn read(&mut self, lba: u64, sectors: u32) -> Result<Nanos, IoError> {
        self.check_range(lba, sectors)?;
        let req = self.request(BlkOp::Read, lba, sectors);
        self.run(req)
    }

    fn write(&mut self, lba: u64, sectors: u32, reliable: bool) -> Result<Nanos, IoError> {
        self.check_range(lba, sectors)?;
        let mut req = self.request(BlkOp::Write, lba, sectors);
        req.fua = reliable;
        self.run(req)
    }

    fn flush(&mut self) -> Result<Nanos, IoError> {
        let req = self.request(BlkOp::Flush, 0, 0);
        self.run(req)
    }

    fn discard(&mut self, lba: u64, sectors: u32) -> Result<Nanos, IoError> {
        self.check_range(lba, sectors)?;
        let req = self.request(BlkOp::Discard, lba, sectors);
        self.run(req)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use emmc_card::timing::bus::ResponseLength;

    fn ideal() -> DeviceModel {
        let mut m = DeviceModel::load("generic-emmc45").unwrap();
        m.timing = Default::default();
        m
    }

    #[test]
    fn with_an_ideal_card_latency_is_bus_time_alone() {
        let model = ideal();
        let mut dev = CardDevice::new(&model).unwrap();
        let bus = dev.bus();
        let cmd = bus.command_ns(ResponseLength::Short);
        let lat = dev.write(0, 8, false).unwrap();
        assert_eq!(
            lat,
            2 * cmd + bus.write_ns(512, 8) + cmd,
            "CMD23, CMD25 and its data, then CMD13 (mmc_blk_err_check)"
        );
        let lat = dev.read(0, 8).unwrap();
        assert_eq!(lat, 2 * cmd + bus.read_ns(512, 8), "no CMD13 after a read");
        let lat = dev.read(0, 1).unwrap();
        assert_eq!(lat, cmd + bus.read_ns(512, 1), "CMD17 needs no CMD23");
    }

    #[test]
    fn host_time_is_charged_once_per_block_request_and_once_per_mmc_request() {
        let ideal_write = CardDevice::new(&ideal())
            .unwrap()
            .write(0, 8, true)
            .unwrap();
        let ideal_read = CardDevice::new(&ideal()).unwrap().read(0, 8).unwrap();
        let mut model = ideal();
        model.timing =
            emmc_card::model::TimingModel::Constant(emmc_card::model::ConstantTimingModel {
                program_command_ns: 1_000_000,
                ..Default::default()
            });
        model.host.request_overhead_ns = 50_000;
        model.host.prepare_ns = 300_000;
        let mut dev = CardDevice::new(&model).unwrap();
        // A write is one MMC request and its CMD13: two request overheads, one
        // preparation, the programming (cache off: it goes to the medium).
        let lat = dev.write(0, 8, true).unwrap();
        assert_eq!(lat, ideal_write + 300_000 + 2 * 50_000 + 1_000_000);
        // A read is one MMC request.
        let lat = dev.read(0, 8).unwrap();
        assert_eq!(lat, ideal_read + 300_000 + 50_000);
        assert_eq!(dev.now(), dev.card().now());
    }

    #[test]
    fn a_request_beyond_the_queue_limit_completes_when_its_last_piece_does() {
        let model = ideal();
        let mut dev = CardDevice::new(&model).unwrap();
        let max = dev.driver().config().max_sectors;
        let one = dev.write(0, max, false).unwrap();
        let two = dev.write(0, 2 * max, false).unwrap();
        assert_eq!(two, 2 * one, "two pieces of the queue's largest request");
        assert_eq!(dev.driver().stats().mmc_requests, 3);
    }

    #[test]
    fn requests_outside_the_device_are_refused() {
        let mut dev = CardDevice::new(&ideal()).unwrap();
        let size = dev.sectors();
        assert!(matches!(
            dev.write(size - 1, 2, false),
            Err(IoError::OutOfRange { .. })
        ));
        assert!(matches!(
            dev.read(u64::MAX, 1),
            Err(IoError::OutOfRange { .. })
        ));
        assert!(matches!(dev.read(0, 0), Err(IoError::OutOfRange { .. })));
        assert!(dev.read(size - 1, 1).is_ok());
    }
}
