//! Asynchronous events (Base §5.1.2): the completion dword 0 of an Asynchronous
//! Event Request and the event types and information codes we post.

/// Asynchronous Event Type (Base Figure 147).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum EventType {
    ErrorStatus = 0,
    SmartHealth = 1,
    Notice = 2,
    Immediate = 3,
    OneShot = 4,
    IoCommandSpecific = 6,
    VendorSpecific = 7,
}

/// Error status event information (Base Figure 148).
pub mod error_info {
    pub const INVALID_DOORBELL_REGISTER: u8 = 0x00;
    pub const INVALID_DOORBELL_WRITE_VALUE: u8 = 0x01;
    pub const DIAGNOSTIC_FAILURE: u8 = 0x02;
    pub const PERSISTENT_INTERNAL_ERROR: u8 = 0x03;
    pub const TRANSIENT_INTERNAL_ERROR: u8 = 0x04;
}

/// SMART / Health status event information (Base Figure 149).
pub mod smart_info {
    pub const NVM_SUBSYSTEM_RELIABILITY: u8 = 0x00;
    pub const TEMPERATURE_THRESHOLD: u8 = 0x01;
    pub const SPARE_BELOW_THRESHOLD: u8 = 0x02;
}

/// Notice event information (Base Figure 150).
pub mod notice_info {
    pub const NAMESPACE_ATTRIBUTE_CHANGED: u8 = 0x00;
    pub const FIRMWARE_ACTIVATION_STARTING: u8 = 0x01;
    /// Asymmetric Namespace Access Change: the ANA log page changed.
    pub const ANA_CHANGE: u8 = 0x03;
    /// Zone Descriptor Changed (ZNS): the Changed Zone List log page of the
    /// namespace names the zones.
    pub const ZONE_DESCRIPTOR_CHANGED: u8 = 0xef;
}

/// An asynchronous event as reported in completion dword 0.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct AsyncEvent {
    pub kind: EventType,
    pub info: u8,
    /// The log page the host reads to clear the event.
    pub log_page: u8,
}

impl AsyncEvent {
    /// Completion dword 0: type in 2:0, information in 15:8, log page in 23:16.
    pub fn dw0(&self) -> u32 {
        self.kind as u32 | ((self.info as u32) << 8) | ((self.log_page as u32) << 16)
    }
}
