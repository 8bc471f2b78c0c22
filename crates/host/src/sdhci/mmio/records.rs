//! Command records: what each command the guest put on the bus did, for an observer
//! outside the model (`serve --transport sdhci --trace`). Off by default; when on, the
//! model appends one [`CommandRecord`] per command as it completes, and the caller drains
//! them after each access ([`SdhciMmio::drain_command_records`]). Recording writes
//! nothing anywhere and changes nothing the guest or the card sees.
//!
//! A command without data or busy completes when its response ends; one with data or
//! busy (R1b) when its DAT phase ends: the data delivered and the card's busy over, an
//! error, an Abort command, or a DAT line or device reset (then as failed, with the
//! data error the command log gives it). So records come in completion order; while a
//! DAT phase is open, [`SdhciMmio::oldest_open_record`] says when its command was issued.
//! Commands the controller refused to issue (an inhibit) are not on the bus and have no
//! record; the controller's own Auto CMD23 and Auto CMD12 belong to their data command's.

use emmc_card::command::ResponseType;
use emmc_card::timing::Nanos;
use emmc_card::{r1, Partition};

use super::SdhciMmio;
use crate::sdhci::{DataDirection, SdhciError};

/// One completed command, as the guest issued it through the Command register.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CommandRecord {
    pub opcode: u8,
    pub arg: u32,
    /// The CMD23 argument that applies to this data command: its Auto CMD23's (Argument
    /// 2), or that of a CMD23 the guest issued just before it.
    pub sbc: Option<u32>,
    /// The response the Command register asked for.
    pub resp_type: ResponseType,
    /// Response register 0 after the command's exchange (R1: the card status).
    pub response: u32,
    /// The data phase the command started: direction, block size, blocks.
    pub data: Option<(DataDirection, u32, u32)>,
    /// The partition PARTITION_ACCESS selected when the command was issued.
    pub partition: Partition,
    /// Card time the command was issued (the Command register written).
    pub issued: Nanos,
    /// Card time it completed: its response, or the end of its data and busy.
    pub done: Nanos,
    /// The command's error (or its Auto CMD23's, which keeps the command back).
    pub error: Option<SdhciError>,
    /// Its data phase's or busy's error (an Auto CMD12 error counts as the data's).
    pub data_error: Option<SdhciError>,
    /// A write with the packed bit in its CMD23: the first 512 bytes it sent to the card
    /// (the packed header), once they went.
    pub header: Option<Box<[u8; 512]>>,
}

impl CommandRecord {
    /// The command went through without an error the guest could see: issued and
    /// answered without a controller error, no R1 error bit, its data and busy complete.
    pub fn succeeded(&self) -> bool {
        let r1_ok = !matches!(self.resp_type, ResponseType::R1 | ResponseType::R1b)
            || self.response & r1::ERRORS == 0;
        self.error.is_none() && self.data_error.is_none() && r1_ok
    }

    /// A write with the packed bit in its CMD23.
    pub(super) fn packed_write(&self) -> bool {
        matches!(self.data, Some((DataDirection::Write, _, _)))
            && self
                .sbc
                .is_some_and(|a| a & crate::mmc::MMC_CMD23_ARG_PACKED != 0)
    }
}

impl SdhciMmio {
    /// Record every command from now on (`false`: stop, and drop what is not drained).
    pub fn set_command_records(&mut self, on: bool) {
        self.records = on.then(Vec::new);
        if !on {
            if let Some(d) = self.dat.as_mut() {
                d.record = None;
            }
        }
    }

    /// The commands completed since the last drain, in completion order.
    pub fn drain_command_records(&mut self) -> impl Iterator<Item = CommandRecord> + '_ {
        self.records.iter_mut().flat_map(|r| r.drain(..))
    }

    /// When the command whose DAT phase is still open was issued: no record that
    /// completes later was issued before it.
    pub fn oldest_open_record(&self) -> Option<Nanos> {
        self.dat.as_ref()?.record.as_ref().map(|r| r.issued)
    }

    /// A record for the command being issued at `now`, if recording.
    pub(super) fn open_record(
        &self,
        opcode: u8,
        arg: u32,
        resp_type: ResponseType,
    ) -> Option<CommandRecord> {
        self.records.as_ref()?;
        Some(CommandRecord {
            opcode,
            arg,
            sbc: None,
            resp_type,
            response: 0,
            data: None,
            partition: self.card.current_partition(),
            issued: self.now,
            done: self.now,
            error: None,
            data_error: None,
            header: None,
        })
    }

    /// The record completes at `done`.
    pub(super) fn close_record(
        &mut self,
        record: Option<CommandRecord>,
        done: Nanos,
        data_error: Option<SdhciError>,
    ) {
        if let (Some(mut r), Some(records)) = (record, self.records.as_mut()) {
            r.done = done;
            r.data_error = r.data_error.or(data_error);
            records.push(r);
        }
    }
}
