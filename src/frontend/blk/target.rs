//! Executing checked virtio-blk requests on the card, in card time.
//!
//! Every request becomes the MMC requests Linux's MMC block driver would send — CMD23 +
//! CMD18/CMD25 (CMD17/CMD24 for one block), FLUSH_CACHE, CMD35/36/38 — issued through the
//! SDHCI controller model, whose DMA engine reads and writes the guest's buffers in place.
//! The card is one device: requests run one after another, each starting when the card
//! is free and the request has arrived.

use vm_memory::{GuestAddress, GuestMemory};

use super::request::{
    copy_to, GuestSegment, Limits, Range, Request, RequestKind, Segment, VIRTIO_BLK_ID_BYTES,
    VIRTIO_BLK_S_IOERR, VIRTIO_BLK_S_OK, VIRTIO_BLK_S_UNSUPP,
};
use crate::card::command::ResponseType;
use crate::card::ext_csd as ext;
use crate::card::registers::decode_cid;
use crate::card::{r1, Card, Partition, PowerDown};
use crate::host::mmc::{HostCaps, MmcError, MmcHost};
use crate::host::sdhci::{MmcCommand, MmcData, MmcRequest, SdhciCompletion, SdhciConfig};
use crate::model::DeviceModel;
use crate::timing::Nanos;

/// CMD38 arguments the target uses.
const DISCARD_ARG: u32 = 0x0000_0003;
const TRIM_ARG: u32 = 0x0000_0001;
const SECURE_TRIM1_ARG: u32 = 0x8000_0001;
const SECURE_TRIM2_ARG: u32 = 0x8000_8000;
/// The largest request the host takes (SDHCI with ADMA2 in Linux: 512 KiB).
pub const MAX_REQUEST_SECTORS: u32 = 1024;
/// Scatter-gather limits (Linux's sdhci: 128 segments of at most 64 KiB).
pub const SEG_MAX: u32 = 128;
pub const SIZE_MAX: u32 = 65_536;

/// What the card can do, as the frontend advertises it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Capabilities {
    pub discard: bool,
    pub write_zeroes_by_trim: bool,
    pub secure_erase: bool,
    pub read_only: bool,
}

/// The card behind the frontend.
pub struct CardTarget {
    host: MmcHost,
    caps: Capabilities,
    limits: Limits,
    serial: [u8; VIRTIO_BLK_ID_BYTES],
    zeroes: Vec<u8>,
}

/// The outcome of one request: status byte, bytes written to the guest, and the card
/// time it completed at.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Outcome {
    pub status: u8,
    pub written: u32,
    pub done_at: Nanos,
}

fn r1(opcode: u8, arg: u32) -> MmcCommand {
    MmcCommand::new(opcode, arg, ResponseType::R1)
}

/// The GET_ID string: manufacturer, product name and serial from the CID, NUL-padded.
pub fn serial_from_cid(cid: &[u8; 16], ext_csd_rev: u8) -> [u8; VIRTIO_BLK_ID_BYTES] {
    let f = decode_cid(cid, ext_csd_rev);
    let text = format!("EMMC{:02X}{}{:08X}", f.mid, f.pnm.trim(), f.psn);
    let mut id = [0u8; VIRTIO_BLK_ID_BYTES];
    for (d, s) in id
        .iter_mut()
        .zip(text.bytes().filter(u8::is_ascii_alphanumeric))
    {
        *d = s;
    }
    id
}

/// Cut a scatter-gather list into pieces of at most `max_bytes` (a multiple of 512),
/// splitting a segment where a piece ends. Yields (byte offset of the piece, its segments).
/// A piece holds a run of the original segments, so it never has more than they do.
pub fn split_segments(
    segs: &[Segment],
    max_bytes: u64,
) -> impl Iterator<Item = (u64, Vec<Segment>)> + '_ {
    let mut index = 0;
    let mut within = 0u32;
    let mut offset = 0u64;
    std::iter::from_fn(move || {
        let start = offset;
        let mut piece = Vec::new();
        let mut bytes = 0u64;
        while index < segs.len() && bytes < max_bytes {
            let seg = segs[index];
            let take = u64::from(seg.len - within).min(max_bytes - bytes) as u32;
            piece.push(Segment {
                addr: GuestAddress(seg.addr.0 + u64::from(within)),
                len: take,
            });
            bytes += u64::from(take);
            within += take;
            if within == seg.len {
                index += 1;
                within = 0;
            }
        }
        offset += bytes;
        (!piece.is_empty()).then_some((start, piece))
    })
}

