//! An in-process virtio-mmc device for unit tests of the driver: the daemon's own device
//! code behind a [`Transport`]. Chains are checked by `frontend::mmc::request`, run by
//! [`MmcDevice`] and answered with the backend's helpers; only the virtqueues and pacing
//! are missing (each chain runs at once, at the card's current time). The driver's memory
//! is one guest-memory region laid out as [`crate::VhostUserTransport`] lays out its own:
//! the control request and result, then the request area [`Transport::mem`] returns.

use emmc_card::model::DeviceModel;
use emmc_card::store::MemStore;
use emmc_card::Card;
use emmc_frontend::mmc::device::MmcDevice;
use emmc_frontend::mmc::proto::*;
use emmc_frontend::mmc::request::{
    answer_control, answer_request, parse_control_descs, parse_request_descs, refuse_control,
    refuse_request, ChainDesc, CTRL_REQ_LEN, CTRL_RESP_LEN,
};
use vm_memory::{Bytes, GuestAddress, GuestMemoryBackend, GuestMemoryMmap};

use crate::transport::{check_bounds, Desc, Transport, TransportError};

const CTRL_REQ_AT: GuestAddress = GuestAddress(0);
const CTRL_RESP_AT: GuestAddress = GuestAddress(64);
/// Where the request area starts in the region.
const REQ_BASE: u64 = 128;

pub struct Loopback {
    pub device: MmcDevice,
    mem: GuestMemoryMmap,
    req_size: usize,
    /// Events the device raised, until [`Transport::take_events`].
    events: Vec<VirtioMmcEvent>,
}

impl Loopback {
    /// A device with a fresh in-memory card of `model` behind the model's SDHCI host.
    pub fn for_model(model: &DeviceModel) -> Result<Loopback, String> {
        let store = Box::new(MemStore::new(Card::layout_for(model)));
        let card = Card::new(model.clone(), store).map_err(|e| e.to_string())?;
        Loopback::new(MmcDevice::new(card, model))
    }

    /// `device` with a request area for its largest request, a header and a response.
    pub fn new(device: MmcDevice) -> Result<Loopback, String> {
        let req_size = (device.config().max_req_size as usize).max(4 << 20) + 8192;
        let mem = GuestMemoryMmap::from_ranges(&[(GuestAddress(0), REQ_BASE as usize + req_size)])
            .map_err(|e| e.to_string())?;
        Ok(Loopback {
            device,
            mem,
            req_size,
            events: Vec::new(),
        })
    }

    fn area(&self) -> *mut u8 {
        self.mem
            .get_host_address(GuestAddress(REQ_BASE))
            .expect("the request area lies in the region mapped in new()")
    }

    fn request_chain(&mut self, descs: &[ChainDesc]) -> u32 {
        match parse_request_descs(&self.mem, descs, &self.device.limits()) {
            Ok(req) => {
                let done = self.device.request(&self.mem, &req, self.device.now());
                self.events.extend_from_slice(&done.events);
                answer_request(&self.mem, &req, &done)
            }
            Err(e) => refuse_request(&self.mem, &e),
        }
    }

    fn control_chain(&mut self, descs: &[ChainDesc]) -> u32 {
        let now = self.device.now();
        match parse_control_descs(&self.mem, descs) {
            Ok(c) => {
                let out = self.device.control(&c.req, now);
                answer_control(&self.mem, &c, &out)
            }
            Err(e) => refuse_control(&self.mem, &e, now),
        }
    }
}

impl Transport for Loopback {
    fn config(&self) -> VirtioMmcConfig {
        self.device.config()
    }

    fn mem(&mut self) -> &mut [u8] {
        // SAFETY: `area()` is the start of `req_size` bytes inside the one region `self.mem`
        // maps for as long as `self` lives. The slice borrows `self` mutably, so nothing
        // else reaches those bytes while it exists: the device only touches the region in
        // `run` and `control`, which take `&mut self` too.
        unsafe { std::slice::from_raw_parts_mut(self.area(), self.req_size) }
    }

    fn mem_ref(&self) -> &[u8] {
        // SAFETY: as in `mem`; a shared borrow of `self` excludes `run`, `control` and
        // `mem`, the only writers of the region.
        unsafe { std::slice::from_raw_parts(self.area(), self.req_size) }
    }

    fn run(&mut self, queue: usize, chain: &[Desc]) -> Result<u32, TransportError> {
        check_bounds(chain, self.req_size)?;
        let at = |d: &Desc| GuestAddress(REQ_BASE + d.offset as u64);
        let descs: Vec<ChainDesc> = chain
            .iter()
            .map(|d| ChainDesc::new(at(d), d.len, d.writable))
            .collect();
        match queue {
            REQUEST_QUEUE => Ok(self.request_chain(&descs)),
            CONTROL_QUEUE => Ok(self.control_chain(&descs)),
            q => Err(TransportError::NoSuchQueue(q)),
        }
    }

    fn control(&mut self, req: &VirtioMmcCtrlReq) -> Result<VirtioMmcCtrlResp, TransportError> {
        let broken = |e: vm_memory::GuestMemoryError| TransportError::Protocol(e.to_string());
        self.mem.write_obj(*req, CTRL_REQ_AT).map_err(broken)?;
        let chain = [
            ChainDesc::new(CTRL_REQ_AT, CTRL_REQ_LEN, false),
            ChainDesc::new(CTRL_RESP_AT, CTRL_RESP_LEN, true),
        ];
        match self.control_chain(&chain) {
            CTRL_RESP_LEN => self.mem.read_obj(CTRL_RESP_AT).map_err(broken),
            n => Err(TransportError::Protocol(format!(
                "control result of {n} bytes"
            ))),
        }
    }

    fn take_events(&mut self) -> Result<Vec<VirtioMmcEvent>, TransportError> {
        Ok(std::mem::take(&mut self.events))
    }
}
