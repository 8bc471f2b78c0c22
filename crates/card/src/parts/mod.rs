//! The parts a [`Card`](crate::Card) is composed of. Each part owns its state and the
//! logic that touches only that state, behind small methods, and has its own unit tests;
//! the card keeps the orchestration: command dispatch and the rules that span parts
//! (a write checks the partition *and* write protection, then goes busy …).
//!
//! - [`registers`]: CID, CSD, EXT_CSD bytes, BUS_WIDTH, RCA, R1 status bits.
//! - [`partitions`]: the partition geometry in effect, and whether partitioning applied.
//! - [`data`]: the data phase in progress: CMD16 block length, CMD23 count, the
//!   transfer, the write and read buffers, packed-read entries and packed failure.
//! - [`erase`]: the CMD35/36/38 sequence in progress and the secure-trim marks.
//! - [`faults`]: a fault plan's refusal of the next command or failure of the next
//!   packed write.
//! - [`busy`]: the operation keeping the card busy, until when, and the background work
//!   owed.
//! - [`protection`]: write-protect groups, boot-area protection, the CMD42 password and
//!   lock.
//!
//! Two more parts predate this module and live where their public types are: the RPMB
//! engine ([`Rpmb`](crate::rpmb::Rpmb): key, write counter, pending response, result
//! register) and the volatile cache (`cache.rs`: acknowledged writes not yet durable).

pub(crate) mod busy;
pub(crate) mod data;
pub(crate) mod erase;
pub(crate) mod faults;
pub(crate) mod partitions;
pub(crate) mod protection;
pub(crate) mod registers;
