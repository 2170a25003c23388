//! Status field of a completion (Base §4.2.3).

/// Status Code Type (Base §4.2.3, Figure 100).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum StatusCodeType {
    Generic = 0,
    CommandSpecific = 1,
    MediaAndDataIntegrity = 2,
    PathRelated = 3,
    VendorSpecific = 7,
}

/// The 15-bit status field of a completion queue entry (without the phase tag):
/// SC in 7:0, SCT in 10:8, CRD in 12:11, M (More) in 13, DNR in 14.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Status(u16);

impl Status {
    pub const fn new(sct: StatusCodeType, sc: u8) -> Self {
        Status(((sct as u16) << 8) | sc as u16)
    }
    /// From a raw Status Code Type (3 bits) and Status Code, as another controller
    /// reported them.
    pub const fn from_parts(sct: u8, sc: u8) -> Self {
        Status((((sct & 7) as u16) << 8) | sc as u16)
    }
    pub const fn from_raw(raw: u16) -> Self {
        Status(raw & 0x7fff)
    }
    pub const fn raw(self) -> u16 {
        self.0
    }
    pub const fn sc(self) -> u8 {
        self.0 as u8
    }
    pub const fn sct(self) -> u8 {
        ((self.0 >> 8) & 7) as u8
    }
    pub const fn dnr(self) -> bool {
        self.0 & (1 << 14) != 0
    }
    pub const fn more(self) -> bool {
        self.0 & (1 << 13) != 0
    }
    /// The same status with Do Not Retry set.
    pub const fn with_dnr(self) -> Self {
        Status(self.0 | (1 << 14))
    }
    /// The same status with More set (an Error Information log entry exists).
    pub const fn with_more(self) -> Self {
        Status(self.0 | (1 << 13))
    }
    /// Command Retry Delay (bits 12:11): which of Identify Controller's CRDT1-3 the
    /// host waits before it retries (0: none).
    pub const fn crd(self) -> u8 {
        ((self.0 >> 11) & 3) as u8
    }
    /// The same status with Command Retry Delay `crd` (1-3; 0 clears it).
    pub const fn with_crd(self, crd: u8) -> Self {
        Status((self.0 & !(3 << 11)) | (((crd & 3) as u16) << 11))
    }
    pub const fn is_success(self) -> bool {
        self.0 & 0x7ff == 0
    }
    /// SCT and SC only, without DNR/More/CRD: for comparing what went wrong.
    pub const fn code(self) -> Self {
        Status(self.0 & 0x7ff)
    }

