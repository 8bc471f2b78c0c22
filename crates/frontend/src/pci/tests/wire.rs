//! vfio-user messages written by hand, for a client that does what QEMU never would and
//! for reading error replies (the `vfio_user` client assumes success). The layout is the
//! protocol's: a 16-byte header (message id, command, size, flags, error), then the
//! command's fields, little-endian.

use std::io::{Read, Write};
use std::os::fd::RawFd;
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::Duration;

use vmm_sys_util::sock_ctrl_msg::ScmSocket;

pub const VERSION: u16 = 1;
pub const DMA_MAP: u16 = 2;
pub const DMA_UNMAP: u16 = 3;
pub const SET_IRQS: u16 = 8;
pub const REGION_READ: u16 = 9;
pub const REGION_WRITE: u16 = 10;
pub const DMA_READ: u16 = 11;
const REPLY: u32 = 0x1;
const ERROR: u32 = 0x20;

pub const HEADER: usize = 16;

/// One client connection.
pub struct Wire {
    pub s: UnixStream,
    id: u16,
}

/// A reply: its flags and error, and what followed the header.
#[derive(Debug)]
pub struct Reply {
    pub flags: u32,
    pub error: u32,
    pub body: Vec<u8>,
}

impl Reply {
    pub fn is_error(&self) -> bool {
        self.flags & ERROR != 0
    }
}

pub fn header(id: u16, command: u16, size: u32) -> Vec<u8> {
    let mut h = Vec::with_capacity(HEADER);
    h.extend_from_slice(&id.to_le_bytes());
    h.extend_from_slice(&command.to_le_bytes());
    h.extend_from_slice(&size.to_le_bytes());
    h.extend_from_slice(&0u32.to_le_bytes()); // a command
    h.extend_from_slice(&0u32.to_le_bytes());
    h
}

impl Wire {
    /// Connect and agree on the version.
    pub fn connect(path: &Path) -> Wire {
        let mut w = Wire::connect_bare(path);
        w.version();
        w
    }

    /// Connect without a word.
    pub fn connect_bare(path: &Path) -> Wire {
        let s = UnixStream::connect(path).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        Wire { s, id: 0 }
    }

    fn version(&mut self) {
        let caps = b"{\"capabilities\":{}}\0";
        let mut payload = Vec::new();
        payload.extend_from_slice(&0u16.to_le_bytes());
        payload.extend_from_slice(&1u16.to_le_bytes());
        payload.extend_from_slice(caps);
        let r = self.call(VERSION, &payload, &[]);
        assert!(!r.is_error(), "version refused");
    }

    /// Send a command with `payload` after the header (and `fds`), read the reply.
    pub fn call(&mut self, command: u16, payload: &[u8], fds: &[RawFd]) -> Reply {
        self.send(command, payload, fds);
        self.reply()
    }

    pub fn send(&mut self, command: u16, payload: &[u8], fds: &[RawFd]) {
        self.id = self.id.wrapping_add(1);
        let mut msg = header(self.id, command, (HEADER + payload.len()) as u32);
        msg.extend_from_slice(payload);
        if fds.is_empty() {
            self.s.write_all(&msg).unwrap();
        } else {
            self.s.send_with_fds(&[&msg[..]], fds).unwrap();
        }
    }

    pub fn reply(&mut self) -> Reply {
        let mut h = [0u8; HEADER];
        self.s.read_exact(&mut h).expect("a reply header");
        let size = u32::from_le_bytes(h[4..8].try_into().unwrap()) as usize;
        let flags = u32::from_le_bytes(h[8..12].try_into().unwrap());
        let error = u32::from_le_bytes(h[12..16].try_into().unwrap());
        assert_ne!(flags & REPLY, 0, "a reply");
        let mut body = vec![0; size.saturating_sub(HEADER)];
        self.s.read_exact(&mut body).expect("the reply's body");
        Reply { flags, error, body }
    }

    /// REGION_READ: the bytes, or None for an error reply.
    pub fn read(&mut self, region: u32, offset: u64, count: u32) -> Option<Vec<u8>> {
        let mut p = Vec::new();
        p.extend_from_slice(&offset.to_le_bytes());
        p.extend_from_slice(&region.to_le_bytes());
        p.extend_from_slice(&count.to_le_bytes());
        let r = self.call(REGION_READ, &p, &[]);
        (!r.is_error()).then(|| r.body[16..].to_vec())
    }

    /// REGION_WRITE: whether it succeeded.
    pub fn write(&mut self, region: u32, offset: u64, data: &[u8]) -> bool {
        let mut p = Vec::new();
        p.extend_from_slice(&offset.to_le_bytes());
        p.extend_from_slice(&region.to_le_bytes());
        p.extend_from_slice(&(data.len() as u32).to_le_bytes());
        p.extend_from_slice(data);
        !self.call(REGION_WRITE, &p, &[]).is_error()
    }

    /// SET_IRQS: whether it succeeded.
    pub fn set_irqs(
        &mut self,
        index: u32,
        flags: u32,
        start: u32,
        count: u32,
        fds: &[RawFd],
    ) -> bool {
        let mut p = Vec::new();
        p.extend_from_slice(&20u32.to_le_bytes()); // argsz
        for v in [flags, index, start, count] {
            p.extend_from_slice(&v.to_le_bytes());
        }
        !self.call(SET_IRQS, &p, fds).is_error()
    }

    /// DMA_MAP: whether it succeeded.
    pub fn dma_map(
        &mut self,
        flags: u32,
        offset: u64,
        addr: u64,
        size: u64,
        fd: Option<RawFd>,
    ) -> bool {
        let mut p = Vec::new();
        p.extend_from_slice(&32u32.to_le_bytes()); // argsz
        p.extend_from_slice(&flags.to_le_bytes());
        for v in [offset, addr, size] {
            p.extend_from_slice(&v.to_le_bytes());
        }
        let fds: Vec<RawFd> = fd.into_iter().collect();
        !self.call(DMA_MAP, &p, &fds).is_error()
    }

    /// DMA_UNMAP: whether it succeeded.
    pub fn dma_unmap(&mut self, flags: u32, addr: u64, size: u64) -> bool {
        let mut p = Vec::new();
        p.extend_from_slice(&24u32.to_le_bytes()); // argsz
        p.extend_from_slice(&flags.to_le_bytes());
        for v in [addr, size] {
            p.extend_from_slice(&v.to_le_bytes());
        }
        !self.call(DMA_UNMAP, &p, &[]).is_error()
    }

    /// The vendor and device ID: the server still answers.
    pub fn ids(&mut self) -> u32 {
        let b = self.read(7, 0, 4).expect("config space answers");
        u32::from_le_bytes(b.try_into().unwrap())
    }
}
