//! [`VirtioMmcHost`]: Linux's `mmc_host_ops` over virtio-mmc. Every MMC request of the
//! core and the block driver becomes one request chain (header, data, response) on the
//! request queue; ios, busy waits, idling and tuning go over the control queue. The
//! host keeps the device's card time from the responses, so the MMC core and
//! [`MmcBlk`](emmc_host::blkdrv::MmcBlk) run in card time exactly as they do
//! over the in-process SDHCI model.

use emmc_card::timing::Nanos;
use emmc_frontend::mmc::proto::*;
use emmc_host::mmc::{HostCaps, MmcHostOps};
use emmc_host::sdhci::{
    adma_err, error_int, normal_int, BusTiming, CommandOutcome, DataDirection, DmaSegment,
    IntStatus, MmcCommand, MmcIos, MmcRequest, PowerMode, SdhciCompletion, SdhciError, TuningError,
};
use vm_memory::ByteValued;

use crate::transport::{Desc, Transport, TransportError, VhostUserTransport};

const HDR_LEN: usize = std::mem::size_of::<VirtioMmcReqHdr>();
const RESP_LEN: usize = std::mem::size_of::<VirtioMmcResp>();
/// Where a request's pieces go in the transport's memory.
const HDR_OFF: usize = 0;
const RESP_OFF: usize = 128;
const DATA_OFF: usize = 4096;

/// The wire form of a command (R4 / R5 travel as R3 / R1, see [`resp_type_code`]).
pub fn encode_cmd(c: &MmcCommand) -> VirtioMmcCmd {
    VirtioMmcCmd {
        opcode: c.opcode,
        resp_type: resp_type_code(c.resp_type),
        flags: if c.busy { CMD_F_BUSY } else { 0 },
        reserved: 0,
        arg: c.arg,
        busy_timeout_ms: c.busy_timeout_ms,
        reserved2: 0,
    }
}

/// A controller error code of the wire as [`SdhciError`]; a code the protocol does not
/// define is taken as a data CRC error (the request failed, the core retries).
fn wire_error(code: u8, adma_err: u8) -> Option<SdhciError> {
    decode_error(code, adma_err).unwrap_or_else(|other| {
        log::warn!("virtio-mmc: unknown controller error code {other}");
        Some(SdhciError::DataCrc)
    })
}

fn decode_cmd(r: &VirtioMmcCmdResp, adma_err: u8) -> CommandOutcome {
    CommandOutcome {
        opcode: r.opcode,
        issued: r.flags & RESP_F_ISSUED != 0,
        auto: r.flags & RESP_F_AUTO != 0,
        resp: r.resp,
        error: wire_error(r.error, adma_err),
    }
}

/// A response as the [`SdhciCompletion`] the MMC core reads; `sbc` and `stop` are
/// present when the request had them.
pub fn decode_completion(resp: &VirtioMmcResp, sbc: bool, stop: bool) -> SdhciCompletion {
    SdhciCompletion {
        sbc: sbc.then(|| decode_cmd(&resp.sbc, resp.adma_err)),
        cmd: decode_cmd(&resp.cmd, resp.adma_err),
        stop: stop.then(|| decode_cmd(&resp.stop, resp.adma_err)),
        data_error: wire_error(resp.data_error, resp.adma_err),
        bytes_xfered: resp.bytes_xfered,
        int_status: IntStatus {
            normal: resp.int_status as u16,
            error: (resp.int_status >> 16) as u16,
        },
        auto_cmd_err: resp.auto_cmd_err,
        adma_err: resp.adma_err,
        start_ns: resp.start_ns,
        end_ns: resp.end_ns,
        busy_pending: resp.flags & RESP_F_BUSY_PENDING != 0,
    }
}

/// Data of a raw request.
#[derive(Debug, Clone, Copy)]
pub enum RawData<'a> {
    None,
    /// These bytes go to the card, in one buffer per slice.
    Write(&'a [&'a [u8]]),
    /// Buffers of these lengths receive the card's data.
    Read(&'a [usize]),
}

/// What a raw request brought back.
#[derive(Debug, Clone)]
pub struct RawResponse {
    pub resp: VirtioMmcResp,
    /// The used length the device reported.
    pub used_len: u32,
    /// Read data, one vector per buffer (empty for writes).
    pub data: Vec<Vec<u8>>,
}

impl RawResponse {
    /// The command's R1 (`resp.cmd.resp[0]`).
    pub fn r1(&self) -> u32 {
        self.resp.cmd.resp[0]
    }

