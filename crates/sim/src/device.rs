//! What a simulator workload sees: a block device whose every request takes card time.
//!
//! [`CardDevice`] is a card of a device model on a data-less store behind the SDHCI
//! controller model, brought up in the bus mode of the model's `[host]` section, with each
//! block request issued as Linux's MMC block driver would (CMD23 + CMD18/CMD25, or
//! CMD17/CMD24 for one block) and timed as the controller, the bus and the card's timing
//! model say: host overhead, command exchanges, data blocks on the bus, the card's access
//! and programming time.

use emmc_card::command::ResponseType;
use emmc_card::ext_csd as ext;
use emmc_card::model::DeviceModel;
use emmc_card::store::NullStore;
use emmc_card::timing::{Bus, Nanos};
use emmc_card::{r1, Card, CardError};
use emmc_host::mmc::{HostCaps, MmcError, MmcHost, MMC_CMD23_ARG_REL_WR};
use emmc_host::sdhci::{MmcCommand, MmcData, MmcRequest, SdhciCompletion, SdhciConfig, SdhciError};

/// CMD38 argument for a discard.
const DISCARD_ARG: u32 = 0x0000_0003;

/// Errors a block request can end with.
#[derive(Debug, thiserror::Error)]
pub enum IoError {
    #[error("card: {0}")]
    Card(#[from] CardError),
    #[error("bring-up: {0}")]
    BringUp(#[from] MmcError),
    #[error("CMD{cmd}: host controller error {error:?}")]
    Host { cmd: u8, error: SdhciError },
    #[error("CMD{cmd}: status {desc}", desc = r1::describe(*status))]
    Status { cmd: u8, status: u32 },
    #[error("data phase: {0}")]
    Data(#[from] emmc_card::DataError),
    #[error("request of {sectors} sectors at {lba} is outside the {size}-sector device")]
    OutOfRange { lba: u64, sectors: u32, size: u64 },
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

/// A card of a device model behind the SDHCI controller model.
pub struct CardDevice {
    host: MmcHost,
    /// Zeroes to send as write data (the store keeps no data).
    zeroes: Vec<u8>,
    scratch: Vec<u8>,
    sectors: u64,
}

/// CMD23 / CMD17 / CMD18 / CMD24 / CMD25 / CMD12 as Linux's block driver sends them.
fn r1(opcode: u8, arg: u32) -> MmcCommand {
    MmcCommand::new(opcode, arg, ResponseType::R1)
}

impl CardDevice {
    /// A freshly powered card of `model` on a data-less store, brought up as Linux would.
    pub fn new(model: &DeviceModel) -> Result<CardDevice, IoError> {
        let layout = Card::layout_for(model);
        let card = Card::new(model.clone(), Box::new(NullStore::new(layout)))?;
        CardDevice::with_card(card, model)
    }

    /// Drive an existing card (any store, any timing) with the host of `model.host`.
    pub fn with_card(card: Card, model: &DeviceModel) -> Result<CardDevice, IoError> {
        let mut host = MmcHost::with_config(card, SdhciConfig::for_model(&model.host));
        host.mmc_init_card(&HostCaps::for_model(&model.host))?;
        let sectors = host.card.partition_sectors(emmc_card::Partition::User);
        Ok(CardDevice {
            host,
            zeroes: Vec::new(),
            scratch: Vec::new(),
            sectors,
        })
    }

    pub fn card(&self) -> &Card {
        &self.host.card
    }

    /// Install a fault injector on the controller (`None` removes it).
    pub fn set_fault_injector(&mut self, faults: Option<emmc_host::fault::FaultInjector>) {
        self.host.sdhci.set_fault_injector(faults);
    }

    /// Install a command log on the controller (`None` removes it).
    pub fn set_cmd_log(&mut self, log: Option<emmc_host::cmdlog::CmdLog>) {
        self.host.sdhci.set_cmd_log(log);
    }

    /// Write out what the command log holds.
    pub fn flush_cmd_log(&mut self) {
        self.host.sdhci.flush_cmd_log();
    }

    pub fn fault_injector(&self) -> Option<&emmc_host::fault::FaultInjector> {
        self.host.sdhci.fault_injector()
    }

    pub fn card_mut(&mut self) -> &mut Card {
        &mut self.host.card
    }

    /// The bus as the host has set it up.
    pub fn bus(&self) -> Bus {
        self.host.sdhci.bus()
    }

    fn check_range(&self, lba: u64, sectors: u32) -> Result<(), IoError> {
        if sectors == 0
            || sectors > 65_535
            || lba
                .checked_add(u64::from(sectors))
                .is_none_or(|end| end > self.sectors)
        {
            return Err(IoError::OutOfRange {
                lba,
                sectors,
                size: self.sectors,
            });
        }
        Ok(())
    }

    fn address(&self, lba: u64) -> u32 {
        if self.host.card.model().sector_addressing() {
            lba as u32
        } else {
            (lba * 512) as u32
        }
    }

    /// Turn a completion into the request's outcome: controller errors first, then the
    /// card's R1 error bits.
    fn outcome(done: &SdhciCompletion) -> Result<(), IoError> {
        if let Some(error) = done.error() {
            let cmd = [done.sbc.as_ref(), Some(&done.cmd), done.stop.as_ref()]
                .into_iter()
                .flatten()
                .find(|c| c.error.is_some())
                .map_or(done.cmd.opcode, |c| c.opcode);
            return Err(IoError::Host { cmd, error });
        }
        for c in [done.sbc.as_ref(), Some(&done.cmd)].into_iter().flatten() {
            if c.issued && c.resp[0] & r1::ERRORS != 0 {
                return Err(IoError::Status {
                    cmd: c.opcode,
                    status: c.resp[0],
                });
            }
        }
        Ok(())
    }

    /// Send a command without data and wait for its busy period.
    fn command(&mut self, cmd: MmcCommand) -> Result<(), IoError> {
        let done = self.host.mmc_wait_for_req(MmcRequest::command(cmd));
        Self::outcome(&done)
    }
}

impl BlockDevice for CardDevice {
    fn sectors(&self) -> u64 {
        self.sectors
    }

    fn now(&self) -> Nanos {
        self.host.now
    }

    fn idle(&mut self, ns: Nanos) {
        self.host.now += ns;
        self.host.card.advance(self.host.now);
    }

    fn read(&mut self, lba: u64, sectors: u32) -> Result<Nanos, IoError> {
        self.check_range(lba, sectors)?;
        let start = self.host.now;
        let len = sectors as usize * 512;
        self.scratch.resize(len, 0);
        let address = self.address(lba);
        let mut sg = [&mut self.scratch[..len]];
        let mrq = if sectors == 1 {
            MmcRequest {
                sbc: None,
                cmd: r1(17, address),
                data: Some(MmcData::read(512, 1, &mut sg)),
                stop: None,
            }
        } else {
            MmcRequest {
                sbc: Some(r1(23, sectors)),
                cmd: r1(18, address),
                data: Some(MmcData::read(512, sectors, &mut sg)),
                stop: Some(r1(12, 0)),
            }
        };
        let done = self.host.mmc_wait_for_req(mrq);
        Self::outcome(&done)?;
        Ok(self.host.now - start)
    }

    fn write(&mut self, lba: u64, sectors: u32, reliable: bool) -> Result<Nanos, IoError> {
        self.check_range(lba, sectors)?;
        let start = self.host.now;
        let len = sectors as usize * 512;
        if self.zeroes.len() < len {
            self.zeroes.resize(len, 0);
        }
        let address = self.address(lba);
        let mut sg = [&self.zeroes[..len]];
        let mrq = if sectors == 1 && !reliable {
            MmcRequest {
                sbc: None,
                cmd: r1(24, address),
                data: Some(MmcData::write(512, 1, &mut sg)),
                stop: None,
            }
        } else {
            let flags = if reliable { MMC_CMD23_ARG_REL_WR } else { 0 };
            MmcRequest {
                sbc: Some(r1(23, sectors | flags)),
                cmd: r1(25, address),
                data: Some(MmcData::write(512, sectors, &mut sg)),
                stop: Some(MmcCommand::new(12, 0, ResponseType::R1b)),
            }
        };
        let done = self.host.mmc_wait_for_req(mrq);
        Self::outcome(&done)?;
        Ok(self.host.now - start)
    }

    fn flush(&mut self) -> Result<Nanos, IoError> {
        let start = self.host.now;
        if self.host.card.ext_csd()[ext::CACHE_CTRL] & ext::CACHE_EN != 0 {
            self.host.mmc_flush_cache()?;
        }
        Ok(self.host.now - start)
    }

    fn discard(&mut self, lba: u64, sectors: u32) -> Result<Nanos, IoError> {
        self.check_range(lba, sectors)?;
        let start = self.host.now;
        self.command(r1(35, self.address(lba)))?;
        self.command(r1(36, self.address(lba + u64::from(sectors) - 1)))?;
        self.command(MmcCommand::new(38, DISCARD_ARG, ResponseType::R1b))?;
        Ok(self.host.now - start)
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
        assert_eq!(lat, 2 * cmd + bus.write_ns(512, 8));
        let lat = dev.read(0, 8).unwrap();
        assert_eq!(lat, 2 * cmd + bus.read_ns(512, 8));
        let lat = dev.read(0, 1).unwrap();
        assert_eq!(lat, cmd + bus.read_ns(512, 1), "CMD17 needs no CMD23");
    }

    #[test]
    fn programming_time_and_host_overhead_add_to_write_latency() {
        let mut model = ideal();
        model.timing =
            emmc_card::model::TimingModel::Constant(emmc_card::model::ConstantTimingModel {
                program_command_ns: 1_000_000,
                ..Default::default()
            });
        model.host.request_overhead_ns = 50_000;
        let mut dev = CardDevice::new(&model).unwrap();
        dev.card_mut().advance(0);
        // Cache off: programming goes to the medium.
        let base = {
            let mut ideal_dev = CardDevice::new(&ideal()).unwrap();
            ideal_dev.write(0, 8, true).unwrap()
        };
        let lat = dev.write(0, 8, true).unwrap();
        assert_eq!(lat, base + 1_000_000 + 50_000);
        assert_eq!(dev.now(), dev.card().now());
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
