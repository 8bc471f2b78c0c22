//! A block device over virtio-mmc: the main crate's MMC block driver
//! ([`MmcBlk`], `crates/host/src/blkdrv/`: bring-up, queue, scheduler, packing, reliable write,
//! flush, discard, HPI and BKOPS policies) running on a [`VirtioMmcHost`]. The same code
//! the daemon's vhost-user-blk transport runs in-process, here on the far side of the
//! socket.

use std::collections::{BTreeMap, HashMap};

use emmc_card::timing::Nanos;
use emmc_host::blkdrv::{Advance, BlkConfig, BlkData, BlkError, MmcBlk};
use emmc_host::mmc::MmcError;
use emmc_host::packing::{BlkOp, BlkRequest};

use crate::host::VirtioMmcHost;
use crate::transport::{Transport, TransportError, VhostUserTransport};

/// Why a block operation failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BlockError {
    #[error("transport: {0}")]
    Transport(#[from] TransportError),
    #[error("bring-up: {0}")]
    Probe(#[from] MmcError),
    #[error("{0}")]
    Blk(#[from] BlkError),
    #[error("{0} bytes is not a whole number of 512-byte sectors")]
    Unaligned(usize),
    #[error("request {0} did not complete")]
    Lost(u64),
}

/// The data of requests in flight, by request id.
#[derive(Debug, Default)]
pub struct Buffers {
    reqs: HashMap<u64, (u64, Vec<u8>)>,
}

impl Buffers {
    fn slice(&mut self, req: &BlkRequest, lba: u64, len: usize) -> Option<&mut [u8]> {
        let (base, data) = self.reqs.get_mut(&req.id)?;
        let off = usize::try_from(lba.checked_sub(*base)?).ok()? * 512;
        data.get_mut(off..off + len)
    }
}

impl BlkData for Buffers {
    fn write_data(&mut self, req: &BlkRequest, lba: u64, buf: &mut [u8]) {
        match self.slice(req, lba, buf.len()) {
            Some(s) => buf.copy_from_slice(s),
            None => buf.fill(0),
        }
    }

    fn read_data(&mut self, req: &BlkRequest, lba: u64, buf: &[u8]) {
        if let Some(s) = self.slice(req, lba, buf.len()) {
            s.copy_from_slice(buf);
        }
    }
}

/// A finished block request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Done {
    pub id: u64,
    /// Card time of the last completion.
    pub at: Nanos,
    pub result: Result<(), BlkError>,
    /// Read data.
    pub data: Vec<u8>,
}

struct Pending {
    /// Sectors still to complete (1 for requests without data).
    left: u64,
    result: Result<(), BlkError>,
    at: Nanos,
}

/// `MmcBlk` on a virtio-mmc host, with synchronous read/write/flush/discard and a
/// queue for submitting several requests at once.
pub struct VirtioMmcBlk<T: Transport = VhostUserTransport> {
    drv: MmcBlk<VirtioMmcHost<T>, Buffers>,
    next_id: u64,
    pending: BTreeMap<u64, Pending>,
    finished: BTreeMap<u64, Done>,
}

impl<T: Transport> VirtioMmcBlk<T> {
    /// `mmc_blk_probe` over the device: the Linux bring-up sequence through the socket,
    /// then the queue with `cfg`'s policies.
    pub fn probe(host: VirtioMmcHost<T>, cfg: BlkConfig) -> Result<Self, BlockError> {
        match MmcBlk::probe_with_data(host, cfg, Buffers::default()) {
            Ok(drv) => {
                drv.host().check()?;
                Ok(VirtioMmcBlk {
                    drv,
                    next_id: 0,
                    pending: BTreeMap::new(),
                    finished: BTreeMap::new(),
                })
            }
            Err(e) => Err(BlockError::Probe(e)),
        }
    }

    pub fn driver(&self) -> &MmcBlk<VirtioMmcHost<T>, Buffers> {
        &self.drv
    }

    pub fn driver_mut(&mut self) -> &mut MmcBlk<VirtioMmcHost<T>, Buffers> {
        &mut self.drv
    }

    pub fn host(&self) -> &VirtioMmcHost<T> {
        self.drv.host()
    }

    pub fn host_mut(&mut self) -> &mut VirtioMmcHost<T> {
        self.drv.host_mut()
    }

    /// User-area size in sectors.
    pub fn sectors(&self) -> u64 {
        self.drv.sectors()
    }

    /// Queue one request without running the driver; its id. Writes carry `data`; reads
    /// get a buffer of `sectors` sectors.
    pub fn submit(
        &mut self,
        op: BlkOp,
        lba: u64,
        sectors: u32,
        fua: bool,
        data: Option<&[u8]>,
    ) -> Result<u64, BlockError> {
        self.drv.host().check()?;
        self.next_id += 1;
        let id = self.next_id;
        let buf = match (op, data) {
            (BlkOp::Write, Some(d)) => d.to_vec(),
            (BlkOp::Read, _) => vec![0; sectors as usize * 512],
            _ => Vec::new(),
        };
        self.drv.data_mut().reqs.insert(id, (lba, buf));
        let data_op = matches!(op, BlkOp::Read | BlkOp::Write);
        self.pending.insert(
            id,
            Pending {
                left: if data_op {
                    u64::from(sectors.max(1))
                } else {
                    1
                },
                result: Ok(()),
                at: 0,
            },
        );
        let req = BlkRequest {
            fua,
            sync: fua || op == BlkOp::Read || op == BlkOp::Flush,
            ..BlkRequest::new(id, op, lba, sectors)
        };
        let now = self.drv.now();
        self.drv.submit(req, now);
        Ok(id)
    }

    /// Run the driver until every queued request has finished; what finished.
    pub fn run(&mut self) -> Result<Vec<Done>, BlockError> {
        while !self.pending.is_empty() {
            let state = self.drv.advance(Nanos::MAX);
            self.collect();
            self.drv.host().check()?;
            if state == Advance::Idle && !self.drv.in_progress() && !self.pending.is_empty() {
                let id = *self.pending.keys().next().expect("not empty");
                return Err(BlockError::Lost(id));
            }
        }
        Ok(std::mem::take(&mut self.finished).into_values().collect())
    }

    fn collect(&mut self) {
        for c in self.drv.take_completions() {
            let id = c.req.id;
            let Some(p) = self.pending.get_mut(&id) else {
                log::warn!("completion of unknown request {id}");
                continue;
            };
            if let Err(e) = c.result {
                if p.result.is_ok() {
                    p.result = Err(e);
                }
            }
            p.at = p.at.max(c.at);
            let n = match c.req.op {
                BlkOp::Read | BlkOp::Write => u64::from(c.req.sectors.max(1)),
                _ => 1,
            };
            p.left = p.left.saturating_sub(n);
            if p.left == 0 {
                let p = self.pending.remove(&id).expect("present");
                let (_, data) = self.drv.data_mut().reqs.remove(&id).unwrap_or_default();
                self.finished.insert(
                    id,
                    Done {
                        id,
                        at: p.at,
                        result: p.result,
                        data,
                    },
                );
            }
        }
    }

    fn one(
        &mut self,
        op: BlkOp,
        lba: u64,
        sectors: u32,
        fua: bool,
        data: Option<&[u8]>,
    ) -> Result<Done, BlockError> {
        let id = self.submit(op, lba, sectors, fua, data)?;
        let mut done = self.run()?;
        let i = done
            .iter()
            .position(|d| d.id == id)
            .ok_or(BlockError::Lost(id))?;
        let d = done.swap_remove(i);
        d.result.clone()?;
        Ok(d)
    }

    fn sectors_of(len: usize) -> Result<u32, BlockError> {
        if len % 512 != 0 {
            return Err(BlockError::Unaligned(len));
        }
        u32::try_from(len / 512).map_err(|_| BlockError::Unaligned(len))
    }

    /// Read `buf.len()` bytes from sector `lba`.
    pub fn read(&mut self, lba: u64, buf: &mut [u8]) -> Result<(), BlockError> {
        let n = Self::sectors_of(buf.len())?;
        let d = self.one(BlkOp::Read, lba, n, false, None)?;
        buf.copy_from_slice(&d.data);
        Ok(())
    }

    /// Write `data` at sector `lba` (into the card's cache, if on).
    pub fn write(&mut self, lba: u64, data: &[u8]) -> Result<(), BlockError> {
        let n = Self::sectors_of(data.len())?;
        self.one(BlkOp::Write, lba, n, false, Some(data))
            .map(|_| ())
    }

    /// Write with forced unit access (reliable write, or write + flush).
    pub fn write_fua(&mut self, lba: u64, data: &[u8]) -> Result<(), BlockError> {
        let n = Self::sectors_of(data.len())?;
        self.one(BlkOp::Write, lba, n, true, Some(data)).map(|_| ())
    }

    /// FLUSH_CACHE.
    pub fn flush(&mut self) -> Result<(), BlockError> {
        self.one(BlkOp::Flush, 0, 0, false, None).map(|_| ())
    }

    /// Discard `sectors` from `lba`.
    pub fn discard(&mut self, lba: u64, sectors: u32) -> Result<(), BlockError> {
        self.one(BlkOp::Discard, lba, sectors, false, None)
            .map(|_| ())
    }
}