    /// The read data in one piece.
    pub fn bytes(&self) -> Vec<u8> {
        self.data.concat()
    }
}

/// One descriptor of a hand-made chain ([`VirtioMmcHost::raw_chain`]).
#[derive(Debug, Clone)]
pub enum RawDesc {
    /// Device-readable bytes.
    Readable(Vec<u8>),
    /// A device-writable buffer of this length (filled with 0xA5 before it is sent).
    Writable(u32),
}

/// What the device did with a hand-made chain.
#[derive(Debug, Clone)]
pub struct RawChainOutcome {
    pub used_len: u32,
    /// The writable buffers' contents after use, in chain order.
    pub writable: Vec<Vec<u8>>,
}

/// Fill byte of writable buffers before a chain goes out (so a buffer the device did not
/// touch is recognisable).
pub const UNTOUCHED: u8 = 0xA5;

/// Counters of what went over the transport.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct HostStats {
    pub requests: u64,
    pub control: u64,
    /// Requests the device refused as malformed or unsupported (`status` ≠ OK).
    pub refused: u64,
}

/// An MMC host whose controller is a virtio-mmc device.
pub struct VirtioMmcHost<T: Transport = VhostUserTransport> {
    t: T,
    cfg: VirtioMmcConfig,
    now: Nanos,
    busy_until: Nanos,
    ios: MmcIos,
    /// The first transport failure; afterwards nothing is sent and every request fails.
    error: Option<TransportError>,
    last: Option<VirtioMmcResp>,
    events: Vec<VirtioMmcEvent>,
    stats: HostStats,
}

impl VirtioMmcHost<VhostUserTransport> {
    /// Attach to the daemon's socket with default options.
    pub fn connect(path: &str) -> Result<Self, TransportError> {
        VirtioMmcHost::new(VhostUserTransport::connect(path)?)
    }
}

impl<T: Transport> VirtioMmcHost<T> {
    /// A host over `t`: reads the device's card time and bus settings.
    pub fn new(t: T) -> Result<Self, TransportError> {
        let cfg = t.config();
        let mut h = VirtioMmcHost {
            t,
            cfg,
            now: 0,
            busy_until: 0,
            ios: MmcIos {
                clock: 0,
                bus_width: 1,
                timing: BusTiming::Legacy,
                power_mode: PowerMode::Off,
            },
            error: None,
            last: None,
            events: Vec::new(),
            stats: HostStats::default(),
        };
        let r = h.control(CTRL_GET_IOS, 0, 0)?;
        h.ios = decode_ios(r.val0, r.val1)
            .map_err(|e| TransportError::Protocol(format!("GET_IOS: {e}")))?;
        Ok(h)
    }

    pub fn config(&self) -> &VirtioMmcConfig {
        &self.cfg
    }

    pub fn transport(&self) -> &T {
        &self.t
    }

    pub fn transport_mut(&mut self) -> &mut T {
        &mut self.t
    }

    /// Give the transport back (e.g. to drive it directly after bring-up).
    pub fn into_transport(self) -> T {
        self.t
    }

    pub fn stats(&self) -> HostStats {
        self.stats
    }

    /// The transport failure that stopped this host, if any. The MMC core sees it as
    /// commands that time out; callers check here to tell the two apart.
    pub fn error(&self) -> Option<&TransportError> {
        self.error.as_ref()
    }

    /// `Err` once the transport has failed.
    pub fn check(&self) -> Result<(), TransportError> {
        match &self.error {
            Some(e) => Err(e.clone()),
            None => Ok(()),
        }
    }

    /// The last response of the request queue.
    pub fn last_response(&self) -> Option<&VirtioMmcResp> {
        self.last.as_ref()
    }

    /// What bring-up may use: the device's capability bits, clock and the card features
    /// the host enables (as [`HostCaps::default`]).
    pub fn host_caps(&self) -> HostCaps {
        let caps = self.cfg.caps;
        HostCaps {
            bus_width: if caps & CAP_8_BIT_DATA != 0 {
                8
            } else if caps & CAP_4_BIT_DATA != 0 {
                4
            } else {
                1
            },
            high_speed: caps & CAP_MMC_HIGHSPEED != 0,
            ddr: caps & CAP_1_8V_DDR != 0,
            hs200: caps & CAP2_HS200 != 0,
            cache: caps & CAP2_CACHE != 0,
            hpi: caps & CAP2_HPI != 0,
            bkops: caps & CAP2_BKOPS != 0,
            packed_event: caps & CAP2_PACKED_WR != 0,
            max_clock_hz: u64::from(self.cfg.f_max),
        }
    }

