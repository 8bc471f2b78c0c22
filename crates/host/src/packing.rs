//! Packed commands on the host side: which queued block requests go into one packed
//! command, and the write packing control of seed 000 that decides whether to pack at all.
//! Named after the Linux 3.7–4.10 MMC block driver (`mmc_blk_prep_packed_list`,
//! `mmc_blk_write_packing_control`) so the two read side by side.

use std::collections::BTreeMap;

use serde::Serialize;

/// Block-layer operations the driver turns into MMC commands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum BlkOp {
    Read,
    Write,
    Flush,
    Discard,
    SecureErase,
    WriteZeroes,
}

impl BlkOp {
    pub fn is_read(self) -> bool {
        self == BlkOp::Read
    }
    pub fn is_write(self) -> bool {
        self == BlkOp::Write
    }
    /// Flush and the erase family stop packing (REQ_FLUSH / REQ_DISCARD in Linux).
    pub fn stops_packing(self) -> bool {
        matches!(
            self,
            BlkOp::Flush | BlkOp::Discard | BlkOp::SecureErase | BlkOp::WriteZeroes
        )
    }
}

/// One block request as the MMC block driver sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BlkRequest {
    pub id: u64,
    pub op: BlkOp,
    /// First sector and number of 512-byte sectors.
    pub lba: u64,
    pub sectors: u32,
    /// Forced unit access: the write must be durable on completion (reliable write).
    pub fua: bool,
    /// Physical segments (scatter-gather entries) the request's data spans.
    pub segments: u32,
    /// REQ_SYNC: a process waits for it (reads always; writes with O_SYNC, FUA, fsync).
    /// Buffered writeback is async. CFQ keeps sync and async requests apart.
    pub sync: bool,
    /// The submitting process's I/O context (CFQ gives each one its own sync queue).
    pub ioc: u32,
}

impl BlkRequest {
    /// A request of process 0 whose data lies in 4 KiB pages (one segment each); reads
    /// and FUA writes are sync, other writes async (writeback).
    pub fn new(id: u64, op: BlkOp, lba: u64, sectors: u32) -> BlkRequest {
        BlkRequest {
            id,
            op,
            lba,
            sectors,
            fua: false,
            segments: sectors.div_ceil(8).max(1),
            sync: op == BlkOp::Read || op == BlkOp::Flush,
            ioc: 0,
        }
    }

    /// One past the last sector.
    pub fn end(&self) -> u64 {
        self.lba + u64::from(self.sectors)
    }

    /// Sync in CFQ's sense (`rq_is_sync`): every read, and writes marked sync.
    pub fn is_sync(&self) -> bool {
        self.sync || self.op == BlkOp::Read
    }
}

/// Packing policy, selectable: never pack, pack whenever possible, or pack under write
/// packing control (seed 000).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum PackingMode {
    Off,
    Always,
    /// Pack writes once more than `threshold` writes arrived since the last read.
    Controlled {
        threshold: u32,
    },
}

/// The default `num_wr_reqs_to_start_packing` (seed 000: the most writes seen between two
/// reads under CFQ in a parallel lmdd read/write).
pub const DEFAULT_NUM_WR_REQS_TO_START_PACKING: u32 = 17;

/// Write packing control state (`mmc_queue` fields in the seed 000 patch).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WritePackingControl {
    pub mode: PackingMode,
    pub wr_packing_enabled: bool,
    pub num_of_potential_packed_wr_reqs: u32,
}

impl WritePackingControl {
    pub fn new(mode: PackingMode) -> WritePackingControl {
        WritePackingControl {
            mode,
            wr_packing_enabled: matches!(mode, PackingMode::Always),
            num_of_potential_packed_wr_reqs: 0,
        }
    }

    fn threshold(&self) -> Option<u32> {
        match self.mode {
            PackingMode::Controlled { threshold } => Some(threshold),
            _ => None,
        }
    }

