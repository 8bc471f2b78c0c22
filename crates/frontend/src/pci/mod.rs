//! The SDHCI controller as a PCI function served over vfio-user (issue 14): QEMU's
//! `vfio-user-pci` device connects to the socket, and the guest's own `sdhci-pci`, MMC
//! core and `mmc_block` drive the card through BAR0.
//!
//! This module is the PCI function and the vfio-user server; the device behind BAR0 is
//! any [`PciMmio`] (the SDHCI register model of emmc-host, `crate::sdhci`; a fake in the
//! tests). The protocol is rust-vmm's `vfio_user` crate (0.1.7): its `Server` runs the
//! message loop and calls our `ServerBackend` (`function.rs`).
//!
//! | file | what |
//! |---|---|
//! | `device.rs` | [`PciMmio`], [`DmaMemory`], [`DmaError`]: the interface to the device |
//! | `identity.rs` | [`PciIdentity`]: the IDs, one table row each |
//! | `config.rs` | the type 0 configuration space, BAR0 sizing, the PM capability |
//! | `dma.rs` | the client's DMA map: memfd regions by bus address |
//! | `intx.rs` | INTx with VFIO's mask/unmask semantics; SET_IRQS checking |
//! | `function.rs` | the state both threads share, the regions and IRQs, the `ServerBackend` |
//! | `timer.rs` | the timer thread: the device's events in card time |
//! | `server.rs` | [`PciServer`]: the socket, sessions, clean-up between clients |
//!
//! # What QEMU sends
//!
//! `vfio-user-pci` (QEMU 10.1 and later) negotiates the version, asks for the device
//! info (a PCI device, resettable, 9 regions, 5 IRQ indexes) and each region's info
//! (BAR0 and the configuration space readable and writable, no mmap; BARs 1 to 5, the
//! ROM and VGA of size 0), reads the whole configuration space in one REGION_READ, and
//! from then on forwards every configuration write the guest makes ("write everything
//! to VFIO") while emulating the BAR addresses itself. It maps guest RAM with DMA_MAP,
//! one message per RAM section, each with the memfd behind it when guest memory is
//! shared (`memory-backend-memfd,share=on`), without one otherwise. It enables INTx
//! with SET_IRQS (ACTION_TRIGGER, DATA_EVENTFD); on the eventfd it asserts the guest's
//! line, and its EOI is the next BAR access: it deasserts and sends ACTION_UNMASK with
//! DATA_NONE. Under KVM it may instead register a resample eventfd (ACTION_UNMASK,
//! DATA_EVENTFD), written by KVM at the guest's EOI. System reset is: disable INTx,
//! clear the command register, DEVICE_RESET, enable INTx again.
//!
//! # Threads
//!
//! The crate's message loop blocks on the socket, so one session has two threads: the
//! message thread (the loop, every register access, map and SET_IRQS) and the timer
//! thread (`timer.rs`), which runs the device's events at their card time. Both take
//! one lock around the device, the configuration space, the DMA map and the INTx state;
//! neither sleeps or waits for the client while holding it, so no register access waits
//! behind a timer longer than one `advance` call. The timer thread waits on an epoll
//! set: a timerfd armed a margin before the next event's wall instant (then it spins
//! the rest, as the blk transport's pacing does, with the same adaptive margin), a wake
//! eventfd the message thread writes when an access makes the next event sooner than
//! the one waited for, and the client's unmask eventfd if it registered one.
//!
//! Card time: with `--timing realtime` it follows the wall clock from the session's
//! first message, `card0 + elapsed / time-scale` (`pacing::Clock`), `card0` being where
//! the previous session left it; with `--timing off` it stands still between events and
//! the timer thread jumps it to each next event at once. Before a register access, any
//! event due by the access's card time is run first, so the access sees the device as
//! of its own time even if the timer thread has not caught up. Card time never goes
//! back.
//!
//! # INTx
//!
//! After every register access, configuration write, SET_IRQS, event and unmask the
//! line is `PciMmio::irq_asserted()`, reflected in the status register's Interrupt
//! Status bit. When the line is asserted, INTx is enabled, not masked and not disabled
//! by the command register, the trigger eventfd is written once and INTx is masked
//! (VFIO_IRQ_INFO_AUTOMASKED). Nothing more is signalled until the client unmasks; an
//! unmask while the line is still asserted signals again at once and masks again. So a
//! guest that never acknowledges gets one signal per unmask, never a storm. The forms
//! (as the kernel's vfio-pci takes them, `intx.rs`): TRIGGER with DATA_EVENTFD sets or
//! (no descriptor) clears the eventfd; TRIGGER with DATA_NONE and count 1 signals once
//! (loopback), with count 0 disables INTx; MASK and UNMASK with DATA_NONE; UNMASK with
//! DATA_EVENTFD watches an eventfd; MASK with DATA_EVENTFD is refused, as the kernel
//! refuses it. DATA_BOOL never reaches us: the crate refuses it. MSI and MSI-X are not
//! offered (index 1 and 2 have no vectors and there is no MSI capability).
//!
//! # DMA
//!
//! `dma.rs`: maps with a memfd are mmapped MAP_SHARED by vm-memory, readable and
//! writable as the map's flags say; the device reaches them through [`DmaMemory`] by
//! bus address, an access entirely inside one map or an error ([`DmaError`]), also while
//! bus mastering is off or the function is in D3hot. Maps without a descriptor are
//! remembered and ignored, with a log line. Unmaps are exact; the unmap's reply is sent
//! under the lock, so no device access reaches the memory after it.
//!
//! # Sessions
//!
//! One client at a time: once a client has sent a message the others are accepted and
//! closed after a grace period (`serve::refuse_others`, as the other transports). When
//! a client leaves — closes, breaks the connection, or sends something the crate cannot
//! parse — its timer thread stops, its DMA regions are unmapped, its eventfds closed,
//! the device is power-cycled (`PciMmio::power_cycle`) and the configuration space reset,
//! and the next client is accepted on the same socket.
//!
//! # Where the protocol is silent: decisions
//!
//! - Region accesses: BAR0 takes 1, 2, 4 or 8 bytes, naturally aligned, inside BAR0,
//!   and only while memory space is enabled and the function is in D0 (as the kernel's
//!   vfio-pci returns EIO then); the configuration space takes any span inside its 256
//!   bytes. Everything else is an error reply and never reaches the device.
//! - Errors: the crate sends an error reply with errno 0 for every error our backend
//!   returns (EINVAL only for the checks it makes itself), and QEMU reads errno 0 on a
//!   SET_IRQS or DMA_MAP reply as success. Every refusal is therefore also a log line
//!   (warn) and counted in [`PciStats::refused`].
//! - Device reset keeps the DMA map and the eventfds (they are the client's IOMMU and
//!   interrupt plumbing, which a PCI reset does not touch) and clears a pending
//!   auto-mask with the line.
//! - Power management: D0 and D3hot; No_Soft_Reset is set, so D3hot to D0 keeps the
//!   device's state; no PME.
//! - Overlapping maps are refused (the kernel's type1 IOMMU refuses them too); at most
//!   1024 maps; a map past the end of its file is refused (it would raise SIGBUS). A
//!   client that shrinks its memfd after mapping can still cause one, as with any
//!   vhost-user backend (memfd seals would rule it out; QEMU seals its memfds).
//! - The crate panics on some malformed messages (a VERSION shorter than its fields, or
//!   whose capabilities are not NUL-terminated): the session's message loop runs under
//!   `catch_unwind`, so such a client ends its own session ([`SessionEnd::Panicked`])
//!   and the server goes on. The crate also leaves the payload of a refused message
//!   unread (an unknown command with a body, a DATA_BOOL SET_IRQS), which desynchronises
//!   the stream until the client goes away; QEMU sends neither.
//!
//! `DmaMemory` and `DmaError` are defined once, in emmc-host (`sdhci::mmio`), whose DMA
//! engines use them; this module re-exports them.

pub mod config;
pub mod device;
pub mod dma;
mod function;
pub mod identity;
pub mod intx;
pub mod server;
mod session_times;
mod timer;

pub use device::{DmaError, DmaMemory, PciMmio};
pub use function::{PciOptions, PciStats};
pub use identity::{PciIdentity, PciIds};
pub use server::{PciError, PciHandle, PciServer, SessionEnd};

#[cfg(test)]
mod tests;
