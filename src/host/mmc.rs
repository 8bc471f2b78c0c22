//! The MMC core operations a host driver performs, named after the Linux MMC core
//! (`drivers/mmc/core/mmc.c`, `mmc_ops.c`) so the two read side by side: card bring-up
//! (`mmc_init_card`), `mmc_switch` with its CMD13 check, status polling, and single
//! block-data requests.
//!
//! This is the direct path: commands go straight to the card and card time advances by
//! waiting out busy periods. The SDHCI controller model slots in underneath without
//! changing these names.

use crate::card::ext_csd as ext;
use crate::card::{r1, Card, CardState, Command, DataError, Partition, Response};
use crate::timing::Nanos;

/// The RCA Linux assigns.
pub const MMC_RCA: u16 = 1;

/// Linux's CMD1 argument: the 2.7–3.6 V and 1.8 V windows plus sector mode.
const HOST_OCR: u32 = 0x40FF_8080;

/// CMD23 argument bits.
pub const MMC_CMD23_ARG_REL_WR: u32 = 1 << 31;
pub const MMC_CMD23_ARG_PACKED: u32 = 1 << 30;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MmcError {
    #[error("CMD{0}: no response (command timeout)")]
    Timeout(u8),
    #[error("CMD{cmd}: card status {status:#010x} ({desc})", desc = r1::describe(*status))]
    Status { cmd: u8, status: u32 },
    #[error("CMD{cmd}: unexpected response {resp:?}")]
    Response { cmd: u8, resp: Option<Response> },
    #[error("CMD1: card never finished power-up")]
    PowerUp,
    #[error("data: {0}")]
    Data(#[from] DataError),
}

/// What the host may switch the card to during bring-up.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HostCaps {
    /// 1, 4 or 8 data lines.
    pub bus_width: u8,
    pub high_speed: bool,
    /// Dual data rate (DDR52) after switching to high speed.
    pub ddr: bool,
    pub hs200: bool,
    pub cache: bool,
    pub hpi: bool,
    /// Enable manual BKOPS (BKOPS_EN is one-time programmable on the card).
    pub bkops: bool,
    /// Enable the PACKED_FAILURE exception event.
    pub packed_event: bool,
}

impl HostCaps {
    /// Capabilities that bring a card up in the bus mode of a model's `[host]` section.
    pub fn for_model(host: &crate::model::HostModel) -> HostCaps {
        use crate::model::BusTiming;
        HostCaps {
            bus_width: host.bus_width,
            high_speed: host.timing != BusTiming::Legacy,
            ddr: host.timing == BusTiming::Ddr52,
            hs200: host.timing == BusTiming::Hs200,
            ..HostCaps::default()
        }
    }
}

impl Default for HostCaps {
    fn default() -> Self {
        HostCaps {
            bus_width: 8,
            high_speed: true,
            ddr: false,
            hs200: false,
            cache: true,
            hpi: true,
            bkops: true,
            packed_event: true,
        }
    }
}

/// A card and the card time of the host driving it.
pub struct MmcHost {
    pub card: Card,
    pub now: Nanos,
    /// Card time one command costs on the bus in this direct model.
    pub command_ns: Nanos,
}

impl MmcHost {
    pub fn new(card: Card) -> MmcHost {
        let now = card.now();
        MmcHost {
            card,
            now,
            command_ns: 0,
        }
    }

    /// Give the card back (e.g. to power-cycle it or reopen its image).
    pub fn into_card(self) -> Card {
        self.card
    }

    /// Send one command; `None` is a command timeout.
    pub fn mmc_send_command(&mut self, index: u8, arg: u32) -> Option<Response> {
        self.now += self.command_ns;
        self.card.execute(self.now, Command::new(index, arg))
    }

    /// Send a command that answers R1/R1b and check its error bits.
    pub fn mmc_send_r1(&mut self, index: u8, arg: u32) -> Result<u32, MmcError> {
        match self.mmc_send_command(index, arg) {
            Some(Response::R1(status)) | Some(Response::R1b(status)) => {
                if status & r1::ERRORS != 0 {
                    Err(MmcError::Status { cmd: index, status })
                } else {
                    Ok(status)
                }
            }
            None => Err(MmcError::Timeout(index)),
            other => Err(MmcError::Response {
                cmd: index,
                resp: other,
            }),
        }
    }

