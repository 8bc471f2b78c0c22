//! The vfio-user PCI function (issue 14); see the full documentation once the server lands.
pub mod config;
pub mod device;
pub mod dma;
pub mod identity;
pub mod intx;

pub use device::{DmaError, DmaMemory, PciMmio};
pub use identity::{PciIdentity, PciIds};