    // Generic Command Status (Base §4.2.3.1, Figure 101).
    pub const SUCCESS: Status = Status::new(StatusCodeType::Generic, 0x00);
    pub const INVALID_OPCODE: Status = Status::new(StatusCodeType::Generic, 0x01);
    pub const INVALID_FIELD: Status = Status::new(StatusCodeType::Generic, 0x02);
    pub const CID_CONFLICT: Status = Status::new(StatusCodeType::Generic, 0x03);
    pub const DATA_TRANSFER_ERROR: Status = Status::new(StatusCodeType::Generic, 0x04);
    pub const POWER_LOSS_ABORT: Status = Status::new(StatusCodeType::Generic, 0x05);
    pub const INTERNAL_ERROR: Status = Status::new(StatusCodeType::Generic, 0x06);
    pub const ABORT_REQUESTED: Status = Status::new(StatusCodeType::Generic, 0x07);
    pub const ABORT_SQ_DELETION: Status = Status::new(StatusCodeType::Generic, 0x08);
    pub const ABORT_FUSED_FAILED: Status = Status::new(StatusCodeType::Generic, 0x09);
    pub const ABORT_FUSED_MISSING: Status = Status::new(StatusCodeType::Generic, 0x0a);
    pub const INVALID_NAMESPACE: Status = Status::new(StatusCodeType::Generic, 0x0b);
    pub const COMMAND_SEQUENCE_ERROR: Status = Status::new(StatusCodeType::Generic, 0x0c);
    pub const INVALID_SGL_SEGMENT_DESCRIPTOR: Status = Status::new(StatusCodeType::Generic, 0x0d);
    pub const INVALID_SGL_DESCRIPTOR_COUNT: Status = Status::new(StatusCodeType::Generic, 0x0e);
    pub const DATA_SGL_LENGTH_INVALID: Status = Status::new(StatusCodeType::Generic, 0x0f);
    pub const METADATA_SGL_LENGTH_INVALID: Status = Status::new(StatusCodeType::Generic, 0x10);
    pub const SGL_DESCRIPTOR_TYPE_INVALID: Status = Status::new(StatusCodeType::Generic, 0x11);
    pub const INVALID_CMB_USE: Status = Status::new(StatusCodeType::Generic, 0x12);
    pub const PRP_OFFSET_INVALID: Status = Status::new(StatusCodeType::Generic, 0x13);
    pub const ATOMIC_WRITE_UNIT_EXCEEDED: Status = Status::new(StatusCodeType::Generic, 0x14);
    pub const OPERATION_DENIED: Status = Status::new(StatusCodeType::Generic, 0x15);
    pub const SGL_OFFSET_INVALID: Status = Status::new(StatusCodeType::Generic, 0x16);
    /// Set Features Host Identifier of another format than the host ID in use.
    pub const HOST_IDENTIFIER_INCONSISTENT_FORMAT: Status = Status::new(StatusCodeType::Generic, 0x18);
    /// The Keep Alive Timer expired (what the Error Information log records).
    pub const KEEP_ALIVE_TIMER_EXPIRED: Status = Status::new(StatusCodeType::Generic, 0x19);
    /// A command aborted because a Reservation Acquire preempted its host.
    pub const ABORT_PREEMPT: Status = Status::new(StatusCodeType::Generic, 0x1b);
    pub const COMMAND_INTERRUPTED: Status = Status::new(StatusCodeType::Generic, 0x21);
    /// A Flexible Data Placement command while FDP is disabled.
    pub const FDP_DISABLED: Status = Status::new(StatusCodeType::Generic, 0x29);
    pub const INVALID_PLACEMENT_HANDLE_LIST: Status = Status::new(StatusCodeType::Generic, 0x2a);
    // Generic Command Status, NVM command set values (Base Figure 102).
    pub const NAMESPACE_WRITE_PROTECTED: Status = Status::new(StatusCodeType::Generic, 0x20);
    pub const LBA_OUT_OF_RANGE: Status = Status::new(StatusCodeType::Generic, 0x80);
    pub const CAPACITY_EXCEEDED: Status = Status::new(StatusCodeType::Generic, 0x81);
    pub const NAMESPACE_NOT_READY: Status = Status::new(StatusCodeType::Generic, 0x82);
    /// The command conflicts with a reservation on the namespace.
    pub const RESERVATION_CONFLICT: Status = Status::new(StatusCodeType::Generic, 0x83);
    pub const FORMAT_IN_PROGRESS: Status = Status::new(StatusCodeType::Generic, 0x84);