    /// Wait until DAT0 busy is released.
    pub fn mmc_wait_busy(&mut self) {
        if let Some(end) = self.card.busy_until() {
            self.now = self.now.max(end);
        }
        self.card.advance(self.now);
    }

    /// CMD13.
    pub fn mmc_send_status(&mut self) -> Result<u32, MmcError> {
        self.mmc_send_r1(13, u32::from(MMC_RCA) << 16)
    }

    /// CMD6 write-byte, wait for busy, then CMD13 and check SWITCH_ERROR, as
    /// `mmc_switch()` does.
    pub fn mmc_switch(&mut self, index: usize, value: u8) -> Result<(), MmcError> {
        let arg = 0x0300_0000 | (index as u32) << 16 | u32::from(value) << 8;
        self.mmc_send_r1(6, arg)?;
        self.mmc_wait_busy();
        let status = self.mmc_send_status()?;
        if status & r1::SWITCH_ERROR != 0 {
            return Err(MmcError::Status { cmd: 6, status });
        }
        Ok(())
    }

    /// CMD8.
    pub fn mmc_get_ext_csd(&mut self) -> Result<[u8; ext::EXT_CSD_LEN], MmcError> {
        self.mmc_send_r1(8, 0)?;
        let mut buf = [0u8; ext::EXT_CSD_LEN];
        self.card.read_data(self.now, &mut buf)?;
        Ok(buf)
    }

    /// CMD1 until the card reports power-up done (Linux polls for one second).
    pub fn mmc_send_op_cond(&mut self) -> Result<u32, MmcError> {
        for _ in 0..1000 {
            match self.mmc_send_command(1, HOST_OCR) {
                Some(Response::R3(ocr)) if ocr & (1 << 31) != 0 => return Ok(ocr),
                Some(Response::R3(_)) => self.now += 1_000_000,
                None => return Err(MmcError::Timeout(1)),
                other => {
                    return Err(MmcError::Response {
                        cmd: 1,
                        resp: other,
                    })
                }
            }
        }
        Err(MmcError::PowerUp)
    }