    fn fail(&mut self, e: TransportError) -> TransportError {
        if self.error.is_none() {
            log::error!("virtio-mmc: {e}");
            self.error = Some(e.clone());
        }
        e
    }

    fn note_time(&mut self, now: Nanos, busy_until: Nanos) {
        self.now = self.now.max(now);
        self.busy_until = busy_until;
    }

    /// One control request; card time and busy follow its result. A transport failure
    /// stops the host.
    pub fn control(
        &mut self,
        kind: u32,
        arg0: u64,
        arg1: u64,
    ) -> Result<VirtioMmcCtrlResp, TransportError> {
        self.check()?;
        let req = VirtioMmcCtrlReq {
            kind,
            reserved: 0,
            arg0,
            arg1,
        };
        self.stats.control += 1;
        let r = self.t.control(&req).map_err(|e| self.fail(e))?;
        self.note_time(r.now_ns, r.busy_until_ns);
        Ok(r)
    }

    /// Events the device sent (EXCEPTION, BKOPS_NEEDED) since the last call.
    pub fn take_events(&mut self) -> Result<Vec<VirtioMmcEvent>, TransportError> {
        self.check()?;
        let mut ev = std::mem::take(&mut self.events);
        ev.extend(self.t.take_events().map_err(|e| self.fail(e))?);
        Ok(ev)
    }

    /// Send one request: `hdr` followed by the data buffers of `data`, then a response
    /// buffer. Card time follows the response.
    pub fn raw_request(
        &mut self,
        hdr: &VirtioMmcReqHdr,
        data: RawData<'_>,
    ) -> Result<RawResponse, TransportError> {
        self.check()?;
        let mut chain = vec![Desc::readable(HDR_OFF, HDR_LEN as u32)];
        let mut reads = Vec::new();
        {
            let mem = self.t.mem();
            mem[HDR_OFF..HDR_OFF + HDR_LEN].copy_from_slice(hdr.as_slice());
            let mut off = DATA_OFF;
            match data {
                RawData::None => {}
                RawData::Write(bufs) => {
                    for b in bufs {
                        check_room(mem.len(), off, b.len())?;
                        mem[off..off + b.len()].copy_from_slice(b);
                        chain.push(Desc::readable(off, b.len() as u32));
                        off = (off + b.len()).next_multiple_of(8);
                    }
                }
                RawData::Read(lens) => {
                    for &n in lens {
                        check_room(mem.len(), off, n)?;
                        mem[off..off + n].fill(UNTOUCHED);
                        chain.push(Desc::writable(off, n as u32));
                        reads.push((off, n));
                        off = (off + n).next_multiple_of(8);
                    }
                }
            }
            mem[RESP_OFF..RESP_OFF + RESP_LEN].fill(0);
        }
        chain.push(Desc::writable(RESP_OFF, RESP_LEN as u32));
        self.stats.requests += 1;
        let used_len = self
            .t
            .run(REQUEST_QUEUE, &chain)
            .map_err(|e| self.fail(e))?;
        let mem = self.t.mem_ref();
        let mut resp = VirtioMmcResp::default();
        resp.as_mut_slice()
            .copy_from_slice(&mem[RESP_OFF..RESP_OFF + RESP_LEN]);
        let data = reads.iter().map(|&(o, n)| mem[o..o + n].to_vec()).collect();
        if resp.status == STATUS_OK {
            self.note_time(resp.end_ns, resp.busy_until_ns);
        } else {
            self.stats.refused += 1;
        }
        self.last = Some(resp);
        Ok(RawResponse {
            resp,
            used_len,
            data,
        })
    }

    /// Send a hand-made chain on `queue` (e.g. a malformed request) and see what the
    /// device wrote. Card time does not follow it.
    pub fn raw_chain(
        &mut self,
        queue: usize,
        descs: &[RawDesc],
    ) -> Result<RawChainOutcome, TransportError> {
        self.check()?;
        let mut chain = Vec::new();
        let mut outs = Vec::new();
        {
            let mem = self.t.mem();
            let mut off = 0;
            for d in descs {
                match d {
                    RawDesc::Readable(b) => {
                        check_room(mem.len(), off, b.len())?;
                        mem[off..off + b.len()].copy_from_slice(b);
                        chain.push(Desc::readable(off, b.len() as u32));
                        off = (off + b.len()).next_multiple_of(64);
                    }
                    RawDesc::Writable(n) => {
                        let n = *n as usize;
                        check_room(mem.len(), off, n)?;
                        mem[off..off + n].fill(UNTOUCHED);
                        chain.push(Desc::writable(off, n as u32));
                        outs.push((off, n));
                        off = (off + n).next_multiple_of(64);
                    }
                }
            }
        }
        let used_len = self.t.run(queue, &chain).map_err(|e| self.fail(e))?;
        let mem = self.t.mem_ref();
        Ok(RawChainOutcome {
            used_len,
            writable: outs.iter().map(|&(o, n)| mem[o..o + n].to_vec()).collect(),
        })
    }