    // Command Specific Status (Base §4.2.3.2, Figure 103).
    pub const COMPLETION_QUEUE_INVALID: Status = Status::new(StatusCodeType::CommandSpecific, 0x00);
    pub const INVALID_QUEUE_IDENTIFIER: Status = Status::new(StatusCodeType::CommandSpecific, 0x01);
    pub const INVALID_QUEUE_SIZE: Status = Status::new(StatusCodeType::CommandSpecific, 0x02);
    pub const ABORT_COMMAND_LIMIT_EXCEEDED: Status = Status::new(StatusCodeType::CommandSpecific, 0x03);
    pub const AER_LIMIT_EXCEEDED: Status = Status::new(StatusCodeType::CommandSpecific, 0x05);
    pub const INVALID_INTERRUPT_VECTOR: Status = Status::new(StatusCodeType::CommandSpecific, 0x08);
    pub const INVALID_LOG_PAGE: Status = Status::new(StatusCodeType::CommandSpecific, 0x09);
    pub const INVALID_FORMAT: Status = Status::new(StatusCodeType::CommandSpecific, 0x0a);
    pub const INVALID_QUEUE_DELETION: Status = Status::new(StatusCodeType::CommandSpecific, 0x0c);
    pub const FEATURE_NOT_SAVEABLE: Status = Status::new(StatusCodeType::CommandSpecific, 0x0d);
    pub const FEATURE_NOT_CHANGEABLE: Status = Status::new(StatusCodeType::CommandSpecific, 0x0e);
    pub const FEATURE_NOT_NS_SPECIFIC: Status = Status::new(StatusCodeType::CommandSpecific, 0x0f);
    pub const IO_COMMAND_SET_COMBINATION_REJECTED: Status =
        Status::new(StatusCodeType::CommandSpecific, 0x2b);
    // Namespace Management and Attachment (Base Figures "Namespace Management -
    // Command Specific Status Values" and "Namespace Attachment - ...").
    /// Creating the namespace would take more than the capacity left.
    pub const NAMESPACE_INSUFFICIENT_CAPACITY: Status = Status::new(StatusCodeType::CommandSpecific, 0x15);
    /// No NSID is left to give.
    pub const NAMESPACE_IDENTIFIER_UNAVAILABLE: Status = Status::new(StatusCodeType::CommandSpecific, 0x16);
    pub const NAMESPACE_ALREADY_ATTACHED: Status = Status::new(StatusCodeType::CommandSpecific, 0x18);
    /// A private namespace named for more than one controller.
    pub const NAMESPACE_IS_PRIVATE: Status = Status::new(StatusCodeType::CommandSpecific, 0x19);
    pub const NAMESPACE_NOT_ATTACHED: Status = Status::new(StatusCodeType::CommandSpecific, 0x1a);
    /// NCAP below NSZE where thin provisioning is not offered.
    pub const THIN_PROVISIONING_NOT_SUPPORTED: Status = Status::new(StatusCodeType::CommandSpecific, 0x1b);
    /// The list names a controller the subsystem does not have, or is malformed.
    pub const CONTROLLER_LIST_INVALID: Status = Status::new(StatusCodeType::CommandSpecific, 0x1c);
    /// A namespace created in an ANA group the controller does not have.
    pub const ANA_GROUP_IDENTIFIER_INVALID: Status = Status::new(StatusCodeType::CommandSpecific, 0x24);
    // Command Specific Status, NVM command set values (NVM Figure "Status Code -
    // Command Specific Status Values").
    pub const CONFLICTING_ATTRIBUTES: Status = Status::new(StatusCodeType::CommandSpecific, 0x80);
    pub const INVALID_PROTECTION_INFORMATION: Status = Status::new(StatusCodeType::CommandSpecific, 0x81);
    pub const WRITE_TO_READ_ONLY_RANGE: Status = Status::new(StatusCodeType::CommandSpecific, 0x82);
    /// A Copy past MSSRL, MCL or MSRC.
    pub const COMMAND_SIZE_LIMIT_EXCEEDED: Status = Status::new(StatusCodeType::CommandSpecific, 0x83);
    // Command Specific Status, Zoned Namespace command set values (ZNS Figure
    // "Status Code - Command Specific Status Values").
    pub const ZONE_BOUNDARY_ERROR: Status = Status::new(StatusCodeType::CommandSpecific, 0xb8);
    pub const ZONE_IS_FULL: Status = Status::new(StatusCodeType::CommandSpecific, 0xb9);
    pub const ZONE_IS_READ_ONLY: Status = Status::new(StatusCodeType::CommandSpecific, 0xba);
    pub const ZONE_IS_OFFLINE: Status = Status::new(StatusCodeType::CommandSpecific, 0xbb);
    pub const ZONE_INVALID_WRITE: Status = Status::new(StatusCodeType::CommandSpecific, 0xbc);
    pub const TOO_MANY_ACTIVE_ZONES: Status = Status::new(StatusCodeType::CommandSpecific, 0xbd);
    pub const TOO_MANY_OPEN_ZONES: Status = Status::new(StatusCodeType::CommandSpecific, 0xbe);
    pub const INVALID_ZONE_STATE_TRANSITION: Status = Status::new(StatusCodeType::CommandSpecific, 0xbf);

    // Media and Data Integrity Errors (Base §4.2.3.3, Figure 104; NVM values).
    pub const WRITE_FAULT: Status = Status::new(StatusCodeType::MediaAndDataIntegrity, 0x80);
    pub const UNRECOVERED_READ_ERROR: Status = Status::new(StatusCodeType::MediaAndDataIntegrity, 0x81);
    pub const END_TO_END_GUARD_CHECK_ERROR: Status = Status::new(StatusCodeType::MediaAndDataIntegrity, 0x82);
    pub const END_TO_END_APPLICATION_TAG_CHECK_ERROR: Status =
        Status::new(StatusCodeType::MediaAndDataIntegrity, 0x83);
    pub const END_TO_END_REFERENCE_TAG_CHECK_ERROR: Status =
        Status::new(StatusCodeType::MediaAndDataIntegrity, 0x84);
    pub const COMPARE_FAILURE: Status = Status::new(StatusCodeType::MediaAndDataIntegrity, 0x85);
    pub const ACCESS_DENIED: Status = Status::new(StatusCodeType::MediaAndDataIntegrity, 0x86);
    pub const DEALLOCATED_OR_UNWRITTEN: Status = Status::new(StatusCodeType::MediaAndDataIntegrity, 0x87);

