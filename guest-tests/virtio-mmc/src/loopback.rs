//! An in-process virtio-mmc device for unit tests of the driver: chains are parsed as
//! docs/virtio-mmc.md describes and run on the in-process SDHCI model and card
//! ([`MmcHost`]). It checks the driver's encoding without a daemon; the daemon's own
//! device is what the socket tests run against.

use vhost_user_emmc::card::Card;
use vhost_user_emmc::frontend::mmc::proto::*;
use vhost_user_emmc::host::mmc::{MmcHost, MmcHostOps};
use vhost_user_emmc::host::sdhci::{
    DataDirection, MmcCommand, MmcData, MmcRequest, ResponseType, SdhciCompletion, SdhciConfig,
};
use vhost_user_emmc::model::DeviceModel;
use vhost_user_emmc::store::MemStore;
use vm_memory::ByteValued;

use crate::transport::{Desc, Transport, TransportError};

const HDR_LEN: usize = std::mem::size_of::<VirtioMmcReqHdr>();
const RESP_LEN: usize = std::mem::size_of::<VirtioMmcResp>();

/// The in-process device.
pub struct Loopback {
    pub host: MmcHost,
    cfg: VirtioMmcConfig,
    mem: Vec<u8>,
}

impl Loopback {
    /// A device with a fresh in-memory card of `model` behind the model's SDHCI host.
    pub fn for_model(model: &DeviceModel) -> Result<Loopback, String> {
        let layout = Card::layout_for(model);
        let card =
            Card::new(model.clone(), Box::new(MemStore::new(layout))).map_err(|e| e.to_string())?;
        let host = MmcHost::with_config(card, SdhciConfig::for_model(&model.host));
        Ok(Loopback::new(host))
    }

    pub fn new(host: MmcHost) -> Loopback {
        let cfg = VirtioMmcConfig {
            caps: CAP_4_BIT_DATA
                | CAP_8_BIT_DATA
                | CAP_MMC_HIGHSPEED
                | CAP_1_8V_DDR
                | CAP2_HS200
                | CAP_CMD23
                | CAP2_PACKED_WR
                | CAP2_PACKED_RD
                | CAP_ERASE
                | CAP2_HPI
                | CAP2_BKOPS
                | CAP_AUTO_CMD23
                | CAP_NONREMOVABLE
                | CAP_WAIT_WHILE_BUSY
                | CAP2_CACHE,
            max_seg_size: 65_536,
            max_segs: 128,
            max_blk_size: host.sdhci.config().max_block_len,
            max_blk_count: 65_535,
            max_req_size: 4 << 20,
            max_busy_timeout_ms: host.sdhci.max_busy_timeout_ms(),
            f_min: 400_000,
            f_max: 200_000_000,
            ocr_avail: 0x00FF_8080,
            reserved: 0,
        };
        Loopback {
            host,
            cfg,
            mem: vec![0; (4 << 20) + 8192],
        }
    }

    fn decode_cmd(c: &VirtioMmcCmd) -> MmcCommand {
        let resp_type = response_type(c.resp_type).unwrap_or(ResponseType::R3);
        MmcCommand {
            opcode: c.opcode,
            arg: c.arg,
            resp_type,
            busy: c.flags & CMD_F_BUSY != 0 || resp_type == ResponseType::R1b,
            busy_timeout_ms: c.busy_timeout_ms,
        }
    }

    fn valid_cmd(c: &VirtioMmcCmd) -> bool {
        c.resp_type <= RESP_R3 && c.opcode <= 63
    }

    /// The request queue: `Ok(used length)`.
    fn request(&mut self, chain: &[Desc]) -> u32 {
        let Some(last) = chain
            .last()
            .filter(|d| d.writable && d.len as usize >= RESP_LEN)
        else {
            return 0;
        };
        let resp_off = last.offset;
        let mut resp = VirtioMmcResp::default();
        let used = match self.execute(chain, &mut resp) {
            Ok(read) => read + RESP_LEN as u32,
            Err(status) => {
                resp = VirtioMmcResp {
                    status,
                    ..Default::default()
                };
                RESP_LEN as u32
            }
        };
        self.mem[resp_off..resp_off + RESP_LEN].copy_from_slice(resp.as_slice());
        used
    }