impl CardTarget {
    /// Bring `card` up as Linux would with the host of `model.host`.
    pub fn new(card: Card, model: &DeviceModel) -> Result<CardTarget, MmcError> {
        let mut host = MmcHost::with_config(card, SdhciConfig::for_model(&model.host));
        let e = host.mmc_init_card(&HostCaps::for_model(&model.host))?;
        let sectors = host.card.partition_sectors(Partition::User);
        let features = e[ext::SEC_FEATURE_SUPPORT];
        let trim = features & ext::SEC_GB_CL_EN != 0;
        let caps = Capabilities {
            discard: e[ext::EXT_CSD_REV] >= 6,
            write_zeroes_by_trim: trim && e[ext::ERASED_MEM_CONT] & 1 == 0,
            secure_erase: trim && features & ext::SECURE_ER_EN != 0,
            read_only: host.card.user_area_write_protected(),
        };
        let serial = serial_from_cid(&host.card.cid(), e[ext::EXT_CSD_REV]);
        Ok(CardTarget {
            host,
            caps,
            limits: Limits {
                capacity: sectors,
                size_max: SIZE_MAX,
                seg_max: SEG_MAX,
                // What a driver that honours seg_max and size_max can form; larger
                // requests are split into MMC requests of MAX_REQUEST_SECTORS.
                max_sectors: SEG_MAX * (SIZE_MAX / 512),
                max_ranges: 1,
                max_range_sectors: u32::try_from(sectors.min(u64::from(u32::MAX)))
                    .unwrap_or(u32::MAX),
            },
            serial,
            zeroes: Vec::new(),
        })
    }

    pub fn limits(&self) -> Limits {
        self.limits
    }

    pub fn capabilities(&self) -> Capabilities {
        self.caps
    }

    pub fn serial(&self) -> [u8; VIRTIO_BLK_ID_BYTES] {
        self.serial
    }

    pub fn card(&self) -> &Card {
        &self.host.card
    }

    /// Card time now (the end of the last request, or later if the card idled).
    pub fn now(&self) -> Nanos {
        self.host.now
    }

    /// Let the card idle until `t` (a request arrives then).
    pub fn idle_until(&mut self, t: Nanos) {
        if t > self.host.now {
            self.host.now = t;
            self.host.card.advance(t);
        }
    }

    /// Execute `req` arriving at card time `arrival`; data moves to and from `mem`.
    pub fn execute<M: GuestMemory + ?Sized>(
        &mut self,
        mem: &M,
        req: &Request,
        arrival: Nanos,
    ) -> Outcome {
        self.idle_until(arrival);
        let (status, written) = match self.run(mem, req) {
            Ok(written) => (VIRTIO_BLK_S_OK, written),
            Err(code) => (code, 0),
        };
        Outcome {
            status,
            written,
            done_at: self.host.now,
        }
    }

    fn run<M: GuestMemory + ?Sized>(&mut self, mem: &M, req: &Request) -> Result<u32, u8> {
        match req.kind {
            RequestKind::Read => {
                self.transfer(mem, req, false)?;
                Ok(req.data_len as u32)
            }
            RequestKind::Write => {
                if self.caps.read_only {
                    return Err(VIRTIO_BLK_S_IOERR);
                }
                self.transfer(mem, req, true)?;
                Ok(0)
            }
            RequestKind::Flush => {
                if self.host.card.ext_csd()[ext::CACHE_CTRL] & ext::CACHE_EN != 0 {
                    self.host
                        .mmc_flush_cache()
                        .map_err(|e| self.failed("flush", &e.to_string()))?;
                }
                Ok(0)
            }
            RequestKind::GetId => {
                let n = copy_to(mem, &req.data, &self.serial);
                Ok(n as u32)
            }
            RequestKind::Discard => {
                self.require(self.caps.discard)?;
                for r in &req.ranges {
                    self.erase(*r, DISCARD_ARG, None)?;
                }
                Ok(0)
            }
            RequestKind::WriteZeroes => {
                for r in &req.ranges {
                    if self.caps.write_zeroes_by_trim {
                        self.erase(*r, TRIM_ARG, None)?;
                    } else {
                        self.write_zeroes(*r)?;
                    }
                }
                Ok(0)
            }
            RequestKind::SecureErase => {
                self.require(self.caps.secure_erase)?;
                for r in &req.ranges {
                    // Secure trim purges exactly the range; secure erase would take whole
                    // erase groups, including data outside it.
                    self.erase(*r, SECURE_TRIM1_ARG, Some(SECURE_TRIM2_ARG))?;
                }
                Ok(0)
            }
        }
    }

    fn require(&self, supported: bool) -> Result<(), u8> {
        if supported {
            Ok(())
        } else {
            Err(VIRTIO_BLK_S_UNSUPP)
        }
    }

    fn failed(&self, what: &str, why: &str) -> u8 {
        log::warn!("{what} failed: {why}");
        VIRTIO_BLK_S_IOERR
    }

    fn address(&self, lba: u64) -> u32 {
        if self.host.card.model().sector_addressing() {
            lba as u32
        } else {
            (lba * 512) as u32
        }
    }

    fn check(&self, what: &str, done: &SdhciCompletion) -> Result<(), u8> {
        if let Some(e) = done.error() {
            return Err(self.failed(what, &format!("controller error {e:?}")));
        }
        for c in [done.sbc.as_ref(), Some(&done.cmd)].into_iter().flatten() {
            if c.issued && c.resp[0] & r1::ERRORS != 0 {
                return Err(self.failed(
                    what,
                    &format!("CMD{} status {}", c.opcode, r1::describe(c.resp[0])),
                ));
            }
        }
        Ok(())
    }

