//! The device behind the virtio-mmc queues: one SDHCI host ([`MmcHost`]) owning the card,
//! executing checked requests and control requests one at a time, in card time.
//!
//! A request becomes an [`MmcRequest`] whose data segments are guest memory
//! ([`GuestDma`]), run by `MmcHostOps::request` (or `start_request` with START_ONLY), and
//! its [`SdhciCompletion`] becomes the wire response. Control requests map onto the rest
//! of `mmc_host_ops`: `set_ios`, `card_busy`, `execute_tuning`, and the host's clock. The
//! backend decides when each starts (its arrival in card time) and when its completion is
//! signalled; this module knows nothing of virtqueues or wall time.

use vm_memory::GuestMemory;

use super::proto::*;
use super::request::{GuestDma, Limits, MmcReq};
use emmc_card::ext_csd as ext;
use emmc_card::model::DeviceModel;
use emmc_card::timing::Nanos;
use emmc_card::{r1, Card, PowerDown};
use emmc_host::mmc::{HostCaps, MmcHost, MmcHostOps};
use emmc_host::sdhci::{
    CommandOutcome, DataDirection, MmcCommand, MmcData, MmcRequest, PowerMode, ResponseType,
    SdClock, SdhciCompletion, SdhciConfig, SdhciHost, MAX_BLOCK_COUNT,
};

/// The farthest ahead of the card's time `IDLE_UNTIL` may ask for (one hour): a guest may
/// idle its card, not throw its clock to the end of time.
pub const MAX_IDLE_NS: Nanos = 3_600 * 1_000_000_000;
/// Card time the device refuses to go beyond (about 146 years): no single request or
/// idle can then take the card's clock near the end of `u64`, whatever a guest asks for
/// (a request costs at most minutes of card time at `f_min`, an idle at most
/// [`MAX_IDLE_NS`]).
pub const CARD_TIME_LIMIT: Nanos = 1 << 62;
/// Lowest clock offered when the controller makes any clock exactly (the lowest
/// identification frequency Linux's core tries).
const F_MIN_EXACT_HZ: u32 = 100_000;
/// The voltage windows Linux's SDHCI hosts offer an eMMC: 1.70–1.95 V and 2.7–3.6 V.
pub const OCR_AVAIL: u32 = 0x00FF_8080;

/// One request executed: the response, how many data bytes went into guest memory, and
/// the events it raised.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Executed {
    pub resp: VirtioMmcResp,
    /// Read data written into the guest's buffers.
    pub data_len: u32,
    /// Card time at which the request completed (or its busy began).
    pub done_at: Nanos,
    pub events: Vec<VirtioMmcEvent>,
}

/// The emulated SDHCI host and its card.
pub struct MmcDevice {
    host: MmcHost,
    sdhci_config: SdhciConfig,
    config: VirtioMmcConfig,
    /// Host bus width (the most data lines `SET_IOS` may ask for).
    bus_width: u8,
    /// EXCEPTION_EVENTS_STATUS reported by the last EXCEPTION event, while responses keep
    /// carrying EXCEPTION_EVENT (one event per rising edge or change, not one per R1).
    exception: Option<u16>,
    /// BKOPS_STATUS after the last request.
    bkops_level: u8,
}