    /// Check and run one request; the bytes of read data, or the status of a refusal.
    fn execute(&mut self, chain: &[Desc], resp: &mut VirtioMmcResp) -> Result<u32, u32> {
        let first = chain[0];
        if chain.len() < 2 || first.writable || (first.len as usize) < HDR_LEN {
            return Err(STATUS_IOERR);
        }
        let mut hdr = VirtioMmcReqHdr::default();
        hdr.as_mut_slice()
            .copy_from_slice(&self.mem[first.offset..first.offset + HDR_LEN]);
        if hdr.flags & !REQ_F_ALL != 0 {
            return Err(STATUS_UNSUPP);
        }
        let data_descs = &chain[1..chain.len() - 1];
        let has_data = hdr.flags & REQ_F_DATA != 0;
        let write = hdr.flags & REQ_F_WRITE != 0;
        let cmds_ok = Self::valid_cmd(&hdr.cmd)
            && (hdr.flags & REQ_F_SBC == 0 || Self::valid_cmd(&hdr.sbc))
            && (hdr.flags & REQ_F_STOP == 0 || Self::valid_cmd(&hdr.stop));
        if !cmds_ok || (!has_data && !data_descs.is_empty()) {
            return Err(STATUS_IOERR);
        }
        let total: u64 = data_descs.iter().map(|d| u64::from(d.len)).sum();
        if has_data
            && (hdr.cmd.resp_type == RESP_NONE
                || data_descs.iter().any(|d| d.writable == write)
                || data_descs.len() > self.cfg.max_segs as usize
                || data_descs.iter().any(|d| d.len > self.cfg.max_seg_size)
                || hdr.blksz == 0
                || hdr.blksz > self.cfg.max_blk_size
                || hdr.blocks == 0
                || hdr.blocks > self.cfg.max_blk_count
                || total != u64::from(hdr.blksz) * u64::from(hdr.blocks)
                || total > u64::from(self.cfg.max_req_size))
        {
            return Err(STATUS_IOERR);
        }
        let mut sg: Vec<Vec<u8>> = data_descs
            .iter()
            .map(|d| self.mem[d.offset..d.offset + d.len as usize].to_vec())
            .collect();
        let data = has_data.then(|| MmcData {
            blksz: hdr.blksz,
            blocks: hdr.blocks,
            direction: if write {
                DataDirection::Write
            } else {
                DataDirection::Read
            },
            sg: &mut sg[..],
            timeout_ns: hdr.timeout_ns,
            timeout_clks: hdr.timeout_clks,
        });
        let mrq = MmcRequest {
            sbc: (hdr.flags & REQ_F_SBC != 0).then(|| Self::decode_cmd(&hdr.sbc)),
            cmd: Self::decode_cmd(&hdr.cmd),
            data,
            stop: (hdr.flags & REQ_F_STOP != 0).then(|| Self::decode_cmd(&hdr.stop)),
        };
        let done = if hdr.flags & REQ_F_START_ONLY != 0 {
            self.host.start_request(mrq)
        } else {
            self.host.request(mrq)
        };
        let mut read = 0;
        if has_data && !write && done.data_error.is_none() {
            for (d, buf) in data_descs.iter().zip(&sg) {
                self.mem[d.offset..d.offset + buf.len()].copy_from_slice(buf);
                read += d.len;
            }
        }
        *resp = encode_completion(&done, self.host.busy_until().unwrap_or(0));
        Ok(read)
    }

