//! The rig of the backends' unit tests (`blk/tests.rs`, `mmc/tests.rs`): the card model
//! both serve, guest memory handed to a backend, split virtqueues in it that the test
//! fills as a guest driver would (descriptor chains, the avail ring) and reads back (the
//! used ring), and the backend's event handler run over them.
//!
//! It lives here, as a `#[cfg(test)]` module of emmc-frontend, rather than in the
//! `emmc-test-support` crate: its only users are this crate's own unit tests, which could
//! not take a helper crate that depends on emmc-frontend (cargo would build a second
//! emmc-frontend whose types do not match), and keeping it here keeps emmc-test-support
//! free of vhost, virtio and guest-memory crates that the card's tests have no use for.
//! What the rig knows of a backend is only the `VhostUserBackend` trait, so both
//! backends (and a third frontend's) use it as it is.

use emmc_card::model::{ConstantTimingModel, DeviceModel, TimingModel};
use emmc_card::store::MemStore;
use emmc_card::Card;
use vhost_user_backend::{VhostUserBackend, VringRwLock, VringT};
use virtio_queue::desc::{split::Descriptor as SplitDescriptor, RawDescriptor};
use virtio_queue::mock::MockSplitQueue;
use vm_memory::{Bytes, GuestAddress, GuestAddressSpace, GuestMemoryAtomic, GuestMemoryMmap};
use vmm_sys_util::epoll::EventSet;

/// Entries in every test queue.
pub(crate) const QUEUE_LEN: u16 = 64;
/// VIRTQ_DESC_F_NEXT.
const F_NEXT: u16 = 1;
/// VIRTQ_DESC_F_WRITE.
const F_WRITE: u16 = 2;
/// Size of the guest memory the rigs hand out, from guest address 0.
pub(crate) const GUEST_MEMORY: u64 = 0x100_0000;

/// generic-emmc45 grown to 4 GiB (sector addressing; sparse in memory), on constant-cost
/// timing that takes `program_ns` to program a write.
pub(crate) fn model(program_ns: u64) -> DeviceModel {
    let mut m = DeviceModel::load("generic-emmc45").unwrap();
    m.ext_csd.sec_count = 8 << 20; // 4 GiB: sector addressing, sparse in memory
    m.timing = TimingModel::Constant(ConstantTimingModel {
        program_command_ns: program_ns,
        ..Default::default()
    });
    m
}

/// A card of `model` on an in-memory store.
pub(crate) fn mem_card(model: &DeviceModel) -> Card {
    let layout = Card::layout_for(model);
    Card::new(model.clone(), Box::new(MemStore::new(layout))).unwrap()
}

/// 16 MiB of guest memory at guest address 0, handed to `backend` as a frontend's memory
/// table would be.
pub(crate) fn guest_memory<B>(backend: &B) -> GuestMemoryAtomic<GuestMemoryMmap>
where
    B: VhostUserBackend<Bitmap = ()>,
{
    let guest = GuestMemoryMmap::from_ranges(&[(GuestAddress(0), GUEST_MEMORY as usize)]).unwrap();
    let mem = GuestMemoryAtomic::new(guest);
    backend.update_memory(mem.clone()).unwrap();
    mem
}

/// Runs `backend`'s handler for `event` (a queue index, or the backend's timer event)
/// over `vrings`, as the vhost-user daemon's epoll loop does.
pub(crate) fn handle_event<B>(backend: &B, event: u16, vrings: &[VringRwLock])
where
    B: VhostUserBackend<Vring = VringRwLock>,
{
    backend
        .handle_event(event, EventSet::IN, vrings, 0)
        .unwrap();
}

/// One split virtqueue in guest memory, driven as a guest driver drives it: chains of
/// descriptors go into the table and the avail ring, completions come back from the used
/// ring. The fields say where the mock queue put its structures, for tests that touch
/// the rings directly.
pub(crate) struct GuestQueue {
    /// The backend's view of this queue, set up and enabled.
    pub(crate) vring: VringRwLock,
    mem: GuestMemoryAtomic<GuestMemoryMmap>,
    pub(crate) desc_table: u64,
    pub(crate) avail: u64,
    pub(crate) used_ring: u64,
    /// Next free descriptor index.
    next_desc: u16,
    /// Next avail slot: the avail index once everything staged is published.
    pub(crate) next_avail: u16,
    /// Used-ring entries already returned by [`GuestQueue::used`].
    seen_used: u16,
}