/// The configuration space for a model's host and the controller model.
pub fn config_for(
    model: &DeviceModel,
    sdhci: &SdhciConfig,
    max_busy_timeout_ms: u32,
) -> VirtioMmcConfig {
    let caps = HostCaps::for_model(&model.host);
    let mut bits = CAP_CMD23
        | CAP_ERASE
        | CAP2_HPI
        | CAP2_BKOPS
        | CAP2_CACHE
        | CAP2_PACKED_WR
        | CAP2_PACKED_RD
        | CAP_NONREMOVABLE
        | CAP_WAIT_WHILE_BUSY;
    if caps.bus_width >= 4 {
        bits |= CAP_4_BIT_DATA;
    }
    if caps.bus_width >= 8 {
        bits |= CAP_8_BIT_DATA;
    }
    if caps.high_speed {
        bits |= CAP_MMC_HIGHSPEED;
    }
    if caps.ddr {
        bits |= CAP_1_8V_DDR;
    }
    if caps.hs200 {
        bits |= CAP2_HS200;
    }
    if sdhci.auto_cmd12 {
        bits |= CAP_AUTO_CMD12;
    }
    if sdhci.auto_cmd23 {
        bits |= CAP_AUTO_CMD23;
    }
    // Linux's sdhci with ADMA2: two descriptors per segment at worst (an unaligned head
    // through the bounce buffer, then the rest), plus the terminator.
    let max_segs = u32::try_from((sdhci.adma.table_len.saturating_sub(1)) / 2)
        .unwrap_or(u32::MAX)
        .min(model.host.max_segments)
        .max(1);
    let max_seg_size = sdhci.adma.max_len.clamp(512, 65_536);
    let max_req_size = u64::from(model.host.max_hw_sectors_kb)
        .saturating_mul(1024)
        .clamp(512, u64::from(max_segs) * u64::from(max_seg_size))
        .min(u64::from(u32::MAX)) as u32;
    let f_min = match sdhci.sd_clock {
        SdClock::Exact => F_MIN_EXACT_HZ,
        SdClock::Divided { base_hz } => u32::try_from(base_hz / 2046).unwrap_or(u32::MAX),
    };
    VirtioMmcConfig {
        caps: bits,
        max_seg_size,
        max_segs,
        max_blk_size: sdhci.max_block_len,
        max_blk_count: MAX_BLOCK_COUNT,
        max_req_size,
        max_busy_timeout_ms,
        f_min,
        f_max: u32::try_from(caps.max_clock_hz).unwrap_or(u32::MAX),
        ocr_avail: OCR_AVAIL,
        reserved: 0,
    }
}

/// A command of a checked header (its response type is one the protocol defines). R1b
/// waits for busy whether or not `CMD_F_BUSY` is set; the flag adds the wait to any other
/// response type.
fn command(c: &VirtioMmcCmd) -> MmcCommand {
    let resp_type = response_type(c.resp_type).unwrap_or(ResponseType::None);
    MmcCommand {
        opcode: c.opcode,
        arg: c.arg,
        resp_type,
        busy: resp_type == ResponseType::R1b || c.flags & CMD_F_BUSY != 0,
        busy_timeout_ms: c.busy_timeout_ms,
    }
}

fn cmd_resp(o: &CommandOutcome) -> VirtioMmcCmdResp {
    let mut flags = 0;
    if o.issued {
        flags |= RESP_F_ISSUED;
    }
    if o.auto {
        flags |= RESP_F_AUTO;
    }
    VirtioMmcCmdResp {
        opcode: o.opcode,
        flags,
        error: error_code(o.error),
        reserved: 0,
        resp: o.resp,
    }
}

/// A command of the header the controller never got to.
fn not_issued(c: &VirtioMmcCmd) -> VirtioMmcCmdResp {
    VirtioMmcCmdResp {
        opcode: c.opcode,
        ..Default::default()
    }
}

impl MmcDevice {
    /// The card behind an SDHCI controller configured for `model`'s host. The card is as
    /// the image left it (powered, in idle): the guest's driver brings it up.
    pub fn new(card: Card, model: &DeviceModel) -> MmcDevice {
        // The guest's driver is the host: its software time is real, so the controller
        // charges only the bus and the card (docs/device-models.md, "Host profiles").
        let sdhci_config = SdhciConfig::for_model(&model.host.controller_only());
        let host = MmcHost::with_config(card, sdhci_config.clone());
        let config = config_for(model, &sdhci_config, host.max_busy_timeout_ms());
        MmcDevice {
            host,
            sdhci_config,
            config,
            bus_width: HostCaps::for_model(&model.host).bus_width,
            exception: None,
            bkops_level: 0,
        }
    }

