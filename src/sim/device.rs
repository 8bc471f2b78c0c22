//! What a simulator workload sees: a block device whose every request takes card time.
//!
//! [`CardDevice`] is a card of a device model on a data-less store, brought up in the bus
//! mode of the model's `[host]` section, with each block request executed as Linux's MMC
//! block driver would issue it (CMD23 + CMD18/CMD25, or CMD17/CMD24 for one block) and
//! timed as the bus and the card's timing model say: host overhead, command exchanges,
//! data blocks on the bus, the card's access and programming time.

use crate::card::ext_csd as ext;
use crate::card::{r1, Card, CardError, Command, Response};
use crate::host::mmc::{HostCaps, MmcError, MmcHost};
use crate::model::{BusTiming, DeviceModel};
use crate::store::NullStore;
use crate::timing::bus::ResponseLength;
use crate::timing::{Bus, Nanos};

/// CMD38 argument for a discard.
const DISCARD_ARG: u32 = 0x0000_0003;

/// Errors a block request can end with.
#[derive(Debug, thiserror::Error)]
pub enum IoError {
    #[error("card: {0}")]
    Card(#[from] CardError),
    #[error("bring-up: {0}")]
    BringUp(#[from] MmcError),
    #[error("CMD{cmd} got no response")]
    Timeout { cmd: u8 },
    #[error("CMD{cmd}: status {desc}", desc = r1::describe(*status))]
    Status { cmd: u8, status: u32 },
    #[error("data phase: {0}")]
    Data(#[from] crate::card::DataError),
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

/// A card of a device model, driven directly over a modelled bus.
pub struct CardDevice {
    host: MmcHost,
    bus: Bus,
    request_overhead_ns: Nanos,
    /// Zeroes to send as write data (the store keeps no data).
    zeroes: Vec<u8>,
    scratch: Vec<u8>,
    sectors: u64,
}

impl CardDevice {
    /// A freshly powered card of `model` on a data-less store, brought up as Linux would.
    pub fn new(model: &DeviceModel) -> Result<CardDevice, IoError> {
        let layout = Card::layout_for(model);
        let card = Card::new(model.clone(), Box::new(NullStore::new(layout)))?;
        CardDevice::with_card(card, model)
    }

    /// Drive an existing card (any store, any timing) in the bus mode of `model.host`.
    pub fn with_card(card: Card, model: &DeviceModel) -> Result<CardDevice, IoError> {
        let mut host = MmcHost::new(card);
        host.mmc_init_card(&HostCaps::for_model(&model.host))?;
        let h = &model.host;
        let bus = Bus::new(h.clock_hz, h.bus_width, h.timing == BusTiming::Ddr52);
        let sectors = host.card.partition_sectors(crate::card::Partition::User);
        Ok(CardDevice {
            host,
            bus,
            request_overhead_ns: h.request_overhead_ns,
            zeroes: Vec::new(),
            scratch: Vec::new(),
            sectors,
        })
    }

    pub fn card(&self) -> &Card {
        &self.host.card
    }

    pub fn card_mut(&mut self) -> &mut Card {
        &mut self.host.card
    }

    pub fn bus(&self) -> Bus {
        self.bus
    }

    fn command(&mut self, index: u8, arg: u32) -> Result<u32, IoError> {
        self.host.now += self.bus.command_ns(ResponseLength::Short);
        match self
            .host
            .card
            .execute(self.host.now, Command::new(index, arg))
        {
            Some(Response::R1(s)) | Some(Response::R1b(s)) if s & r1::ERRORS == 0 => Ok(s),
            Some(Response::R1(status)) | Some(Response::R1b(status)) => {
                Err(IoError::Status { cmd: index, status })
            }
            _ => Err(IoError::Timeout { cmd: index }),
        }
    }

    fn check_range(&self, lba: u64, sectors: u32) -> Result<(), IoError> {
        if sectors == 0
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

    fn wait_busy(&mut self) {
        if let Some(end) = self.host.card.busy_until() {
            self.host.now = self.host.now.max(end);
        }
        self.host.card.advance(self.host.now);
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
        self.host.now += self.request_overhead_ns;
        if sectors == 1 {
            self.command(17, self.address(lba))?;
        } else {
            self.command(23, sectors)?;
            self.command(18, self.address(lba))?;
        }
        let len = sectors as usize * 512;
        self.scratch.resize(len, 0);
        let internal = self
            .host
            .card
            .read_data(self.host.now, &mut self.scratch[..len])?;
        self.host.now += internal + self.bus.read_ns(512, u64::from(sectors));
        self.host.card.advance(self.host.now);
        Ok(self.host.now - start)
    }

    fn write(&mut self, lba: u64, sectors: u32, reliable: bool) -> Result<Nanos, IoError> {
        self.check_range(lba, sectors)?;
        let start = self.host.now;
        self.host.now += self.request_overhead_ns;
        if sectors == 1 && !reliable {
            self.command(24, self.address(lba))?;
        } else {
            let flags = if reliable {
                crate::host::mmc::MMC_CMD23_ARG_REL_WR
            } else {
                0
            };
            self.command(23, sectors | flags)?;
            self.command(25, self.address(lba))?;
        }
        let len = sectors as usize * 512;
        if self.zeroes.len() < len {
            self.zeroes.resize(len, 0);
        }
        self.host.now += self.bus.write_ns(512, u64::from(sectors));
        self.host
            .card
            .write_data(self.host.now, &self.zeroes[..len])?;
        self.wait_busy();
        Ok(self.host.now - start)
    }

    fn flush(&mut self) -> Result<Nanos, IoError> {
        let start = self.host.now;
        if self.host.card.ext_csd()[ext::CACHE_CTRL] & ext::CACHE_EN != 0 {
            self.host.now += self.request_overhead_ns;
            let arg = 0x0300_0000 | (ext::FLUSH_CACHE as u32) << 16 | 1 << 8;
            self.command(6, arg)?;
            self.wait_busy();
        }
        Ok(self.host.now - start)
    }

    fn discard(&mut self, lba: u64, sectors: u32) -> Result<Nanos, IoError> {
        self.check_range(lba, sectors)?;
        let start = self.host.now;
        self.host.now += self.request_overhead_ns;
        self.command(35, self.address(lba))?;
        self.command(36, self.address(lba + u64::from(sectors) - 1))?;
        self.command(38, DISCARD_ARG)?;
        self.wait_busy();
        Ok(self.host.now - start)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
        model.timing.program_command_ns = 1_000_000;
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
