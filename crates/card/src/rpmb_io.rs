//! The RPMB partition on the bus: the data commands while PARTITION_ACCESS selects RPMB.
//! Each CMD23(N) + CMD25 hands N request frames to the RPMB part (`rpmb.rs`, which owns
//! the key, the write counter and the pending response) once all have arrived, and each
//! CMD23(N) + CMD18 streams N response frames from it. Frames need a CMD23 count:
//! CMD17, CMD24 and CMD18/CMD25 without one get R1 ERROR and no data phase.

use super::partition::Partition;
use super::parts::busy::OpKind;
use super::parts::data::{Sbc, Transfer};
use super::rpmb::{StoreArea, FRAME_LEN};
use super::status::r1;
use super::{Card, CardState, Exec, Handled};
use crate::timing::ProgramTarget;

impl Card {
    pub(super) fn start_rpmb_write(
        &mut self,
        x: &mut Exec,
        count: Option<u64>,
        sbc: Option<Sbc>,
    ) -> Handled {
        match (count, sbc) {
            (Some(n), Some(sbc)) if !sbc.packed && n > 0 => {
                self.data.receive(Transfer::WriteRpmb {
                    frames: n,
                    reliable: sbc.reliable,
                });
                self.state = CardState::Rcv;
                Handled::R1
            }
            _ => {
                log::debug!("RPMB access without a CMD23 block count (CMD{})", x.index);
                x.resp_status |= r1::ERROR;
                Handled::R1
            }
        }
    }

    pub(super) fn start_rpmb_read(&mut self, x: &mut Exec, count: Option<u64>) -> Handled {
        let Some(n) = count.filter(|&n| n > 0 && x.sbc.is_some_and(|s| !s.packed)) else {
            log::debug!("RPMB read without a CMD23 block count (CMD{})", x.index);
            x.resp_status |= r1::ERROR;
            return Handled::R1;
        };
        let Some(len) = usize::try_from(n)
            .ok()
            .and_then(|n| n.checked_mul(FRAME_LEN))
        else {
            x.resp_status |= r1::ERROR;
            return Handled::R1;
        };
        let extent = self.partitions.extent(Partition::Rpmb);
        let mut area = StoreArea::new(self.store.as_mut(), extent);
        let frames = self.data.fill_read_buf(len);
        let result = self.rpmb.read_frames(frames, &mut area);
        if let Err(e) = result {
            log::warn!("RPMB read: {e}");
            x.resp_status |= r1::ERROR;
            return Handled::R1;
        }
        self.send_buffer(FRAME_LEN)
    }

    pub(super) fn finish_rpmb_write(&mut self, reliable: bool) {
        let extent = self.partitions.extent(Partition::Rpmb);
        let mut area = StoreArea::new(self.store.as_mut(), extent);
        let frames = self.data.write_buf();
        let result = self.rpmb.write_frames(frames, reliable, &mut area);
        let blocks = (frames.len() / FRAME_LEN) as u32;
        match result {
            Ok(true) => self.save_persistent(),
            Ok(false) => {}
            Err(e) => {
                log::warn!("RPMB write: {e}");
                self.regs.raise(r1::ERROR);
            }
        }
        let cost = self.timing.program(
            self.now,
            &crate::timing::Program {
                sector: extent.start,
                count: blocks,
                target: ProgramTarget::Medium,
                reliable: true,
                packed_entry: false,
            },
        );
        self.begin_op(cost.busy_ns, OpKind::Busy);
    }
}