    pub fn config(&self) -> VirtioMmcConfig {
        self.config
    }

    /// Install a fault injector on the controller (`None` removes it).
    pub fn set_fault_injector(&mut self, faults: Option<emmc_host::fault::FaultInjector>) {
        self.host.sdhci.set_fault_injector(faults);
    }

    /// The controller's fault injector, to change its rules at run time.
    pub fn fault_injector_mut(&mut self) -> Option<&mut emmc_host::fault::FaultInjector> {
        self.host.sdhci.fault_injector_mut()
    }

    pub fn limits(&self) -> Limits {
        Limits::from_config(&self.config)
    }

    /// Card time now.
    pub fn now(&self) -> Nanos {
        self.host.now()
    }

    pub fn card(&self) -> &Card {
        &self.host.card
    }

    pub fn host(&self) -> &MmcHost {
        &self.host
    }

    pub fn host_mut(&mut self) -> &mut MmcHost {
        &mut self.host
    }

    /// The request starts at `arrival` or when the one before ended, whichever is later.
    fn start_at(&mut self, arrival: Nanos) {
        if arrival > self.host.now() {
            self.host.idle_until(arrival);
        }
    }

    /// Execute one checked request arriving at card time `arrival`; its data moves
    /// between the card and `mem`.
    pub fn request<M: GuestMemory + ?Sized>(
        &mut self,
        mem: &M,
        req: &MmcReq,
        arrival: Nanos,
    ) -> Executed {
        if arrival.max(self.host.now()) >= CARD_TIME_LIMIT {
            log::warn!(
                "CMD{}: card time {} ns is at the device's limit; refused",
                req.hdr.cmd.opcode,
                arrival.max(self.host.now())
            );
            return Executed {
                resp: VirtioMmcResp {
                    status: STATUS_IOERR,
                    ..Default::default()
                },
                data_len: 0,
                done_at: self.host.now(),
                events: Vec::new(),
            };
        }
        self.start_at(arrival);
        let h = &req.hdr;
        let sbc = req.has(REQ_F_SBC).then(|| command(&h.sbc));
        let stop = req.has(REQ_F_STOP).then(|| command(&h.stop));
        let cmd = command(&h.cmd);
        let mut sg: Vec<GuestDma<'_, M>> =
            req.data.iter().map(|&seg| GuestDma { mem, seg }).collect();
        let write = req.has(REQ_F_WRITE);
        let data = req.has(REQ_F_DATA).then(|| MmcData {
            blksz: h.blksz,
            blocks: h.blocks,
            direction: if write {
                DataDirection::Write
            } else {
                DataDirection::Read
            },
            sg: &mut sg[..],
            timeout_ns: h.timeout_ns,
            timeout_clks: h.timeout_clks,
        });
        let mrq = MmcRequest {
            sbc,
            cmd,
            data,
            stop,
        };
        let done = if req.has(REQ_F_START_ONLY) {
            self.host.start_request(mrq)
        } else {
            self.host.request(mrq)
        };
        drop(sg);
        let resp = self.response(req, &done);
        let data_len = if req.has(REQ_F_DATA) && !write {
            u32::try_from(done.bytes_xfered).unwrap_or(0)
        } else {
            0
        };
        let events = self.events(req, &done);
        log::debug!(
            "CMD{} arg {:#010x}: resp {:#010x}, error {:?}, {} bytes, {}..{} ns",
            h.cmd.opcode,
            h.cmd.arg,
            done.cmd.resp[0],
            done.error(),
            done.bytes_xfered,
            done.start_ns,
            done.end_ns
        );
        Executed {
            resp,
            data_len,
            done_at: done.end_ns,
            events,
        }
    }

