//! Command opcodes, and types that print them by name in logs.

use core::fmt;

/// Admin command opcodes (Base §5, Figure 84 "Opcodes for Admin Commands").
pub mod admin {
    pub const DELETE_IO_SQ: u8 = 0x00;
    pub const CREATE_IO_SQ: u8 = 0x01;
    pub const GET_LOG_PAGE: u8 = 0x02;
    pub const DELETE_IO_CQ: u8 = 0x04;
    pub const CREATE_IO_CQ: u8 = 0x05;
    pub const IDENTIFY: u8 = 0x06;
    pub const ABORT: u8 = 0x08;
    pub const SET_FEATURES: u8 = 0x09;
    pub const GET_FEATURES: u8 = 0x0a;
    pub const ASYNC_EVENT_REQUEST: u8 = 0x0c;
    pub const NAMESPACE_MANAGEMENT: u8 = 0x0d;
    pub const FIRMWARE_COMMIT: u8 = 0x10;
    pub const FIRMWARE_DOWNLOAD: u8 = 0x11;
    pub const DEVICE_SELF_TEST: u8 = 0x14;
    pub const NAMESPACE_ATTACHMENT: u8 = 0x15;
    pub const KEEP_ALIVE: u8 = 0x18;
    pub const DIRECTIVE_SEND: u8 = 0x19;
    pub const DIRECTIVE_RECEIVE: u8 = 0x1a;
    pub const DOORBELL_BUFFER_CONFIG: u8 = 0x7c;
    pub const FORMAT_NVM: u8 = 0x80;
    pub const SECURITY_SEND: u8 = 0x81;
    pub const SECURITY_RECEIVE: u8 = 0x82;
    pub const SANITIZE: u8 = 0x84;
}

/// NVM command set I/O opcodes (NVM §3, Figure "Opcodes for NVM Commands").
pub mod nvm {
    pub const FLUSH: u8 = 0x00;
    pub const WRITE: u8 = 0x01;
    pub const READ: u8 = 0x02;
    pub const WRITE_UNCORRECTABLE: u8 = 0x04;
    pub const COMPARE: u8 = 0x05;
    pub const WRITE_ZEROES: u8 = 0x08;
    pub const DATASET_MANAGEMENT: u8 = 0x09;
    pub const VERIFY: u8 = 0x0c;
    pub const RESERVATION_REGISTER: u8 = 0x0d;
    pub const RESERVATION_REPORT: u8 = 0x0e;
    pub const RESERVATION_ACQUIRE: u8 = 0x11;
    /// I/O Management Receive (NVM §3.2.4).
    pub const IO_MGMT_RECV: u8 = 0x12;
    pub const RESERVATION_RELEASE: u8 = 0x15;
    pub const COPY: u8 = 0x19;
    /// I/O Management Send (NVM §3.2.5).
    pub const IO_MGMT_SEND: u8 = 0x1d;
}

/// Zoned Namespace Command Set I/O opcodes (ZNS §3.4).
pub mod zns {
    pub const ZONE_MGMT_SEND: u8 = 0x79;
    pub const ZONE_MGMT_RECV: u8 = 0x7a;
    pub const ZONE_APPEND: u8 = 0x7d;
}

/// An admin opcode that prints as the command's name in the Base specification
/// ("Create I/O Submission Queue"), or as hex when it names no command we know.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct AdminOpcode(pub u8);

