//! Guest memory as the controller's DMA engine sees it. The server maps what the VMM
//! shares (vfio-user DMA regions) and answers for every byte; the model never touches
//! memory any other way, so an address outside what is mapped can only come back as a
//! [`DmaError`], which the model turns into the specification's error bit (ADMA) or a log
//! line (SDMA), never a panic or a write elsewhere.

/// Why a DMA access failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum DmaError {
    /// Some byte of the range is not mapped (or not with the access asked for).
    #[error("guest memory {addr:#x}+{len} is not mapped for DMA")]
    Unmapped { addr: u64, len: u64 },
}

/// Guest memory for the controller's DMA (the server maps vfio-user DMA regions). Both
/// calls move the whole buffer or fail without a partial write being relied on.
pub trait DmaMemory {
    /// Read `buf.len()` bytes at guest physical address `addr` (the device reads memory).
    fn read(&self, addr: u64, buf: &mut [u8]) -> Result<(), DmaError>;
    /// Write `buf` at guest physical address `addr` (the device writes memory).
    fn write(&self, addr: u64, buf: &[u8]) -> Result<(), DmaError>;
}

/// No memory at all: every access fails (for a caller with nothing mapped yet).
#[derive(Debug, Clone, Copy, Default)]
pub struct NoDmaMemory;

impl DmaMemory for NoDmaMemory {
    fn read(&self, addr: u64, buf: &mut [u8]) -> Result<(), DmaError> {
        Err(DmaError::Unmapped {
            addr,
            len: buf.len() as u64,
        })
    }

    fn write(&self, addr: u64, buf: &[u8]) -> Result<(), DmaError> {
        Err(DmaError::Unmapped {
            addr,
            len: buf.len() as u64,
        })
    }
}

/// `addr + len` does not wrap past the top of the 64-bit address space.
pub(super) fn in_address_space(addr: u64, len: usize) -> bool {
    addr.checked_add(len as u64).is_some()
}