    /// `mmc_blk_write_packing_control()`: called for every request fetched from the queue
    /// (`None` when the queue ran empty). A read resets the count and disables packing; a
    /// write counts; a flush or an empty fetch only re-checks. Packing turns on when the
    /// count is strictly above the threshold.
    pub fn on_fetch(&mut self, req: Option<&BlkRequest>) {
        let Some(threshold) = self.threshold() else {
            self.wr_packing_enabled = self.mode == PackingMode::Always;
            return;
        };
        match req {
            None => {}
            Some(r) if r.op == BlkOp::Flush => {}
            Some(r) if r.op.is_read() => {
                self.num_of_potential_packed_wr_reqs = 0;
                self.wr_packing_enabled = false;
                return;
            }
            Some(r) if r.op.is_write() => self.num_of_potential_packed_wr_reqs += 1,
            Some(_) => {}
        }
        if self.num_of_potential_packed_wr_reqs > threshold {
            self.wr_packing_enabled = true;
        }
    }

    /// Another write joined a packed list (it counts, as in the patch).
    pub fn on_packed_write(&mut self) {
        self.num_of_potential_packed_wr_reqs += 1;
    }
}

/// Why packed-list building stopped (or why a request was not packed at all).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum StopReason {
    /// Packing is off, not enabled by write packing control, or not supported.
    NotEnabled,
    /// The first request is a flush/discard, or a reliable write on a legacy card.
    NotPackable,
    EmptyQueue,
    WrongDirection,
    FlushOrDiscard,
    MaxEntries,
    MaxSectors,
    MaxSegments,
    /// A reliable write, and the card has only legacy reliable write.
    ReliableWrite,
    /// A request not a multiple of 4 KiB on a card with 4 KiB native sectors.
    Misaligned4k,
}

/// What the card and host allow a packed command to hold.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PackLimits {
    /// MAX_PACKED_WRITES (MAX_PACKED_READS for reads); 0 = no packing in that direction.
    pub max_packed_writes: usize,
    pub max_packed_reads: usize,
    /// Largest request in sectors (min of the host's max block count and max request size).
    pub max_sectors: u64,
    /// Largest number of scatter-gather segments.
    pub max_segments: u64,
    /// WR_REL_PARAM.EN_REL_WR: reliable writes may join a pack.
    pub enhanced_reliable_write: bool,
    /// DATA_SECTOR_SIZE = 4 KiB.
    pub native_4k: bool,
}

/// A packed list: the requests, in order, and why building stopped.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PackedList {
    pub requests: Vec<BlkRequest>,
    pub stop: StopReason,
}

/// `mmc_blk_prep_packed_list()`: starting from `first` (already fetched), pull requests
/// with `fetch` while they may join the pack; a request that may not is handed back with
/// `put_back`. A packed command needs at least two requests: with fewer, the list holds
/// only `first`.
pub fn prep_packed_list(
    first: BlkRequest,
    limits: &PackLimits,
    control: &mut WritePackingControl,
    fetch: &mut dyn FnMut() -> Option<BlkRequest>,
    put_back: &mut dyn FnMut(BlkRequest),
) -> PackedList {
    let alone = |stop| PackedList {
        requests: vec![first],
        stop,
    };
    let max_entries = match first.op {
        BlkOp::Write if control.wr_packing_enabled => limits.max_packed_writes,
        BlkOp::Read if control.mode != PackingMode::Off => limits.max_packed_reads,
        BlkOp::Write | BlkOp::Read => 0,
        _ => return alone(StopReason::NotPackable),
    };
    if max_entries < 2 {
        return alone(StopReason::NotEnabled);
    }
    if first.op.is_write() && first.fua && !limits.enhanced_reliable_write {
        return alone(StopReason::NotPackable);
    }
    let mut requests = vec![first];
    let mut sectors = u64::from(first.sectors);
    let mut segments = u64::from(first.segments);
    let stop = loop {
        if requests.len() >= max_entries {
            break StopReason::MaxEntries;
        }
        let Some(next) = fetch() else {
            break StopReason::EmptyQueue;
        };
        let refuse = if limits.native_4k && next.sectors % 8 != 0 {
            Some(StopReason::Misaligned4k)
        } else if next.op.stops_packing() {
            Some(StopReason::FlushOrDiscard)
        } else if next.op != first.op {
            Some(StopReason::WrongDirection)
        } else if next.op.is_write() && next.fua && !limits.enhanced_reliable_write {
            Some(StopReason::ReliableWrite)
        } else if sectors + u64::from(next.sectors) > limits.max_sectors {
            Some(StopReason::MaxSectors)
        } else if segments + u64::from(next.segments) > limits.max_segments {
            Some(StopReason::MaxSegments)
        } else {
            None
        };
        if let Some(reason) = refuse {
            put_back(next);
            break reason;
        }
        sectors += u64::from(next.sectors);
        segments += u64::from(next.segments);
        if next.op.is_write() {
            control.on_packed_write();
        }
        requests.push(next);
    };
    if requests.len() < 2 {
        return alone(stop);
    }
    PackedList { requests, stop }
}

