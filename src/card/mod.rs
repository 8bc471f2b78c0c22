//! The eMMC 4.5 card (JESD84-B45, EXT_CSD_REV 6).

pub mod ext_csd;
pub mod registers;
pub mod rpmb;
pub mod status;