    /// Internal Path Error (Base §4.2.3.4).
    pub const INTERNAL_PATH_ERROR: Status = Status::new(StatusCodeType::PathRelated, 0x00);
    /// Asymmetric Access Persistent Loss (Base §8.1.1.6).
    pub const ASYMMETRIC_ACCESS_PERSISTENT_LOSS: Status = Status::new(StatusCodeType::PathRelated, 0x01);
    /// Asymmetric Access Inaccessible (Base §8.1.1.5).
    pub const ASYMMETRIC_ACCESS_INACCESSIBLE: Status = Status::new(StatusCodeType::PathRelated, 0x02);
    /// Asymmetric Access Transition (Base §8.1.1.7).
    pub const ASYMMETRIC_ACCESS_TRANSITION: Status = Status::new(StatusCodeType::PathRelated, 0x03);
}

impl Status {
    /// The status's name as the specification writes it, for the common ones
    /// (flags such as DNR ignored).
    pub fn name(self) -> Option<&'static str> {
        Some(match self.code() {
            Status::SUCCESS => "Successful Completion",
            Status::INVALID_OPCODE => "Invalid Command Opcode",
            Status::INVALID_FIELD => "Invalid Field in Command",
            Status::CID_CONFLICT => "Command ID Conflict",
            Status::DATA_TRANSFER_ERROR => "Data Transfer Error",
            Status::POWER_LOSS_ABORT => "Commands Aborted due to Power Loss Notification",
            Status::INTERNAL_ERROR => "Internal Error",
            Status::ABORT_REQUESTED => "Command Abort Requested",
            Status::ABORT_SQ_DELETION => "Command Aborted due to SQ Deletion",
            Status::INVALID_NAMESPACE => "Invalid Namespace or Format",
            Status::NAMESPACE_INSUFFICIENT_CAPACITY => "Namespace Insufficient Capacity",
            Status::NAMESPACE_IDENTIFIER_UNAVAILABLE => "Namespace Identifier Unavailable",
            Status::NAMESPACE_ALREADY_ATTACHED => "Namespace Already Attached",
            Status::NAMESPACE_IS_PRIVATE => "Namespace Is Private",
            Status::NAMESPACE_NOT_ATTACHED => "Namespace Not Attached",
            Status::THIN_PROVISIONING_NOT_SUPPORTED => "Thin Provisioning Not Supported",
            Status::CONTROLLER_LIST_INVALID => "Controller List Invalid",
            Status::ANA_GROUP_IDENTIFIER_INVALID => "ANA Group Identifier Invalid",
            Status::COMMAND_SEQUENCE_ERROR => "Command Sequence Error",
            Status::PRP_OFFSET_INVALID => "PRP Offset Invalid",
            Status::OPERATION_DENIED => "Operation Denied",
            Status::NAMESPACE_WRITE_PROTECTED => "Namespace is Write Protected",
            Status::COMMAND_INTERRUPTED => "Command Interrupted",
            Status::LBA_OUT_OF_RANGE => "LBA Out of Range",
            Status::CAPACITY_EXCEEDED => "Capacity Exceeded",
            Status::NAMESPACE_NOT_READY => "Namespace Not Ready",
            Status::RESERVATION_CONFLICT => "Reservation Conflict",
            Status::ABORT_PREEMPT => "Command Aborted due to Preempt and Abort",
            Status::HOST_IDENTIFIER_INCONSISTENT_FORMAT => "Host Identifier Inconsistent Format",
            Status::KEEP_ALIVE_TIMER_EXPIRED => "Keep Alive Timer Expired",
            Status::FORMAT_IN_PROGRESS => "Format In Progress",
            Status::COMPLETION_QUEUE_INVALID => "Completion Queue Invalid",
            Status::INVALID_QUEUE_IDENTIFIER => "Invalid Queue Identifier",
            Status::INVALID_QUEUE_SIZE => "Invalid Queue Size",
            Status::INVALID_INTERRUPT_VECTOR => "Invalid Interrupt Vector",
            Status::INVALID_LOG_PAGE => "Invalid Log Page",
            Status::INVALID_FORMAT => "Invalid Format",
            Status::INVALID_QUEUE_DELETION => "Invalid Queue Deletion",
            Status::FEATURE_NOT_SAVEABLE => "Feature Identifier Not Saveable",
            Status::FEATURE_NOT_CHANGEABLE => "Feature Not Changeable",
            Status::IO_COMMAND_SET_COMBINATION_REJECTED => "I/O Command Set Combination Rejected",
            Status::CONFLICTING_ATTRIBUTES => "Conflicting Attributes",
            Status::INVALID_PROTECTION_INFORMATION => "Invalid Protection Information",
            Status::WRITE_TO_READ_ONLY_RANGE => "Attempted Write to Read Only Range",
            Status::COMMAND_SIZE_LIMIT_EXCEEDED => "Command Size Limit Exceeded",
            Status::ZONE_BOUNDARY_ERROR => "Zone Boundary Error",
            Status::ZONE_IS_FULL => "Zone Is Full",
            Status::ZONE_IS_READ_ONLY => "Zone Is Read Only",
            Status::ZONE_IS_OFFLINE => "Zone Is Offline",
            Status::ZONE_INVALID_WRITE => "Zone Invalid Write",
            Status::TOO_MANY_ACTIVE_ZONES => "Too Many Active Zones",
            Status::TOO_MANY_OPEN_ZONES => "Too Many Open Zones",
            Status::INVALID_ZONE_STATE_TRANSITION => "Invalid Zone State Transition",
            Status::WRITE_FAULT => "Write Fault",
            Status::UNRECOVERED_READ_ERROR => "Unrecovered Read Error",
            Status::COMPARE_FAILURE => "Compare Failure",
            Status::ACCESS_DENIED => "Access Denied",
            Status::INTERNAL_PATH_ERROR => "Internal Path Error",
            Status::ASYMMETRIC_ACCESS_PERSISTENT_LOSS => "Asymmetric Access Persistent Loss",
            Status::ASYMMETRIC_ACCESS_INACCESSIBLE => "Asymmetric Access Inaccessible",
            Status::ASYMMETRIC_ACCESS_TRANSITION => "Asymmetric Access Transition",
            _ => return None,
        })
    }
}

