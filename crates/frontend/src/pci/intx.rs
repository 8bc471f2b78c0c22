//! INTx as VFIO presents a level-triggered interrupt to user space.
//!
//! The client hands an eventfd for VFIO_PCI_INTX_IRQ_INDEX (SET_IRQS, ACTION_TRIGGER,
//! DATA_EVENTFD). When the device's line is asserted, INTx is enabled, not masked and not
//! disabled in the command register, the function writes the eventfd once and masks INTx
//! itself (VFIO_IRQ_INFO_AUTOMASKED): nothing more is signalled until the client unmasks
//! (ACTION_UNMASK with DATA_NONE, or a write to the eventfd it registered with ACTION_UNMASK
//! and DATA_EVENTFD — KVM's resampler). Unmasking while the line is still asserted
//! signals again at once and masks again. QEMU unmasks on the first BAR access after it
//! has seen the interrupt (its EOI), so an interrupt the guest has not yet cleared is
//! signalled again after each of the guest's accesses until the handler clears it.
//!
//! Setting the command register's Interrupt Disable bit masks as well, independently;
//! clearing it lets a still-asserted line signal, as the kernel's vfio-pci does.

use std::fs::File;
use std::io::{ErrorKind, Read, Write};
use std::os::fd::AsRawFd;

use vfio_bindings::bindings::vfio::{
    VFIO_IRQ_SET_ACTION_MASK, VFIO_IRQ_SET_ACTION_TRIGGER, VFIO_IRQ_SET_ACTION_TYPE_MASK,
    VFIO_IRQ_SET_ACTION_UNMASK, VFIO_IRQ_SET_DATA_BOOL, VFIO_IRQ_SET_DATA_EVENTFD,
    VFIO_IRQ_SET_DATA_NONE, VFIO_IRQ_SET_DATA_TYPE_MASK, VFIO_PCI_INTX_IRQ_INDEX,
};

/// A SET_IRQS the function refuses.
#[derive(Debug, thiserror::Error)]
#[error("SET_IRQS index {index} flags {flags:#x} start {start} count {count}: {why}")]
pub struct IrqError {
    pub index: u32,
    pub flags: u32,
    pub start: u32,
    pub count: u32,
    pub why: String,
}

/// What one SET_IRQS asks for.
#[derive(Debug)]
pub enum IrqRequest {
    /// DATA_NONE | ACTION_TRIGGER, count 0: INTx off, its descriptors dropped.
    Disable,
    /// DATA_EVENTFD | ACTION_TRIGGER, count 1: INTx on, signalled through this eventfd
    /// (none: on, but signalled nowhere).
    Trigger(Option<File>),
    /// DATA_NONE | ACTION_TRIGGER, count 1: signal the eventfd once, as if the line had
    /// fired (a loopback test), without masking.
    Loopback,
    /// DATA_NONE | ACTION_MASK.
    Mask,
    /// DATA_NONE | ACTION_UNMASK.
    Unmask,
    /// DATA_EVENTFD | ACTION_UNMASK: unmask whenever this eventfd is written (none:
    /// stop watching the one before).
    UnmaskFd(Option<File>),
    /// DATA_NONE | ACTION_TRIGGER, count 0, on an index without interrupts (MSI, MSI-X,
    /// error, request): nothing to disable.
    Nothing,
}