    fn ctrl(&mut self, req: &VirtioMmcCtrlReq) -> VirtioMmcCtrlResp {
        let mut r = VirtioMmcCtrlResp::default();
        match req.kind {
            CTRL_GET_TIME => {}
            CTRL_SET_IOS => match decode_ios(req.arg0, req.arg1) {
                Ok(ios) => self.host.set_ios(ios),
                Err(_) => r.status = STATUS_IOERR,
            },
            CTRL_GET_IOS => {
                let ios = self.host.ios();
                (r.val0, r.val1) = encode_ios(&ios);
            }
            CTRL_GET_CD_RO => r.val0 = CD_PRESENT,
            CTRL_CARD_BUSY => r.val0 = u64::from(self.host.busy_until().is_some()),
            CTRL_WAIT_BUSY => {
                let deadline = (req.arg0 != u64::MAX).then_some(req.arg0);
                r.val0 = u64::from(self.host.wait_busy_until(deadline));
            }
            CTRL_IDLE_UNTIL => self.host.idle_until(req.arg0),
            CTRL_EXECUTE_TUNING => match self.host.execute_tuning() {
                Ok(n) => r.val0 = u64::from(n),
                Err(_) => r.status = STATUS_IOERR,
            },
            _ => r.status = STATUS_UNSUPP,
        }
        r.now_ns = self.host.now();
        r.busy_until_ns = self.host.busy_until().unwrap_or(0);
        r
    }
}

/// A completion in the wire form (what a device answers).
pub fn encode_completion(done: &SdhciCompletion, busy_until: u64) -> VirtioMmcResp {
    let cmd = |c: &vhost_user_emmc::host::sdhci::CommandOutcome| VirtioMmcCmdResp {
        opcode: c.opcode,
        flags: if c.issued { RESP_F_ISSUED } else { 0 } | if c.auto { RESP_F_AUTO } else { 0 },
        error: error_code(c.error),
        reserved: 0,
        resp: c.resp,
    };
    VirtioMmcResp {
        status: STATUS_OK,
        flags: if done.busy_pending {
            RESP_F_BUSY_PENDING
        } else {
            0
        },
        sbc: done.sbc.as_ref().map(cmd).unwrap_or_default(),
        cmd: cmd(&done.cmd),
        stop: done.stop.as_ref().map(cmd).unwrap_or_default(),
        data_error: error_code(done.data_error),
        adma_err: done.adma_err,
        auto_cmd_err: done.auto_cmd_err,
        int_status: done.int_status.linux_mask(),
        reserved: 0,
        bytes_xfered: done.bytes_xfered,
        start_ns: done.start_ns,
        end_ns: done.end_ns,
        busy_until_ns: busy_until,
    }
}

impl Transport for Loopback {
    fn config(&self) -> VirtioMmcConfig {
        self.cfg
    }

    fn mem(&mut self) -> &mut [u8] {
        &mut self.mem
    }

    fn mem_ref(&self) -> &[u8] {
        &self.mem
    }

    fn run(&mut self, queue: usize, chain: &[Desc]) -> Result<u32, TransportError> {
        for d in chain {
            if d.offset + d.len as usize > self.mem.len() {
                return Err(TransportError::OutOfBounds {
                    offset: d.offset,
                    len: d.len,
                    size: self.mem.len(),
                });
            }
        }
        match queue {
            REQUEST_QUEUE if !chain.is_empty() => Ok(self.request(chain)),
            REQUEST_QUEUE => Ok(0),
            CONTROL_QUEUE => {
                let rl = std::mem::size_of::<VirtioMmcCtrlReq>();
                let sl = std::mem::size_of::<VirtioMmcCtrlResp>();
                match chain {
                    [r, s]
                        if !r.writable
                            && s.writable
                            && r.len as usize >= rl
                            && s.len as usize >= sl =>
                    {
                        let mut req = VirtioMmcCtrlReq::default();
                        req.as_mut_slice()
                            .copy_from_slice(&self.mem[r.offset..r.offset + rl]);
                        let resp = self.ctrl(&req);
                        self.mem[s.offset..s.offset + sl].copy_from_slice(resp.as_slice());
                        Ok(sl as u32)
                    }
                    _ => Ok(0),
                }
            }
            q => Err(TransportError::NoSuchQueue(q)),
        }
    }

    fn control(&mut self, req: &VirtioMmcCtrlReq) -> Result<VirtioMmcCtrlResp, TransportError> {
        Ok(self.ctrl(req))
    }

    fn take_events(&mut self) -> Result<Vec<VirtioMmcEvent>, TransportError> {
        Ok(Vec::new())
    }
}