impl AdminOpcode {
    /// The command's name, if the opcode is one listed in [`admin`].
    pub const fn name(self) -> Option<&'static str> {
        Some(match self.0 {
            admin::DELETE_IO_SQ => "Delete I/O Submission Queue",
            admin::CREATE_IO_SQ => "Create I/O Submission Queue",
            admin::GET_LOG_PAGE => "Get Log Page",
            admin::DELETE_IO_CQ => "Delete I/O Completion Queue",
            admin::CREATE_IO_CQ => "Create I/O Completion Queue",
            admin::IDENTIFY => "Identify",
            admin::ABORT => "Abort",
            admin::SET_FEATURES => "Set Features",
            admin::GET_FEATURES => "Get Features",
            admin::ASYNC_EVENT_REQUEST => "Asynchronous Event Request",
            admin::NAMESPACE_MANAGEMENT => "Namespace Management",
            admin::FIRMWARE_COMMIT => "Firmware Commit",
            admin::FIRMWARE_DOWNLOAD => "Firmware Image Download",
            admin::DEVICE_SELF_TEST => "Device Self-test",
            admin::NAMESPACE_ATTACHMENT => "Namespace Attachment",
            admin::KEEP_ALIVE => "Keep Alive",
            admin::DIRECTIVE_SEND => "Directive Send",
            admin::DIRECTIVE_RECEIVE => "Directive Receive",
            admin::DOORBELL_BUFFER_CONFIG => "Doorbell Buffer Config",
            admin::FORMAT_NVM => "Format NVM",
            admin::SECURITY_SEND => "Security Send",
            admin::SECURITY_RECEIVE => "Security Receive",
            admin::SANITIZE => "Sanitize",
            _ => return None,
        })
    }
}

/// An NVM command set I/O opcode that prints as the command's name ("Write Zeroes"),
/// or as hex when it names no command we know.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct NvmOpcode(pub u8);

impl NvmOpcode {
    /// The command's name, if the opcode is one listed in [`nvm`].
    pub const fn name(self) -> Option<&'static str> {
        Some(match self.0 {
            nvm::FLUSH => "Flush",
            nvm::WRITE => "Write",
            nvm::READ => "Read",
            nvm::WRITE_UNCORRECTABLE => "Write Uncorrectable",
            nvm::COMPARE => "Compare",
            nvm::WRITE_ZEROES => "Write Zeroes",
            nvm::DATASET_MANAGEMENT => "Dataset Management",
            nvm::VERIFY => "Verify",
            nvm::RESERVATION_REGISTER => "Reservation Register",
            nvm::RESERVATION_REPORT => "Reservation Report",
            nvm::RESERVATION_ACQUIRE => "Reservation Acquire",
            nvm::RESERVATION_RELEASE => "Reservation Release",
            nvm::COPY => "Copy",
            nvm::IO_MGMT_RECV => "I/O Management Receive",
            nvm::IO_MGMT_SEND => "I/O Management Send",
            zns::ZONE_MGMT_SEND => "Zone Management Send",
            zns::ZONE_MGMT_RECV => "Zone Management Receive",
            zns::ZONE_APPEND => "Zone Append",
            _ => return None,
        })
    }
}

fn fmt_opcode(name: Option<&str>, opcode: u8, f: &mut fmt::Formatter<'_>) -> fmt::Result {
    match name {
        Some(n) => f.write_str(n),
        None => write!(f, "opcode {opcode:#04x}"),
    }
}

impl fmt::Display for AdminOpcode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt_opcode(self.name(), self.0, f)
    }
}

impl fmt::Debug for AdminOpcode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "AdminOpcode({self})")
    }
}

impl fmt::Display for NvmOpcode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt_opcode(self.name(), self.0, f)
    }
}

impl fmt::Debug for NvmOpcode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "NvmOpcode({self})")
    }
}

#[cfg(test)]
mod tests {
    extern crate alloc;
    use alloc::format;

    use super::*;

    #[test]
    fn opcodes_print_their_spec_names() {
        assert_eq!(format!("{}", AdminOpcode(admin::CREATE_IO_SQ)), "Create I/O Submission Queue");
        assert_eq!(format!("{}", AdminOpcode(0x7c)), "Doorbell Buffer Config");
        assert_eq!(format!("{}", AdminOpcode(0x03)), "opcode 0x03");
        assert_eq!(format!("{:?}", AdminOpcode(0x06)), "AdminOpcode(Identify)");
        assert_eq!(format!("{}", NvmOpcode(nvm::WRITE_ZEROES)), "Write Zeroes");
        assert_eq!(format!("{:?}", NvmOpcode(0xff)), "NvmOpcode(opcode 0xff)");
        assert_eq!(NvmOpcode(0x02).name(), Some("Read"));
    }
}