impl IrqRequest {
    /// Check a SET_IRQS as the kernel's vfio-pci checks the ioctl.
    pub fn parse(
        index: u32,
        flags: u32,
        start: u32,
        count: u32,
        mut fds: Vec<File>,
    ) -> Result<IrqRequest, IrqError> {
        let refuse = |why: &str| IrqError {
            index,
            flags,
            start,
            count,
            why: why.to_string(),
        };
        let data = flags & VFIO_IRQ_SET_DATA_TYPE_MASK;
        let action = flags & VFIO_IRQ_SET_ACTION_TYPE_MASK;
        if flags & !(VFIO_IRQ_SET_DATA_TYPE_MASK | VFIO_IRQ_SET_ACTION_TYPE_MASK) != 0 {
            return Err(refuse("unknown flags"));
        }
        if data.count_ones() != 1 || action.count_ones() != 1 {
            return Err(refuse("not exactly one data type and one action"));
        }
        if data == VFIO_IRQ_SET_DATA_BOOL {
            return Err(refuse(
                "DATA_BOOL needs its payload, which the vfio_user server does not pass on",
            ));
        }
        if data != VFIO_IRQ_SET_DATA_EVENTFD && !fds.is_empty() {
            return Err(refuse("descriptors sent without DATA_EVENTFD"));
        }
        let disable = data == VFIO_IRQ_SET_DATA_NONE && action == VFIO_IRQ_SET_ACTION_TRIGGER;
        if index != VFIO_PCI_INTX_IRQ_INDEX {
            return if disable && count == 0 {
                Ok(IrqRequest::Nothing)
            } else {
                Err(refuse("the function has no interrupts but INTx (index 0)"))
            };
        }
        if start != 0 || count > 1 {
            return Err(refuse("INTx has one vector: start 0, count 1"));
        }
        if count == 0 {
            return if disable {
                Ok(IrqRequest::Disable)
            } else {
                Err(refuse("count 0 only with DATA_NONE | ACTION_TRIGGER"))
            };
        }
        if fds.len() > 1 {
            return Err(refuse("more than one descriptor for one vector"));
        }
        let fd = fds.pop();
        Ok(match (data, action) {
            (VFIO_IRQ_SET_DATA_EVENTFD, VFIO_IRQ_SET_ACTION_TRIGGER) => IrqRequest::Trigger(fd),
            (VFIO_IRQ_SET_DATA_EVENTFD, VFIO_IRQ_SET_ACTION_UNMASK) => IrqRequest::UnmaskFd(fd),
            (VFIO_IRQ_SET_DATA_EVENTFD, _) => {
                return Err(refuse(
                    "masking by eventfd is not supported (nor by the kernel)",
                ))
            }
            (_, VFIO_IRQ_SET_ACTION_TRIGGER) => IrqRequest::Loopback,
            (_, VFIO_IRQ_SET_ACTION_MASK) => IrqRequest::Mask,
            _ => IrqRequest::Unmask,
        })
    }
}

/// The INTx state of one client's session.
#[derive(Debug, Default)]
pub struct Intx {
    /// ACTION_TRIGGER has enabled INTx.
    enabled: bool,
    trigger: Option<File>,
    /// Written by the client to unmask (ACTION_UNMASK, DATA_EVENTFD).
    unmask_fd: Option<File>,
    /// Fired and not yet unmasked, or masked by the client.
    masked: bool,
    /// Times the trigger eventfd was written.
    signals: u64,
    /// Writes to the trigger eventfd that failed (the first is logged).
    failed: u64,
}

impl Intx {
    pub fn is_enabled(&self) -> bool {
        self.enabled
    }

    pub fn is_masked(&self) -> bool {
        self.masked
    }

    pub fn signals(&self) -> u64 {
        self.signals
    }

    pub fn unmask_fd(&self) -> Option<&File> {
        self.unmask_fd.as_ref()
    }