    fn response(&self, req: &MmcReq, done: &SdhciCompletion) -> VirtioMmcResp {
        let h = &req.hdr;
        let or_header = |o: &Option<CommandOutcome>, c: &VirtioMmcCmd| match o {
            Some(o) => cmd_resp(o),
            None => not_issued(c),
        };
        let mut flags = 0;
        if done.busy_pending {
            flags |= RESP_F_BUSY_PENDING;
        }
        VirtioMmcResp {
            status: STATUS_OK,
            flags,
            sbc: or_header(&done.sbc, &h.sbc),
            cmd: cmd_resp(&done.cmd),
            stop: or_header(&done.stop, &h.stop),
            data_error: error_code(done.data_error),
            adma_err: done.adma_err,
            auto_cmd_err: done.auto_cmd_err,
            int_status: done.int_status.linux_mask(),
            reserved: 0,
            bytes_xfered: done.bytes_xfered,
            start_ns: done.start_ns,
            end_ns: done.end_ns,
            busy_until_ns: self.host.busy_until().unwrap_or(0),
        }
    }

    /// EXCEPTION when an R1 of the request carried EXCEPTION_EVENT (once per rising edge
    /// or change of EXCEPTION_EVENTS_STATUS); BKOPS_NEEDED when BKOPS_STATUS reached 2.
    fn events(&mut self, req: &MmcReq, done: &SdhciCompletion) -> Vec<VirtioMmcEvent> {
        let r1_of = |o: &Option<CommandOutcome>, resp_type: u8| {
            o.filter(|o| o.ok() && (o.auto || matches!(resp_type, RESP_R1 | RESP_R1B)))
                .map(|o| o.resp[0])
        };
        let h = &req.hdr;
        let r1s = [
            r1_of(&done.sbc, h.sbc.resp_type),
            r1_of(&Some(done.cmd), h.cmd.resp_type),
            r1_of(&done.stop, h.stop.resp_type),
        ];
        let mut events = Vec::new();
        let at_ns = done.end_ns;
        let saw_r1 = r1s.iter().any(Option::is_some);
        let raised = r1s.iter().flatten().any(|s| s & r1::EXCEPTION_EVENT != 0);
        let e = self.host.card.ext_csd();
        if raised {
            let status = ext::read_le(&e, ext::EXCEPTION_EVENTS_STATUS, 2) as u16;
            if self.exception != Some(status) {
                events.push(VirtioMmcEvent {
                    kind: EVENT_EXCEPTION,
                    val: u32::from(status),
                    at_ns,
                    reserved: 0,
                });
            }
            self.exception = Some(status);
        } else if saw_r1 {
            self.exception = None;
        }
        let level = e[ext::BKOPS_STATUS] & 0x03;
        if level >= 2 && self.bkops_level < 2 {
            events.push(VirtioMmcEvent {
                kind: EVENT_BKOPS_NEEDED,
                val: u32::from(level),
                at_ns,
                reserved: 0,
            });
        }
        self.bkops_level = level;
        events
    }

