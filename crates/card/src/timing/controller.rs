//! The card controller's own time: command decoding and mapping lookups before the NAND
//! is touched, per entry of a packed command, CMD6 and the other register operations,
//! sleep/awake and leaving an interrupted operation (HPI).

use super::{Nanos, SwitchKind};
use crate::model::ControllerModel;

#[derive(Debug, Clone)]
pub struct Controller {
    m: ControllerModel,
}

impl Controller {
    pub fn new(m: &ControllerModel) -> Controller {
        Controller { m: m.clone() }
    }

    /// Overhead of one read command (or packed-read entry).
    pub fn read_command(&self) -> Nanos {
        self.m.read_command_ns
    }

    /// Overhead of one write command, or of one entry of a packed write.
    pub fn write_command(&self, packed_entry: bool) -> Nanos {
        if packed_entry {
            self.m.packed_entry_ns
        } else {
            self.m.write_command_ns
        }
    }

    /// The controller's part of a CMD6 (sanitize's work is the erase model's).
    pub fn switch(&self, kind: SwitchKind) -> Nanos {
        match kind {
            SwitchKind::Generic | SwitchKind::Sanitize => self.m.switch_ns,
            SwitchKind::PartitionAccess => self.m.partition_switch_ns,
            SwitchKind::PowerOffLong => self.m.power_off_ns,
        }
    }

    pub fn sleep_awake(&self) -> Nanos {
        self.m.sleep_awake_ns
    }

    pub fn hpi_exit(&self) -> Nanos {
        self.m.hpi_exit_ns
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn packed_entries_cost_their_own_overhead() {
        let c = Controller::new(&ControllerModel {
            write_command_ns: 300,
            packed_entry_ns: 40,
            read_command_ns: 20,
            ..Default::default()
        });
        assert_eq!(c.write_command(false), 300);
        assert_eq!(c.write_command(true), 40);
        assert_eq!(c.read_command(), 20);
    }

    #[test]
    fn each_switch_kind_has_its_own_time() {
        let c = Controller::new(&ControllerModel {
            switch_ns: 1,
            partition_switch_ns: 2,
            power_off_ns: 3,
            sleep_awake_ns: 4,
            hpi_exit_ns: 5,
            ..Default::default()
        });
        assert_eq!(c.switch(SwitchKind::Generic), 1);
        assert_eq!(c.switch(SwitchKind::PartitionAccess), 2);
        assert_eq!(c.switch(SwitchKind::PowerOffLong), 3);
        assert_eq!(c.sleep_awake(), 4);
        assert_eq!(c.hpi_exit(), 5);
    }
}