    /// Apply a checked request. Mask and unmask need INTx enabled, as in the kernel.
    /// Returns the unmask eventfd this replaced, if any, so the caller can stop watching
    /// it.
    pub fn apply(&mut self, req: IrqRequest) -> Result<Option<File>, String> {
        let needs_enabled = matches!(
            req,
            IrqRequest::Mask | IrqRequest::Unmask | IrqRequest::UnmaskFd(_)
        );
        if needs_enabled && !self.enabled {
            return Err("INTx is not enabled (no ACTION_TRIGGER yet)".into());
        }
        let mut replaced = None;
        match req {
            IrqRequest::Nothing => {}
            IrqRequest::Disable => {
                replaced = self.unmask_fd.take();
                *self = Intx {
                    signals: self.signals,
                    failed: self.failed,
                    ..Intx::default()
                };
            }
            IrqRequest::Trigger(fd) => {
                if let Some(f) = &fd {
                    set_nonblocking(f).map_err(|e| format!("the trigger eventfd: {e}"))?;
                }
                if !self.enabled {
                    self.masked = false;
                }
                self.enabled = true;
                self.trigger = fd;
            }
            IrqRequest::Loopback => {
                if self.enabled {
                    self.signal();
                }
            }
            IrqRequest::Mask => self.masked = true,
            IrqRequest::Unmask => self.masked = false,
            IrqRequest::UnmaskFd(fd) => {
                if let Some(f) = &fd {
                    set_nonblocking(f).map_err(|e| format!("the unmask eventfd: {e}"))?;
                }
                replaced = std::mem::replace(&mut self.unmask_fd, fd);
            }
        }
        Ok(replaced)
    }

    /// The line is `line`; signal if it may. Returns whether it signalled.
    pub fn update(&mut self, line: bool, intx_disabled: bool) -> bool {
        let may_fire = line && self.enabled && !self.masked && !intx_disabled;
        if !may_fire {
            return false;
        }
        self.masked = true;
        self.signal();
        true
    }

    /// The client wrote its unmask eventfd: consume the write. Whether there was one.
    pub fn take_unmask_event(&mut self) -> bool {
        let Some(f) = &self.unmask_fd else {
            return false;
        };
        let mut count = [0u8; 8];
        let mut f: &File = f;
        matches!(f.read(&mut count), Ok(n) if n > 0)
    }

    /// Unmask (the client's EOI).
    pub fn unmask(&mut self) {
        self.masked = false;
    }

    /// Device reset: the line drops, so a pending auto-mask goes with it.
    pub fn device_reset(&mut self) {
        self.masked = false;
    }

    fn signal(&mut self) {
        let Some(f) = &self.trigger else {
            return;
        };
        let mut f: &File = f;
        match f.write(&1u64.to_ne_bytes()) {
            Ok(_) => self.signals += 1,
            // The counter is saturated: an interrupt is already waiting there.
            Err(e) if e.kind() == ErrorKind::WouldBlock => self.signals += 1,
            Err(e) => {
                if self.failed == 0 {
                    log::warn!("INTx: writing the trigger eventfd: {e}");
                }
                self.failed += 1;
            }
        }
    }
}

