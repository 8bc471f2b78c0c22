//! The function's PCI configuration space: a type 0 header, one 32-bit memory BAR and a
//! power-management capability, 256 bytes.
//!
//! Every byte has a write mask; what a mask leaves out is read-only, and bytes nothing
//! defines read 0 and ignore writes. No status bit that software clears by writing 1 is
//! ever set (the function reports no errors and no PME), so there are no RW1C bits.

use super::identity::PciIds;

/// Size of the configuration space (conventional PCI; QEMU then treats the function as
/// a PCI, not a PCI Express, device).
pub const CONFIG_SIZE: usize = 256;

pub const VENDOR_ID: usize = 0x00;
pub const DEVICE_ID: usize = 0x02;
pub const COMMAND: usize = 0x04;
pub const STATUS: usize = 0x06;
pub const REVISION: usize = 0x08;
pub const CLASS_PROG: usize = 0x09;
pub const CACHE_LINE_SIZE: usize = 0x0c;
pub const HEADER_TYPE: usize = 0x0e;
pub const BAR0: usize = 0x10;
pub const SUBSYSTEM_VENDOR_ID: usize = 0x2c;
pub const SUBSYSTEM_ID: usize = 0x2e;
pub const CAPABILITIES: usize = 0x34;
pub const INTERRUPT_LINE: usize = 0x3c;
pub const INTERRUPT_PIN: usize = 0x3d;
/// The SD host controller's Slot Information register (SD Host Controller Simplified
/// Specification, PCI configuration): bits 6:4 the number of slots minus one, bits 2:0
/// the first BAR. 0: one slot, in BAR0. Linux's `sdhci-pci` reads it (`PCI_SLOT_INFO`)
/// before anything else, so no capability may sit here.
pub const SLOT_INFO: usize = 0x40;
/// The power-management capability, after the slot information.
pub const PM_CAP: usize = 0x80;
/// Its control/status register (PMCSR).
pub const PMCSR: usize = PM_CAP + 4;

/// Command register bits the function implements.
pub const COMMAND_MEMORY: u16 = 1 << 1;
pub const COMMAND_MASTER: u16 = 1 << 2;
pub const COMMAND_INTX_DISABLE: u16 = 1 << 10;
/// Status register: the function's interrupt is pending / there is a capability list.
pub const STATUS_INTERRUPT: u16 = 1 << 3;
pub const STATUS_CAP_LIST: u16 = 1 << 4;
/// PCI PM capability ID.
pub const CAP_ID_PM: u8 = 0x01;
/// PMC: version 3 of the PCI PM specification; no D1, D2, PME or auxiliary current.
pub const PMC: u16 = 0x0003;
/// PMCSR: the power state field and No_Soft_Reset.
pub const PMCSR_STATE: u16 = 0x0003;
pub const PMCSR_NO_SOFT_RESET: u16 = 1 << 3;

/// The function's power state (PMCSR bits 1:0); D1 and D2 are not supported.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PowerState {
    D0,
    D3Hot,
}

/// The configuration space of one function.
#[derive(Clone)]
pub struct ConfigSpace {
    bytes: [u8; CONFIG_SIZE],
    wmask: [u8; CONFIG_SIZE],
    defaults: [u8; CONFIG_SIZE],
}

impl std::fmt::Debug for ConfigSpace {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ConfigSpace")
            .field("command", &format_args!("{:#06x}", self.word(COMMAND)))
            .field("status", &format_args!("{:#06x}", self.word(STATUS)))
            .field("bar0", &format_args!("{:#010x}", self.bar0()))
            .finish_non_exhaustive()
    }
}