    /// Run an `MmcRequest` over the transport.
    fn send<S: DmaSegment>(
        &mut self,
        mrq: MmcRequest<'_, S>,
        start_only: bool,
    ) -> Result<SdhciCompletion, TransportError> {
        self.check()?;
        let mut hdr = VirtioMmcReqHdr {
            flags: if start_only { REQ_F_START_ONLY } else { 0 },
            cmd: encode_cmd(&mrq.cmd),
            ..Default::default()
        };
        if let Some(sbc) = &mrq.sbc {
            hdr.flags |= REQ_F_SBC;
            hdr.sbc = encode_cmd(sbc);
        }
        if let Some(stop) = &mrq.stop {
            hdr.flags |= REQ_F_STOP;
            hdr.stop = encode_cmd(stop);
        }
        let mut chain = vec![Desc::readable(HDR_OFF, HDR_LEN as u32)];
        // (offset in mem, segment index, offset in segment, length) of read pieces.
        let mut reads = Vec::new();
        let max_seg = (self.cfg.max_seg_size as usize).max(512);
        let mut data = mrq.data;
        // Write data that could not be read out of its segment: (segment, offset).
        let mut unreadable = None;
        'layout: {
            let mem = self.t.mem();
            if let Some(d) = &data {
                hdr.flags |= REQ_F_DATA;
                if d.direction == DataDirection::Write {
                    hdr.flags |= REQ_F_WRITE;
                }
                hdr.blksz = d.blksz;
                hdr.blocks = d.blocks;
                hdr.timeout_ns = d.timeout_ns;
                hdr.timeout_clks = d.timeout_clks;
                let mut off = DATA_OFF;
                // One buffer per segment, cut at the device's largest segment (as the
                // DMA mapping honours the host's max_seg_size).
                for (i, seg) in d.sg.iter().enumerate() {
                    let mut at = 0;
                    while at < seg.len() {
                        let n = (seg.len() - at).min(max_seg);
                        check_room(mem.len(), off, n)?;
                        if d.direction == DataDirection::Write {
                            if !seg.read_at(at, &mut mem[off..off + n]) {
                                unreadable = Some((i, at));
                                break 'layout;
                            }
                            chain.push(Desc::readable(off, n as u32));
                        } else {
                            chain.push(Desc::writable(off, n as u32));
                            reads.push((off, i, at, n));
                        }
                        at += n;
                        off += n;
                    }
                }
            }
            mem[HDR_OFF..HDR_OFF + HDR_LEN].copy_from_slice(hdr.as_slice());
        }
        if let Some((seg, at)) = unreadable {
            // As the SDHCI controller's DMA read failing: an ADMA error, and (since the
            // data must be in hand before the request goes out) nothing reaches the card.
            log::debug!(
                "virtio-mmc: CMD{}: segment {seg} unreadable at {at}, not sent",
                mrq.cmd.opcode
            );
            let mut done = self.not_issued(&mrq.cmd, mrq.sbc.is_some(), mrq.stop.is_some(), None);
            done.data_error = Some(SdhciError::Adma(adma_err::ST_TFR));
            done.adma_err = adma_err::ST_TFR;
            done.int_status = IntStatus {
                normal: normal_int::ERROR_INT,
                error: error_int::ADMA_ERR,
            };
            return Ok(done);
        }
        chain.push(Desc::writable(RESP_OFF, RESP_LEN as u32));
        self.stats.requests += 1;
        self.t.run(REQUEST_QUEUE, &chain)?;
        let mem = self.t.mem_ref();
        let mut resp = VirtioMmcResp::default();
        resp.as_mut_slice()
            .copy_from_slice(&mem[RESP_OFF..RESP_OFF + RESP_LEN]);
        self.last = Some(resp);
        if resp.status != STATUS_OK {
            // Nothing reached the card: as a command that was never issued.
            self.stats.refused += 1;
            log::warn!(
                "virtio-mmc: the device refused CMD{} (status {})",
                mrq.cmd.opcode,
                resp.status
            );
            return Ok(self.not_issued(&mrq.cmd, mrq.sbc.is_some(), mrq.stop.is_some(), None));
        }
        if let Some(d) = data.as_mut() {
            if resp.data_error == ERR_NONE {
                for &(off, i, at, n) in &reads {
                    d.sg[i].write_at(at, &mem[off..off + n]);
                }
            }
        }
        self.note_time(resp.end_ns, resp.busy_until_ns);
        Ok(decode_completion(
            &resp,
            mrq.sbc.is_some(),
            mrq.stop.is_some(),
        ))
    }

    /// A completion for a request that never reached the card.
    fn not_issued(
        &self,
        cmd: &MmcCommand,
        sbc: bool,
        stop: bool,
        error: Option<SdhciError>,
    ) -> SdhciCompletion {
        let pending = |opcode| CommandOutcome {
            opcode,
            issued: false,
            auto: false,
            resp: [0; 4],
            error: None,
        };
        SdhciCompletion {
            sbc: sbc.then(|| pending(23)),
            cmd: CommandOutcome {
                error,
                ..pending(cmd.opcode)
            },
            stop: stop.then(|| pending(12)),
            data_error: None,
            bytes_xfered: 0,
            int_status: IntStatus::default(),
            auto_cmd_err: 0,
            adma_err: 0,
            start_ns: self.now,
            end_ns: self.now,
            busy_pending: false,
        }
    }

    fn run_mrq<S: DmaSegment>(
        &mut self,
        mrq: MmcRequest<'_, S>,
        start_only: bool,
    ) -> SdhciCompletion {
        let (cmd, sbc, stop) = (mrq.cmd, mrq.sbc.is_some(), mrq.stop.is_some());
        match self.send(mrq, start_only) {
            Ok(c) => c,
            Err(e) => {
                self.fail(e);
                // The MMC core sees a card that stopped answering.
                self.not_issued(&cmd, sbc, stop, Some(SdhciError::CmdTimeout))
            }
        }
    }
}