/// Make a client's descriptor non-blocking, so a full eventfd (or anything else a hostile
/// client passes) can never block a thread that holds the device.
pub(super) fn set_nonblocking(f: &impl AsRawFd) -> std::io::Result<()> {
    let fd = f.as_raw_fd();
    // SAFETY: fcntl with F_GETFL and F_SETFL on a descriptor owned by `f`, which is
    // borrowed across the calls; it changes only the file status flags, and both results
    // are checked.
    unsafe {
        let flags = libc::fcntl(fd, libc::F_GETFL);
        if flags < 0 || libc::fcntl(fd, libc::F_SETFL, flags | libc::O_NONBLOCK) < 0 {
            return Err(std::io::Error::last_os_error());
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use vmm_sys_util::eventfd::{EventFd, EFD_NONBLOCK};

    const NONE_TRIGGER: u32 = VFIO_IRQ_SET_DATA_NONE | VFIO_IRQ_SET_ACTION_TRIGGER;
    const FD_TRIGGER: u32 = VFIO_IRQ_SET_DATA_EVENTFD | VFIO_IRQ_SET_ACTION_TRIGGER;

    fn eventfd() -> (EventFd, File) {
        use std::os::fd::{FromRawFd, IntoRawFd};
        let e = EventFd::new(EFD_NONBLOCK).unwrap();
        // SAFETY: into_raw_fd hands over a valid descriptor that nothing else owns.
        let f = unsafe { File::from_raw_fd(e.try_clone().unwrap().into_raw_fd()) };
        (e, f)
    }

    fn parse(
        index: u32,
        flags: u32,
        start: u32,
        count: u32,
        fds: Vec<File>,
    ) -> Result<IrqRequest, IrqError> {
        IrqRequest::parse(index, flags, start, count, fds)
    }

    #[test]
    fn set_irqs_is_checked_as_the_kernel_checks_it() {
        assert!(matches!(
            parse(0, NONE_TRIGGER, 0, 0, vec![]),
            Ok(IrqRequest::Disable)
        ));
        assert!(matches!(
            parse(0, NONE_TRIGGER, 0, 1, vec![]),
            Ok(IrqRequest::Loopback)
        ));
        assert!(matches!(
            parse(0, FD_TRIGGER, 0, 1, vec![]),
            Ok(IrqRequest::Trigger(None))
        ));
        assert!(matches!(
            parse(1, NONE_TRIGGER, 0, 0, vec![]),
            Ok(IrqRequest::Nothing)
        ));
        let bad = [
            (1, FD_TRIGGER, 0, 1),
            (0, FD_TRIGGER, 1, 1),
            (0, FD_TRIGGER, 0, 2),
            (0, FD_TRIGGER, 0, 0),
            (
                0,
                VFIO_IRQ_SET_DATA_EVENTFD | VFIO_IRQ_SET_ACTION_MASK,
                0,
                1,
            ),
            (0, VFIO_IRQ_SET_DATA_BOOL | VFIO_IRQ_SET_ACTION_UNMASK, 0, 1),
            (
                0,
                VFIO_IRQ_SET_DATA_NONE | VFIO_IRQ_SET_DATA_EVENTFD | VFIO_IRQ_SET_ACTION_MASK,
                0,
                1,
            ),
            (0, VFIO_IRQ_SET_DATA_NONE, 0, 1),
            (0, NONE_TRIGGER | 0x100, 0, 1),
        ];
        for (index, flags, start, count) in bad {
            assert!(
                parse(index, flags, start, count, vec![]).is_err(),
                "{index} {flags:#x} {start} {count}"
            );
        }
        let two = vec![eventfd().1, eventfd().1];
        assert!(
            parse(0, FD_TRIGGER, 0, 1, two).is_err(),
            "two descriptors for one vector"
        );
        assert!(
            parse(0, NONE_TRIGGER, 0, 1, vec![eventfd().1]).is_err(),
            "a descriptor with DATA_NONE"
        );
    }

    #[test]
    fn it_fires_once_masks_and_fires_again_on_unmask_while_asserted() {
        let (e, f) = eventfd();
        let mut i = Intx::default();
        assert!(!i.update(true, false), "not enabled");
        assert!(
            i.apply(IrqRequest::Mask).is_err(),
            "mask needs INTx enabled"
        );
        i.apply(IrqRequest::Trigger(Some(f))).unwrap();
        assert!(i.update(true, false));
        assert_eq!(e.read().unwrap(), 1);
        assert!(!i.update(true, false), "auto-masked");
        assert!(e.read().is_err(), "nothing more signalled");
        i.unmask();
        assert!(i.update(true, false), "still asserted: again");
        i.unmask();
        assert!(!i.update(false, false), "line low: nothing");
        assert!(!i.update(true, true), "Interrupt Disable");
        assert!(i.update(true, false), "…cleared: it fires");
        i.apply(IrqRequest::Unmask).unwrap();
        i.apply(IrqRequest::Mask).unwrap();
        assert!(!i.update(true, false), "masked by the client");
        i.apply(IrqRequest::Loopback).unwrap();
        assert_eq!(i.signals(), 4, "three fired and one loopback");
        i.apply(IrqRequest::Disable).unwrap();
        assert!(!i.is_enabled() && !i.is_masked());
        assert!(!i.update(true, false));
    }
}
