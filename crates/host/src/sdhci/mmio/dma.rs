//! Guest memory as the controller's DMA engine sees it. The server maps what the VMM
//! shares (vfio-user DMA regions) and answers for every byte; the model never touches
//! memory any other way, so an address outside what is mapped can only come back as a
//! [`DmaError`], which the model turns into the specification's error bit (ADMA) or a log
//! line (SDMA), never a panic or a write elsewhere.

/// Why a DMA access failed. The model turns it into its own error status (ADMA error, a
/// log line for SDMA); it never panics over it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum DmaError {
    /// The access is not entirely inside one region of mapped memory.
    #[error("DMA of {len} bytes at bus address {addr:#x}: not inside one mapped region")]
    NotMapped { addr: u64, len: usize },
    /// The region is mapped, but not for this direction (a read-only map written to).
    #[error("DMA {} of {len} bytes at bus address {addr:#x}: the region is not mapped for it", if *write { "write" } else { "read" })]
    NotPermitted { addr: u64, len: usize, write: bool },
    /// Bus mastering is off (a PCI function's command register), or the function is not
    /// in D0.
    #[error("DMA at bus address {addr:#x} while the function may not master the bus")]
    Disabled { addr: u64 },
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
        Err(DmaError::NotMapped {
            addr,
            len: buf.len(),
        })
    }

    fn write(&self, addr: u64, buf: &[u8]) -> Result<(), DmaError> {
        Err(DmaError::NotMapped {
            addr,
            len: buf.len(),
        })
    }
}

/// `addr + len` does not wrap past the top of the 64-bit address space.
pub(super) fn in_address_space(addr: u64, len: usize) -> bool {
    addr.checked_add(len as u64).is_some()
}
