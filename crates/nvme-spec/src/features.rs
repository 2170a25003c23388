//! Feature identifiers and the fields of the features we implement (Base §5.1.25).

/// Feature Identifiers (Base Figure 317).
pub mod fid {
    pub const ARBITRATION: u8 = 0x01;
    pub const POWER_MANAGEMENT: u8 = 0x02;
    pub const TEMPERATURE_THRESHOLD: u8 = 0x04;
    pub const ERROR_RECOVERY: u8 = 0x05;
    pub const VOLATILE_WRITE_CACHE: u8 = 0x06;
    pub const NUMBER_OF_QUEUES: u8 = 0x07;
    pub const INTERRUPT_COALESCING: u8 = 0x08;
    pub const INTERRUPT_VECTOR_CONFIG: u8 = 0x09;
    pub const WRITE_ATOMICITY_NORMAL: u8 = 0x0a;
    pub const ASYNC_EVENT_CONFIG: u8 = 0x0b;
    pub const AUTONOMOUS_POWER_STATE: u8 = 0x0c;
    pub const HOST_MEMORY_BUFFER: u8 = 0x0d;
    pub const TIMESTAMP: u8 = 0x0e;
    /// I/O Command Set Profile (Base §5.1.25.1.19): which combination of
    /// Identify CNS 1Ch is in use.
    pub const IO_COMMAND_SET_PROFILE: u8 = 0x19;
    pub const KEEP_ALIVE_TIMER: u8 = 0x0f;
    pub const HOST_BEHAVIOR_SUPPORT: u8 = 0x16;
    /// Flexible Data Placement (endurance group: CDW11 names it).
    pub const FDP: u8 = 0x1d;
    /// FDP Events (namespace and placement handle specific).
    pub const FDP_EVENTS: u8 = 0x1e;
}

/// The Host Behavior Support feature's data (Base: Set / Get Features, Host Behavior Support; a
/// 512-byte buffer): what the host tells the controller it does.
pub mod host_behavior {
    /// Bytes of the data structure.
    pub const LEN: usize = 512;
    /// Byte 0, bit 0: Advanced Command Retry Enable (the host honours CRD).
    pub const ACRE: usize = 0;
}

/// Get Features "supported capabilities" bits (Base Figure 192).
pub mod capability {
    pub const SAVEABLE: u32 = 1 << 0;
    pub const NAMESPACE_SPECIFIC: u32 = 1 << 1;
    pub const CHANGEABLE: u32 = 1 << 2;
}

/// Arbitration (Base §5.1.25.1.1): AB in 2:0 (burst = `1 << ab`, 7 = no limit).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Arbitration(pub u32);

impl Arbitration {
    /// Arbitration Burst: the most commands taken from one SQ in a turn.
    pub fn burst(self) -> Option<u32> {
        match self.0 & 7 {
            7 => None,
            ab => Some(1 << ab),
        }
    }
}

/// Power Management (Base §5.1.25.1.2): PS in 4:0, WH in 7:5.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PowerManagement(pub u32);

impl PowerManagement {
    pub fn ps(self) -> u8 {
        (self.0 & 0x1f) as u8
    }
    pub fn wh(self) -> u8 {
        ((self.0 >> 5) & 7) as u8
    }
}

/// Temperature Threshold (Base §5.1.25.1.4).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TemperatureThreshold(pub u32);

impl TemperatureThreshold {
    /// Temperature Threshold in kelvins.
    pub fn tmpth(self) -> u16 {
        self.0 as u16
    }
    /// Threshold Temperature Select (0 = composite, 1..8 = sensors, 15 = all).
    pub fn tmpsel(self) -> u8 {
        ((self.0 >> 16) & 0xf) as u8
    }
    /// Threshold Type Select: 0 over temperature, 1 under temperature.
    pub fn thsel(self) -> u8 {
        ((self.0 >> 20) & 3) as u8
    }
}

/// Error Recovery (Base §5.1.25.1.5): TLER in 15:0, DULBE bit 16.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ErrorRecovery(pub u32);

impl ErrorRecovery {
    pub fn tler(self) -> u16 {
        self.0 as u16
    }
    /// Deallocated or Unwritten Logical Block Error Enable.
    pub fn dulbe(self) -> bool {
        self.0 & (1 << 16) != 0
    }
}

/// Number of Queues (Base §5.1.25.1.7): both counts 0's based.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct NumberOfQueues(pub u32);

impl NumberOfQueues {
    pub fn nsqr_z(self) -> u16 {
        self.0 as u16
    }
    pub fn ncqr_z(self) -> u16 {
        (self.0 >> 16) as u16
    }
    pub fn new(nsq_z: u16, ncq_z: u16) -> Self {
        NumberOfQueues(nsq_z as u32 | ((ncq_z as u32) << 16))
    }
}

/// Interrupt Coalescing (Base §5.1.25.1.8).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct InterruptCoalescing(pub u32);

impl InterruptCoalescing {
    /// Aggregation Threshold: completions per interrupt, 0's based.
    pub fn thr_z(self) -> u8 {
        self.0 as u8
    }
    /// Aggregation Time, in 100 microsecond units (0 = no delay).
    pub fn time(self) -> u8 {
        (self.0 >> 8) as u8
    }
}

/// Interrupt Vector Configuration (Base §5.1.25.1.9).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct InterruptVectorConfig(pub u32);

impl InterruptVectorConfig {
    pub fn iv(self) -> u16 {
        self.0 as u16
    }
    /// Coalescing Disable.
    pub fn cd(self) -> bool {
        self.0 & (1 << 16) != 0
    }
}

/// Asynchronous Event Configuration (Base §5.1.25.1.11).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct AsyncEventConfig(pub u32);

impl AsyncEventConfig {
    /// SMART / Health Critical Warnings that raise an event (bits 7:0).
    pub fn critical_warnings(self) -> u8 {
        self.0 as u8
    }
    /// Namespace Attribute Notices.
    pub fn ns_attribute_notices(self) -> bool {
        self.0 & (1 << 8) != 0
    }
    /// Firmware Activation Notices.
    pub fn fw_activation_notices(self) -> bool {
        self.0 & (1 << 9) != 0
    }
    /// Asymmetric Namespace Access Change Notices.
    pub fn ana_change_notices(self) -> bool {
        self.0 & (1 << 11) != 0
    }
    /// Zone Descriptor Changed Notices (ZNS).
    pub fn zone_descriptor_notices(self) -> bool {
        self.0 & (1 << 27) != 0
    }
}