/// For people: the name where known, then the code, e.g. `LBA Out of Range (SCT
/// 0x0, SC 0x80, DNR)`.
impl core::fmt::Display for Status {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        if let Some(n) = self.name() {
            write!(f, "{n} (")?;
        } else {
            f.write_str("status (")?;
        }
        write!(f, "SCT {:#x}, SC {:#04x}", self.sct(), self.sc())?;
        if self.dnr() {
            f.write_str(", DNR")?;
        }
        f.write_str(")")
    }
}

impl core::fmt::Debug for Status {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        write!(f, "Status(sct={:#x}, sc={:#04x}", self.sct(), self.sc())?;
        if self.dnr() {
            f.write_str(", dnr")?;
        }
        if self.more() {
            f.write_str(", more")?;
        }
        f.write_str(")")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn status_bits() {
        let s = Status::INVALID_QUEUE_IDENTIFIER.with_dnr();
        assert_eq!(s.sct(), 1);
        assert_eq!(s.sc(), 1);
        assert!(s.dnr());
        assert_eq!(s.code(), Status::INVALID_QUEUE_IDENTIFIER);
        assert!(!s.is_success());
        assert!(Status::SUCCESS.is_success());
        assert_eq!(Status::from_raw(s.raw()), s);
        extern crate std;
        use std::string::ToString;
        assert_eq!(s.to_string(), "Invalid Queue Identifier (SCT 0x1, SC 0x01, DNR)");
        assert_eq!(Status::from_parts(7, 0xc0).to_string(), "status (SCT 0x7, SC 0xc0)");
    }

    #[test]
    fn command_retry_delay_sits_in_bits_12_11() {
        let s = Status::NAMESPACE_NOT_READY.with_crd(2);
        assert_eq!(s.crd(), 2);
        assert_eq!(s.raw() >> 11 & 3, 2);
        assert_eq!(s.code(), Status::NAMESPACE_NOT_READY);
        assert!(!s.dnr() && !s.more());
        assert_eq!(s.with_crd(0), Status::NAMESPACE_NOT_READY);
        assert_eq!(Status::INTERNAL_ERROR.with_dnr().with_crd(3).crd(), 3);
    }
}