    /// Execute one control request arriving at card time `arrival`; the result's `now_ns`
    /// is the card time at which it completes.
    pub fn control(&mut self, req: &VirtioMmcCtrlReq, arrival: Nanos) -> VirtioMmcCtrlResp {
        self.start_at(arrival.min(CARD_TIME_LIMIT));
        let mut out = VirtioMmcCtrlResp::default();
        let refuse = |what: String| {
            log::warn!("control: {what}");
            STATUS_IOERR
        };
        out.status = match req.kind {
            CTRL_GET_TIME => STATUS_OK,
            CTRL_SET_IOS => match decode_ios(req.arg0, req.arg1) {
                Err(e) => refuse(format!("SET_IOS: {e}")),
                Ok(ios) if ios.clock > u64::from(self.config.f_max) => refuse(format!(
                    "SET_IOS: clock {} Hz above f_max {}",
                    ios.clock, self.config.f_max
                )),
                Ok(ios) if ios.clock != 0 && ios.clock < u64::from(self.config.f_min) => {
                    refuse(format!(
                        "SET_IOS: clock {} Hz below f_min {}",
                        ios.clock, self.config.f_min
                    ))
                }
                Ok(ios) if ios.bus_width > self.bus_width => refuse(format!(
                    "SET_IOS: {} data lines on a {}-bit host",
                    ios.bus_width, self.bus_width
                )),
                Ok(ios) => {
                    if ios.power_mode == PowerMode::Off
                        && self.host.ios().power_mode != PowerMode::Off
                    {
                        log::info!("SET_IOS: power off, a power cut for the card");
                    }
                    self.host.set_ios(ios);
                    STATUS_OK
                }
            },
            CTRL_GET_IOS => {
                let ios = self.host.ios();
                (out.val0, out.val1) = encode_ios(&ios);
                STATUS_OK
            }
            CTRL_GET_CD_RO => {
                // An eMMC is soldered down: always present, no write-protect switch.
                out.val0 = CD_PRESENT;
                STATUS_OK
            }
            CTRL_CARD_BUSY => {
                out.val0 = u64::from(self.host.busy_until().is_some());
                STATUS_OK
            }
            CTRL_WAIT_BUSY => {
                let deadline = (req.arg0 != u64::MAX).then_some(req.arg0);
                out.val0 = u64::from(self.host.wait_busy_until(deadline));
                STATUS_OK
            }
            CTRL_IDLE_UNTIL => {
                let now = self.host.now();
                if req.arg0 >= CARD_TIME_LIMIT {
                    refuse(format!(
                        "IDLE_UNTIL {} ns is beyond the device's card time limit",
                        req.arg0
                    ))
                } else if req.arg0 > now.saturating_add(MAX_IDLE_NS) {
                    refuse(format!(
                        "IDLE_UNTIL {} ns is more than {} s past card time {now} ns",
                        req.arg0,
                        MAX_IDLE_NS / 1_000_000_000
                    ))
                } else {
                    self.host.idle_until(req.arg0);
                    STATUS_OK
                }
            }
            CTRL_EXECUTE_TUNING => match self.host.execute_tuning() {
                Ok(n) => {
                    out.val0 = u64::from(n);
                    STATUS_OK
                }
                Err(e) => {
                    log::info!("EXECUTE_TUNING: {e}");
                    STATUS_IOERR
                }
            },
            other => {
                log::warn!("control: kind {other} is not supported");
                STATUS_UNSUPP
            }
        };
        out.now_ns = self.host.now();
        out.busy_until_ns = self.host.busy_until().unwrap_or(0);
        out
    }

    /// Clean shutdown: the card's cache written back, the image synced, power off.
    pub fn shutdown(&mut self) {
        let now = self.host.now();
        self.host.card.power_off(now, PowerDown::Clean);
        self.host.sdhci.flush_cmd_log();
    }

    /// Install a command log on the controller (`None` removes it); it stays across
    /// sessions.
    pub fn set_cmd_log(&mut self, log: Option<emmc_host::cmdlog::CmdLog>) {
        self.host.sdhci.set_cmd_log(log);
    }

    /// The frontend went away: power the card down cleanly and up again (in idle), and
    /// give the next frontend a controller at its reset settings.
    pub fn restart(&mut self) {
        let now = self.host.now();
        self.host.card.power_cycle(now, PowerDown::Clean);
        let faults = self.host.sdhci.take_fault_injector();
        self.host.sdhci.flush_cmd_log();
        let cmd_log = self.host.sdhci.take_cmd_log();
        self.host.sdhci = SdhciHost::new(self.sdhci_config.clone());
        self.host.sdhci.set_fault_injector(faults);
        self.host.sdhci.set_cmd_log(cmd_log);
        self.exception = None;
        self.bkops_level = 0;
    }
}