impl ConfigSpace {
    /// A function with `ids` and a BAR0 of `bar0_size` bytes (a power of two, at least
    /// 16, at most 2 GiB: checked by the caller).
    pub fn new(ids: &PciIds, bar0_size: u64) -> ConfigSpace {
        let mut c = ConfigSpace {
            bytes: [0; CONFIG_SIZE],
            wmask: [0; CONFIG_SIZE],
            defaults: [0; CONFIG_SIZE],
        };
        c.put16(VENDOR_ID, ids.vendor);
        c.put16(DEVICE_ID, ids.device);
        c.put16(STATUS, STATUS_CAP_LIST);
        c.bytes[REVISION] = ids.revision;
        c.bytes[CLASS_PROG] = ids.class[2];
        c.bytes[CLASS_PROG + 1] = ids.class[1];
        c.bytes[CLASS_PROG + 2] = ids.class[0];
        c.bytes[HEADER_TYPE] = 0x00; // type 0, single function
        c.put16(SUBSYSTEM_VENDOR_ID, ids.subsystem_vendor);
        c.put16(SUBSYSTEM_ID, ids.subsystem);
        c.bytes[CAPABILITIES] = PM_CAP as u8;
        c.bytes[INTERRUPT_PIN] = 1; // INTA#
        c.bytes[SLOT_INFO] = 0; // one slot, first BAR 0
        c.bytes[PM_CAP] = CAP_ID_PM;
        c.bytes[PM_CAP + 1] = 0; // the last capability
        c.put16(PM_CAP + 2, PMC);
        c.put16(PMCSR, PMCSR_NO_SOFT_RESET); // D0
                                             // BAR0: 32-bit, non-prefetchable memory (type bits 0); the address bits above the
                                             // size are writable, so writing all ones reads back the size mask.
        let bar_mask = !(bar0_size.clamp(16, 1 << 31) as u32 - 1) & !0xf;
        c.wmask[BAR0..BAR0 + 4].copy_from_slice(&bar_mask.to_le_bytes());
        let command = COMMAND_MEMORY | COMMAND_MASTER | COMMAND_INTX_DISABLE;
        c.wmask[COMMAND..COMMAND + 2].copy_from_slice(&command.to_le_bytes());
        c.wmask[CACHE_LINE_SIZE] = 0xff;
        c.wmask[INTERRUPT_LINE] = 0xff;
        c.wmask[PMCSR..PMCSR + 2].copy_from_slice(&PMCSR_STATE.to_le_bytes());
        c.defaults = c.bytes;
        c
    }

    fn put16(&mut self, at: usize, v: u16) {
        self.bytes[at..at + 2].copy_from_slice(&v.to_le_bytes());
    }

    fn word(&self, at: usize) -> u16 {
        u16::from_le_bytes([self.bytes[at], self.bytes[at + 1]])
    }

    /// Whether `len` bytes at `offset` lie inside the space.
    pub fn contains(offset: u64, len: usize) -> bool {
        offset
            .checked_add(len as u64)
            .is_some_and(|end| end <= CONFIG_SIZE as u64)
    }

    /// Read any span inside the space (the caller checked it with [`Self::contains`]).
    pub fn read(&self, offset: usize, data: &mut [u8]) {
        data.copy_from_slice(&self.bytes[offset..offset + data.len()]);
    }

    /// Write any span inside the space, each byte through its mask.
    pub fn write(&mut self, offset: usize, data: &[u8]) {
        let state_before = self.bytes[PMCSR] & PMCSR_STATE as u8;
        for (i, &b) in data.iter().enumerate() {
            let at = offset + i;
            let m = self.wmask[at];
            self.bytes[at] = (self.bytes[at] & !m) | (b & m);
        }
        // D1 and D2 are not supported: a write asking for one completes and changes
        // nothing (PCI PM 1.2, 5.3.1.4.1 is the rule for unsupported states).
        let state = self.bytes[PMCSR] & PMCSR_STATE as u8;
        if state == 1 || state == 2 {
            self.bytes[PMCSR] = (self.bytes[PMCSR] & !(PMCSR_STATE as u8)) | state_before;
        }
    }

    /// Back to the values after reset.
    pub fn reset(&mut self) {
        self.bytes = self.defaults;
    }

    /// The status register's interrupt bit follows the device's line.
    pub fn set_interrupt_status(&mut self, asserted: bool) {
        let mut status = self.word(STATUS) & !STATUS_INTERRUPT;
        if asserted {
            status |= STATUS_INTERRUPT;
        }
        self.put16(STATUS, status);
    }

    pub fn command(&self) -> u16 {
        self.word(COMMAND)
    }

    pub fn power_state(&self) -> PowerState {
        if self.bytes[PMCSR] & PMCSR_STATE as u8 == 3 {
            PowerState::D3Hot
        } else {
            PowerState::D0
        }
    }

    /// BAR0 accesses are decoded: memory space on and the function in D0.
    pub fn memory_enabled(&self) -> bool {
        self.command() & COMMAND_MEMORY != 0 && self.power_state() == PowerState::D0
    }

    /// The function may master the bus: bus master on and the function in D0.
    pub fn bus_master(&self) -> bool {
        self.command() & COMMAND_MASTER != 0 && self.power_state() == PowerState::D0
    }

    pub fn intx_disabled(&self) -> bool {
        self.command() & COMMAND_INTX_DISABLE != 0
    }