impl GuestQueue {
    /// A ready, enabled queue of [`QUEUE_LEN`] entries whose structures (descriptor
    /// table, avail ring, used ring) start at guest address `base`.
    pub(crate) fn new(mem: &GuestMemoryAtomic<GuestMemoryMmap>, base: u64) -> GuestQueue {
        let guard = mem.memory();
        let q = MockSplitQueue::create(&*guard, GuestAddress(base), QUEUE_LEN);
        let vring = VringRwLock::new(mem.clone(), QUEUE_LEN).unwrap();
        vring.set_queue_size(QUEUE_LEN);
        vring
            .set_queue_info(q.desc_table_addr().0, q.avail_addr().0, q.used_addr().0)
            .unwrap();
        vring.set_queue_ready(true);
        vring.set_enabled(true);
        GuestQueue {
            vring,
            mem: mem.clone(),
            desc_table: q.desc_table_addr().0,
            avail: q.avail_addr().0,
            used_ring: q.used_addr().0,
            next_desc: 0,
            next_avail: 0,
            seen_used: 0,
        }
    }

    /// Writes a chain of (addr, len, device-writable) descriptors and its avail slot, but
    /// not yet the avail index; returns the chain's head index.
    pub(crate) fn stage(&mut self, descs: &[(u64, u32, bool)]) -> u16 {
        let m = self.mem.memory();
        let head = self.next_desc;
        for (i, &(addr, len, w)) in descs.iter().enumerate() {
            let idx = self.next_desc;
            self.next_desc = (self.next_desc + 1) % QUEUE_LEN;
            let last = i + 1 == descs.len();
            let flags = if w { F_WRITE } else { 0 } | if last { 0 } else { F_NEXT };
            let d = RawDescriptor::from(SplitDescriptor::new(addr, len, flags, self.next_desc));
            m.write_obj(d, GuestAddress(self.desc_table + 16 * u64::from(idx)))
                .unwrap();
        }
        let slot = self.avail + 4 + 2 * u64::from(self.next_avail % QUEUE_LEN);
        m.write_obj(u16::to_le(head), GuestAddress(slot)).unwrap();
        self.next_avail = self.next_avail.wrapping_add(1);
        head
    }

    /// Makes the staged chains available (what the driver does before kicking).
    pub(crate) fn publish(&self) {
        let m = self.mem.memory();
        m.write_obj(u16::to_le(self.next_avail), GuestAddress(self.avail + 2))
            .unwrap();
    }

    /// What `publish` does, to be done later from another thread (the driver making a
    /// request available while the device thread is busy).
    pub(crate) fn publisher(&self) -> impl FnOnce() + Send + 'static {
        let (mem, at, idx) = (self.mem.clone(), self.avail + 2, self.next_avail);
        move || {
            mem.memory()
                .write_obj(u16::to_le(idx), GuestAddress(at))
                .unwrap()
        }
    }

    /// Stages a chain and publishes it; returns its head index.
    pub(crate) fn push(&mut self, descs: &[(u64, u32, bool)]) -> u16 {
        let head = self.stage(descs);
        self.publish();
        head
    }

    /// Used-ring entries added since the last call: (id, len).
    pub(crate) fn used(&mut self) -> Vec<(u32, u32)> {
        let m = self.mem.memory();
        let idx = u16::from_le(m.read_obj::<u16>(GuestAddress(self.used_ring + 2)).unwrap());
        let mut out = Vec::new();
        while self.seen_used != idx {
            let at = self.used_ring + 4 + 8 * u64::from(self.seen_used % QUEUE_LEN);
            let id = u32::from_le(m.read_obj::<u32>(GuestAddress(at)).unwrap());
            let len = u32::from_le(m.read_obj::<u32>(GuestAddress(at + 4)).unwrap());
            out.push((id, len));
            self.seen_used = self.seen_used.wrapping_add(1);
        }
        out
    }
}

/// What both transports' traced test sessions send (`mmc/tests.rs`, `sdhci/trace.rs`),
/// as the simulator reads it back from their `--trace` text.
pub(crate) const TRACED_SESSION_OPS: [(emmc_host::trace::Op, u64, u32); 6] = {
    use emmc_host::trace::Op;
    [
        (Op::WriteReliable, 1000, 8),
        (Op::Read, 1000, 16),
        (Op::Write, 2000, 8),
        (Op::WriteReliable, 3000, 4),
        (Op::Flush, 0, 0),
        (Op::Discard, 4096, 5),
    ]
};

/// The requests of a `--trace` text, parsed with the simulator's own parser.
pub(crate) fn trace_ops(text: &str) -> Vec<(emmc_host::trace::Op, u64, u32)> {
    let mut trace = emmc_host::trace::Trace::parse(text.as_bytes()).expect("parses");
    let mut ops = Vec::new();
    while let Some(r) = trace.next_request() {
        ops.push((r.op, r.lba, r.sectors));
    }
    ops
}