    /// `mmc_init_card()`: identification, selection and the switches the host's
    /// capabilities allow. Returns the EXT_CSD as read after bring-up.
    pub fn mmc_init_card(&mut self, caps: &HostCaps) -> Result<[u8; ext::EXT_CSD_LEN], MmcError> {
        self.mmc_send_command(0, 0);
        self.mmc_send_op_cond()?;
        match self.mmc_send_command(2, 0) {
            Some(Response::R2(_)) => {}
            other => {
                return Err(MmcError::Response {
                    cmd: 2,
                    resp: other,
                })
            }
        }
        let rca_arg = u32::from(MMC_RCA) << 16;
        self.mmc_send_r1(3, rca_arg)?;
        match self.mmc_send_command(9, rca_arg) {
            Some(Response::R2(_)) => {}
            other => {
                return Err(MmcError::Response {
                    cmd: 9,
                    resp: other,
                })
            }
        }
        self.mmc_send_r1(7, rca_arg)?;
        let e = self.mmc_get_ext_csd()?;
        self.mmc_switch(ext::ERASE_GROUP_DEF, 1)?;
        if e[ext::PARTITION_CONFIG] & 0x07 != 0 {
            self.mmc_switch(ext::PARTITION_CONFIG, e[ext::PARTITION_CONFIG] & !0x07)?;
        }
        self.mmc_switch(ext::POWER_OFF_NOTIFICATION, ext::POWERED_ON)?;
        let device_type = e[ext::DEVICE_TYPE];
        let width = match caps.bus_width {
            8 => 2,
            4 => 1,
            _ => 0,
        };
        if caps.hs200 && width != 0 && device_type & ext::DEVICE_TYPE_HS200_1V8 != 0 {
            self.mmc_switch(ext::BUS_WIDTH, width)?;
            self.mmc_switch(ext::HS_TIMING, 2)?;
        } else {
            if caps.high_speed
                && device_type & (ext::DEVICE_TYPE_HS_52 | ext::DEVICE_TYPE_HS_26) != 0
            {
                self.mmc_switch(ext::HS_TIMING, 1)?;
            }
            if width != 0 {
                self.mmc_switch(ext::BUS_WIDTH, width)?;
                let ddr_capable =
                    device_type & (ext::DEVICE_TYPE_DDR_52_1V8 | ext::DEVICE_TYPE_DDR_52_1V2) != 0;
                if caps.ddr && caps.high_speed && ddr_capable {
                    // DDR52: BUS_WIDTH 5 (4-bit DDR) or 6 (8-bit DDR), after high speed.
                    self.mmc_switch(ext::BUS_WIDTH, width + 4)?;
                }
            }
        }
        if caps.hpi && e[ext::HPI_FEATURES] & ext::HPI_SUPPORT != 0 {
            self.mmc_switch(ext::HPI_MGMT, ext::HPI_EN)?;
        }
        if caps.bkops
            && e[ext::BKOPS_SUPPORT] & 1 != 0
            && e[ext::BKOPS_EN] & ext::BKOPS_MANUAL_EN == 0
        {
            self.mmc_switch(ext::BKOPS_EN, ext::BKOPS_MANUAL_EN)?;
        }
        if caps.cache && ext::read_le(&e, ext::CACHE_SIZE, 4) > 0 {
            self.mmc_switch(ext::CACHE_CTRL, ext::CACHE_EN)?;
        }
        if caps.packed_event && e[ext::MAX_PACKED_WRITES] >= 3 {
            self.mmc_switch(ext::EXCEPTION_EVENTS_CTRL, ext::EE_PACKED_FAILURE as u8)?;
        }
        if self.card.state() != CardState::Tran {
            return Err(MmcError::Response {
                cmd: 13,
                resp: None,
            });
        }
        self.mmc_get_ext_csd()
    }

    /// Select a physical partition (PARTITION_CONFIG access bits).
    pub fn mmc_select_partition(&mut self, partition: Partition) -> Result<(), MmcError> {
        let cfg = self.card.ext_csd()[ext::PARTITION_CONFIG];
        let value = (cfg & !0x07) | partition.access_bits();
        if value != cfg {
            self.mmc_switch(ext::PARTITION_CONFIG, value)?;
        }
        Ok(())
    }

    fn address(&self, lba: u64) -> u32 {
        if self.card.model().sector_addressing() {
            lba as u32
        } else {
            (lba * 512) as u32
        }
    }

    /// CMD23 + CMD18 (or CMD17 for one block).
    pub fn mmc_read_blocks(&mut self, lba: u64, buf: &mut [u8]) -> Result<(), MmcError> {
        let blocks = (buf.len() / 512) as u32;
        if blocks == 1 {
            self.mmc_send_r1(17, self.address(lba))?;
        } else {
            self.mmc_send_r1(23, blocks)?;
            self.mmc_send_r1(18, self.address(lba))?;
        }
        self.card.read_data(self.now, buf)?;
        Ok(())
    }

    /// CMD23 (with `cmd23_flags`, e.g. reliable write) + CMD25, then wait for programming.
    pub fn mmc_write_blocks(
        &mut self,
        lba: u64,
        data: &[u8],
        cmd23_flags: u32,
    ) -> Result<(), MmcError> {
        let blocks = (data.len() / 512) as u32;
        self.mmc_send_r1(23, blocks | cmd23_flags)?;
        self.mmc_send_r1(25, self.address(lba))?;
        self.card.write_data(self.now, data)?;
        self.mmc_wait_busy();
        let status = self.mmc_send_status()?;
        if status & r1::ERRORS != 0 {
            return Err(MmcError::Status { cmd: 25, status });
        }
        Ok(())
    }

    /// FLUSH_CACHE.
    pub fn mmc_flush_cache(&mut self) -> Result<(), MmcError> {
        self.mmc_switch(ext::FLUSH_CACHE, 1)
    }
}
