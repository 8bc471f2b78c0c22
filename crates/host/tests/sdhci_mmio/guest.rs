//! Guest memory for the tests: one mapped window at a base address; everything else is
//! unmapped, as a vfio-user server would see a guest that shared only that window. Every
//! DMA write is recorded, so a test can prove nothing landed outside.

use std::cell::RefCell;

use emmc_host::sdhci::{DmaError, DmaMemory};

pub struct GuestMem {
    pub base: u64,
    bytes: RefCell<Vec<u8>>,
    /// Every DMA write the controller made: (address, length).
    pub writes: RefCell<Vec<(u64, usize)>>,
    /// DMA accesses refused (outside the window).
    pub refused: RefCell<u64>,
}

impl GuestMem {
    pub fn new(base: u64, size: usize) -> GuestMem {
        GuestMem {
            base,
            bytes: RefCell::new(vec![0; size]),
            writes: RefCell::new(Vec::new()),
            refused: RefCell::new(0),
        }
    }

    pub fn size(&self) -> u64 {
        self.bytes.borrow().len() as u64
    }

    fn range(&self, addr: u64, len: usize) -> Option<std::ops::Range<usize>> {
        let off = addr.checked_sub(self.base)?;
        let end = off.checked_add(len as u64)?;
        (end <= self.size()).then_some(off as usize..end as usize)
    }

    /// The driver's own access (the CPU's, not the DMA's).
    pub fn put(&self, addr: u64, data: &[u8]) {
        let r = self
            .range(addr, data.len())
            .expect("driver writes inside memory");
        self.bytes.borrow_mut()[r].copy_from_slice(data);
    }

    pub fn get(&self, addr: u64, len: usize) -> Vec<u8> {
        let r = self.range(addr, len).expect("driver reads inside memory");
        self.bytes.borrow()[r].to_vec()
    }
}

impl DmaMemory for GuestMem {
    fn read(&self, addr: u64, buf: &mut [u8]) -> Result<(), DmaError> {
        match self.range(addr, buf.len()) {
            Some(r) => {
                buf.copy_from_slice(&self.bytes.borrow()[r]);
                Ok(())
            }
            None => {
                *self.refused.borrow_mut() += 1;
                Err(DmaError::NotMapped {
                    addr,
                    len: buf.len(),
                })
            }
        }
    }

    fn write(&self, addr: u64, buf: &[u8]) -> Result<(), DmaError> {
        match self.range(addr, buf.len()) {
            Some(r) => {
                self.bytes.borrow_mut()[r].copy_from_slice(buf);
                self.writes.borrow_mut().push((addr, buf.len()));
                Ok(())
            }
            None => {
                *self.refused.borrow_mut() += 1;
                Err(DmaError::NotMapped {
                    addr,
                    len: buf.len(),
                })
            }
        }
    }
}