fn check_room(size: usize, off: usize, n: usize) -> Result<(), TransportError> {
    if off.checked_add(n).is_none_or(|end| end > size) {
        return Err(TransportError::OutOfBounds {
            offset: off,
            len: n as u32,
            size,
        });
    }
    Ok(())
}

impl<T: Transport> MmcHostOps for VirtioMmcHost<T> {
    fn now(&self) -> Nanos {
        self.now
    }

    fn idle_until(&mut self, t: Nanos) {
        if t <= self.now {
            return;
        }
        if self.control(CTRL_IDLE_UNTIL, t, 0).is_err() {
            // The device is gone: let time pass here so callers' loops end.
            self.now = t;
        }
    }

    fn request<S: DmaSegment>(&mut self, mrq: MmcRequest<'_, S>) -> SdhciCompletion {
        self.run_mrq(mrq, false)
    }

    fn start_request<S: DmaSegment>(&mut self, mrq: MmcRequest<'_, S>) -> SdhciCompletion {
        self.run_mrq(mrq, true)
    }

    fn wait_busy_until(&mut self, deadline: Option<Nanos>) -> bool {
        if self.busy_until <= self.now {
            // Every response and control result says when busy ends: known to be over,
            // no round trip needed.
            return true;
        }
        match self.control(CTRL_WAIT_BUSY, deadline.unwrap_or(u64::MAX), 0) {
            Ok(r) => r.val0 == 1,
            Err(_) => {
                if let Some(d) = deadline {
                    self.now = self.now.max(d);
                }
                true
            }
        }
    }

    fn busy_until(&self) -> Option<Nanos> {
        (self.busy_until > self.now).then_some(self.busy_until)
    }

    fn set_ios(&mut self, ios: MmcIos) {
        let (clock, bits) = encode_ios(&ios);
        if self.control(CTRL_SET_IOS, clock, bits).is_ok() {
            self.ios = ios;
        }
    }

    fn ios(&self) -> MmcIos {
        self.ios
    }

    fn execute_tuning(&mut self) -> Result<u32, TuningError> {
        match self.control(CTRL_EXECUTE_TUNING, 0, 0) {
            Ok(r) if r.status == STATUS_OK => Ok(r.val0 as u32),
            Ok(r) => Err(TuningError::Failed {
                tries: r.val0 as u32,
            }),
            Err(_) => Err(TuningError::Failed { tries: 0 }),
        }
    }

    fn max_busy_timeout_ms(&self) -> u32 {
        self.cfg.max_busy_timeout_ms
    }
}