/// Packing statistics like seed 000's: how many commands carried how many requests, and
/// why lists stopped growing.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct PackingStats {
    /// Entries per command → number of commands (1 = sent unpacked).
    pub entries: BTreeMap<usize, u64>,
    pub stop_reasons: BTreeMap<StopReason, u64>,
}

impl PackingStats {
    pub fn record(&mut self, list: &PackedList) {
        *self.entries.entry(list.requests.len()).or_default() += 1;
        *self.stop_reasons.entry(list.stop).or_default() += 1;
    }

    /// Commands that carried more than one request.
    pub fn packed_commands(&self) -> u64 {
        self.entries
            .iter()
            .filter(|(&n, _)| n > 1)
            .map(|(_, &c)| c)
            .sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::VecDeque;

    fn req(id: u64, op: BlkOp, sectors: u32) -> BlkRequest {
        BlkRequest {
            segments: 1,
            ..BlkRequest::new(id, op, id * 1000, sectors)
        }
    }

    fn limits() -> PackLimits {
        PackLimits {
            max_packed_writes: 63,
            max_packed_reads: 63,
            max_sectors: 1024,
            max_segments: 128,
            enhanced_reliable_write: true,
            native_4k: false,
        }
    }

    fn build(
        first: BlkRequest,
        queue: &mut VecDeque<BlkRequest>,
        limits: &PackLimits,
        control: &mut WritePackingControl,
    ) -> PackedList {
        let q = std::cell::RefCell::new(std::mem::take(queue));
        let list = prep_packed_list(
            first,
            limits,
            control,
            &mut || q.borrow_mut().pop_front(),
            &mut |r| q.borrow_mut().push_front(r),
        );
        *queue = q.into_inner();
        list
    }

    #[test]
    fn control_counts_writes_resets_on_read_and_needs_strictly_more_than_the_threshold() {
        let mut c = WritePackingControl::new(PackingMode::Controlled { threshold: 3 });
        let w = req(0, BlkOp::Write, 8);
        let r = req(0, BlkOp::Read, 8);
        let f = req(0, BlkOp::Flush, 0);
        for _ in 0..3 {
            c.on_fetch(Some(&w));
        }
        assert!(!c.wr_packing_enabled, "3 writes is not more than 3");
        c.on_fetch(Some(&f));
        c.on_fetch(None);
        assert_eq!(
            c.num_of_potential_packed_wr_reqs, 3,
            "flush and empty fetch do not count"
        );
        assert!(!c.wr_packing_enabled);
        c.on_fetch(Some(&w));
        assert!(c.wr_packing_enabled);
        c.on_fetch(Some(&r));
        assert!(!c.wr_packing_enabled);
        assert_eq!(c.num_of_potential_packed_wr_reqs, 0);
        // Extra writes pulled into a pack count too.
        for _ in 0..3 {
            c.on_packed_write();
        }
        c.on_fetch(None);
        assert!(!c.wr_packing_enabled);
        c.on_packed_write();
        c.on_fetch(Some(&f));
        assert!(c.wr_packing_enabled, "a flush re-checks the count");
    }

    #[test]
    fn off_never_packs_and_always_always_does() {
        let mut off = WritePackingControl::new(PackingMode::Off);
        let mut always = WritePackingControl::new(PackingMode::Always);
        let mut q: VecDeque<_> = (1..5).map(|i| req(i, BlkOp::Write, 8)).collect();
        off.on_fetch(Some(&req(0, BlkOp::Write, 8)));
        let l = build(req(0, BlkOp::Write, 8), &mut q, &limits(), &mut off);
        assert_eq!((l.requests.len(), l.stop), (1, StopReason::NotEnabled));
        assert_eq!(q.len(), 4, "nothing was taken");
        always.on_fetch(Some(&req(0, BlkOp::Read, 8)));
        assert!(
            always.wr_packing_enabled,
            "a read does not disable unconditional packing"
        );
        let l = build(req(0, BlkOp::Write, 8), &mut q, &limits(), &mut always);
        assert_eq!((l.requests.len(), l.stop), (5, StopReason::EmptyQueue));
    }

    #[test]
    fn every_stop_condition() {
        let mut c = WritePackingControl::new(PackingMode::Always);
        let w = |id| req(id, BlkOp::Write, 8);
        let cases: Vec<(Vec<BlkRequest>, PackLimits, usize, StopReason)> = vec![
            (
                vec![w(1), req(2, BlkOp::Read, 8)],
                limits(),
                2,
                StopReason::WrongDirection,
            ),
            (
                vec![w(1), req(2, BlkOp::Flush, 0)],
                limits(),
                2,
                StopReason::FlushOrDiscard,
            ),
            (
                vec![w(1), req(2, BlkOp::Discard, 8)],
                limits(),
                2,
                StopReason::FlushOrDiscard,
            ),
            (
                vec![w(1), w(2), w(3)],
                PackLimits {
                    max_packed_writes: 3,
                    ..limits()
                },
                3,
                StopReason::MaxEntries,
            ),
            (
                vec![w(1), req(2, BlkOp::Write, 1020)],
                limits(),
                2,
                StopReason::MaxSectors,
            ),
            (
                vec![
                    w(1),
                    BlkRequest {
                        segments: 127,
                        ..w(2)
                    },
                ],
                limits(),
                2,
                StopReason::MaxSegments,
            ),
            (
                vec![w(1), BlkRequest { fua: true, ..w(2) }],
                PackLimits {
                    enhanced_reliable_write: false,
                    ..limits()
                },
                2,
                StopReason::ReliableWrite,
            ),
            (
                vec![w(1), req(2, BlkOp::Write, 3)],
                PackLimits {
                    native_4k: true,
                    ..limits()
                },
                2,
                StopReason::Misaligned4k,
            ),
            (vec![w(1), w(2)], limits(), 3, StopReason::EmptyQueue),
        ];
        for (queue, lim, packed, stop) in cases {
            let mut q: VecDeque<_> = queue.into_iter().collect();
            let before = q.len();
            let l = build(w(0), &mut q, &lim, &mut c);
            assert_eq!(l.stop, stop);
            assert_eq!(l.requests.len(), packed, "{stop:?}");
            assert_eq!(
                q.len(),
                before + 1 - packed,
                "{stop:?}: the refused request went back"
            );
        }
    }

    #[test]
    fn a_single_request_is_not_a_pack_and_flushes_are_never_packed() {
        let mut c = WritePackingControl::new(PackingMode::Always);
        let mut q = VecDeque::from(vec![req(1, BlkOp::Read, 8)]);
        let l = build(req(0, BlkOp::Write, 8), &mut q, &limits(), &mut c);
        assert_eq!(l.requests.len(), 1);
        let l = build(req(0, BlkOp::Flush, 0), &mut q, &limits(), &mut c);
        assert_eq!((l.requests.len(), l.stop), (1, StopReason::NotPackable));
        let legacy = PackLimits {
            enhanced_reliable_write: false,
            ..limits()
        };
        let l = build(
            BlkRequest {
                fua: true,
                ..req(0, BlkOp::Write, 8)
            },
            &mut q,
            &legacy,
            &mut c,
        );
        assert_eq!(
            l.stop,
            StopReason::NotPackable,
            "a legacy reliable write goes alone"
        );
    }

    #[test]
    fn packed_writes_count_toward_control_and_stats_histogram() {
        let mut c = WritePackingControl::new(PackingMode::Controlled { threshold: 0 });
        c.on_fetch(Some(&req(0, BlkOp::Write, 8)));
        assert!(c.wr_packing_enabled);
        let mut q: VecDeque<_> = (1..4).map(|i| req(i, BlkOp::Write, 8)).collect();
        let l = build(req(0, BlkOp::Write, 8), &mut q, &limits(), &mut c);
        assert_eq!(c.num_of_potential_packed_wr_reqs, 4);
        let mut stats = PackingStats::default();
        stats.record(&l);
        stats.record(&PackedList {
            requests: vec![req(9, BlkOp::Read, 8)],
            stop: StopReason::NotEnabled,
        });
        assert_eq!(stats.entries.get(&4), Some(&1));
        assert_eq!(stats.entries.get(&1), Some(&1));
        assert_eq!(stats.stop_reasons.get(&StopReason::EmptyQueue), Some(&1));
        assert_eq!(stats.packed_commands(), 1);
    }
}