    /// A read or write, split as the block layer splits for the host's queue limits: at
    /// most [`MAX_REQUEST_SECTORS`] per MMC request (the parser already holds the segment
    /// count to [`SEG_MAX`]).
    fn transfer<M: GuestMemory + ?Sized>(
        &mut self,
        mem: &M,
        req: &Request,
        write: bool,
    ) -> Result<(), u8> {
        let max_bytes = u64::from(MAX_REQUEST_SECTORS) * 512;
        for (offset, piece) in split_segments(&req.data, max_bytes) {
            self.transfer_piece(mem, req.sector + offset / 512, &piece, write)?;
        }
        Ok(())
    }

    /// One MMC read or write: CMD23 + CMD18/CMD25, or CMD17/CMD24 for a single block.
    fn transfer_piece<M: GuestMemory + ?Sized>(
        &mut self,
        mem: &M,
        sector: u64,
        segments: &[Segment],
        write: bool,
    ) -> Result<(), u8> {
        let bytes: u64 = segments.iter().map(|s| u64::from(s.len)).sum();
        let blocks = (bytes / 512) as u32;
        let address = self.address(sector);
        let mut sg: Vec<GuestSegment<'_, M>> = segments
            .iter()
            .map(|&seg| GuestSegment { mem, seg })
            .collect();
        let data = if write {
            MmcData::write(512, blocks, &mut sg)
        } else {
            MmcData::read(512, blocks, &mut sg)
        };
        let mrq = if blocks == 1 {
            MmcRequest {
                sbc: None,
                cmd: r1(if write { 24 } else { 17 }, address),
                data: Some(data),
                stop: None,
            }
        } else {
            MmcRequest {
                sbc: Some(r1(23, blocks)),
                cmd: r1(if write { 25 } else { 18 }, address),
                data: Some(data),
                stop: Some(MmcCommand::new(
                    12,
                    0,
                    if write {
                        ResponseType::R1b
                    } else {
                        ResponseType::R1
                    },
                )),
            }
        };
        let done = self.host.mmc_wait_for_req(mrq);
        self.check(if write { "write" } else { "read" }, &done)
    }

    fn command(&mut self, cmd: MmcCommand) -> Result<(), u8> {
        let done = self.host.mmc_wait_for_req(MmcRequest::command(cmd));
        self.check("erase", &done)
    }

    /// CMD35/CMD36/CMD38 over `range` (and a second CMD38 for secure trim step 2).
    fn erase(&mut self, range: Range, arg: u32, then: Option<u32>) -> Result<(), u8> {
        let last = range.sector + u64::from(range.sectors) - 1;
        self.command(r1(35, self.address(range.sector)))?;
        self.command(r1(36, self.address(last)))?;
        self.command(MmcCommand::new(38, arg, ResponseType::R1b))?;
        if let Some(arg2) = then {
            self.command(r1(35, self.address(range.sector)))?;
            self.command(r1(36, self.address(last)))?;
            self.command(MmcCommand::new(38, arg2, ResponseType::R1b))?;
        }
        Ok(())
    }

    /// Write zero blocks over `range` in maximum-size requests.
    fn write_zeroes(&mut self, range: Range) -> Result<(), u8> {
        let mut lba = range.sector;
        let end = range.sector + u64::from(range.sectors);
        self.zeroes.resize(MAX_REQUEST_SECTORS as usize * 512, 0);
        while lba < end {
            let n = (end - lba).min(u64::from(MAX_REQUEST_SECTORS)) as u32;
            let address = self.address(lba);
            let zeroes = std::mem::take(&mut self.zeroes);
            let mut sg = [&zeroes[..n as usize * 512]];
            let mrq = MmcRequest {
                sbc: Some(r1(23, n)),
                cmd: r1(25, address),
                data: Some(MmcData::write(512, n, &mut sg)),
                stop: Some(MmcCommand::new(12, 0, ResponseType::R1b)),
            };
            let done = self.host.mmc_wait_for_req(mrq);
            self.zeroes = zeroes;
            self.check("write zeroes", &done)?;
            lba += u64::from(n);
        }
        Ok(())
    }

    /// The frontend went away: power the card down cleanly (cache written back, image
    /// synced) and bring it up again for the next one, as a rebooted machine would.
    pub fn restart(&mut self, model: &DeviceModel) -> Result<(), MmcError> {
        self.shutdown();
        let now = self.host.now;
        self.host.card.power_cycle(now, PowerDown::Clean);
        self.host.mmc_init_card(&HostCaps::for_model(&model.host))?;
        Ok(())
    }

    /// Clean shutdown: write the cache back, notify power-off, make the image durable.
    pub fn shutdown(&mut self) {
        if self.host.card.ext_csd()[ext::CACHE_CTRL] & ext::CACHE_EN != 0 {
            if let Err(e) = self.host.mmc_flush_cache() {
                log::warn!("flush at shutdown: {e}");
            }
        }
        let now = self.host.now;
        self.host.card.power_off(now, PowerDown::Clean);
    }
}