    pub fn bar0(&self) -> u32 {
        u32::from_le_bytes(self.bytes[BAR0..BAR0 + 4].try_into().unwrap_or([0; 4]))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pci::identity::PciIdentity;

    fn space() -> ConfigSpace {
        ConfigSpace::new(&PciIdentity::Generic.ids(), 256)
    }

    fn r32(c: &ConfigSpace, at: usize) -> u32 {
        let mut b = [0; 4];
        c.read(at, &mut b);
        u32::from_le_bytes(b)
    }

    fn w32(c: &mut ConfigSpace, at: usize, v: u32) {
        c.write(at, &v.to_le_bytes());
    }

    #[test]
    fn the_header_is_a_type_0_sdhci_with_dma() {
        let c = space();
        assert_eq!(r32(&c, VENDOR_ID), 0x0007_1b36);
        assert_eq!(r32(&c, 0x08), 0x0805_0100, "class 08/05/01, revision 0");
        assert_eq!(c.bytes[HEADER_TYPE], 0);
        assert_eq!(r32(&c, SUBSYSTEM_VENDOR_ID), 0x1100_1af4);
        assert_eq!(c.bytes[INTERRUPT_PIN], 1);
        assert_eq!(c.word(STATUS), STATUS_CAP_LIST);
        assert_eq!(c.bytes[CAPABILITIES], 0x80);
        assert_eq!(c.bytes[SLOT_INFO], 0, "one slot, in BAR0");
        assert_eq!(r32(&c, PM_CAP), 0x0003_0001, "PM cap, last, version 3");
    }

    #[test]
    fn bar0_sizing_reads_back_the_size_mask() {
        for (size, mask) in [(256, 0xffff_ff00u32), (4096, 0xffff_f000)] {
            let mut c = ConfigSpace::new(&PciIdentity::Generic.ids(), size);
            assert_eq!(c.bar0(), 0);
            w32(&mut c, BAR0, 0xffff_ffff);
            assert_eq!(c.bar0(), mask, "{size}");
            w32(&mut c, BAR0, 0xfebf_1234);
            assert_eq!(c.bar0(), 0xfebf_1234 & mask);
            // The other BARs and the expansion ROM are absent: all ones reads back 0.
            for bar in (0x14..0x28).step_by(4).chain([0x30]) {
                w32(&mut c, bar, 0xffff_ffff);
                assert_eq!(r32(&c, bar), 0, "{bar:#x}");
            }
        }
    }

    #[test]
    fn read_only_fields_stay_and_the_rest_reads_zero() {
        let mut c = space();
        let before = c.bytes;
        let ones = [0xffu8; CONFIG_SIZE];
        c.write(0, &ones);
        let writable = [
            COMMAND,
            COMMAND + 1,
            CACHE_LINE_SIZE,
            BAR0,
            BAR0 + 1,
            BAR0 + 2,
            BAR0 + 3,
            INTERRUPT_LINE,
            PMCSR,
        ];
        for (at, (now, was)) in c.bytes.iter().zip(before).enumerate() {
            if !writable.contains(&at) {
                assert_eq!(*now, was, "byte {at:#x} is read-only");
            }
        }
        assert_eq!(c.command(), 0x0406, "memory, master, INTx disable");
        assert_eq!(
            c.bytes[0x40..0x80],
            [0; 64],
            "slot information 0, then nothing"
        );
        assert_eq!(
            c.bytes[0x88..],
            [0; 120],
            "nothing defined past the capability"
        );
    }

    #[test]
    fn the_power_state_takes_d0_and_d3hot_and_ignores_d1_and_d2() {
        let mut c = space();
        c.write(COMMAND, &COMMAND_MEMORY.to_le_bytes());
        assert!(c.memory_enabled());
        c.write(PMCSR, &[3]);
        assert_eq!(c.power_state(), PowerState::D3Hot);
        assert!(!c.memory_enabled(), "no memory decoding in D3hot");
        c.write(PMCSR, &[1]);
        assert_eq!(c.power_state(), PowerState::D3Hot, "D1 is not supported");
        c.write(PMCSR, &[0]);
        assert_eq!(c.power_state(), PowerState::D0);
        c.write(PMCSR, &[2]);
        assert_eq!(c.power_state(), PowerState::D0, "D2 is not supported");
        assert_ne!(c.word(PMCSR) & PMCSR_NO_SOFT_RESET, 0);
        c.reset();
        assert_eq!(c.bytes, space().bytes);
    }

    #[test]
    fn the_interrupt_status_bit_follows_the_line() {
        let mut c = space();
        c.set_interrupt_status(true);
        assert_eq!(c.word(STATUS), STATUS_CAP_LIST | STATUS_INTERRUPT);
        c.write(STATUS, &0xffffu16.to_le_bytes());
        assert_eq!(
            c.word(STATUS),
            STATUS_CAP_LIST | STATUS_INTERRUPT,
            "read-only"
        );
        c.set_interrupt_status(false);
        assert_eq!(c.word(STATUS), STATUS_CAP_LIST);
    }
}
