//! Identify data structures (Base §5.1.13, NVM Command Set Identify data).
//!
//! Every structure here is exactly the bytes the controller copies to the host for one
//! CNS value; reserved areas are grouped into `rsvdNNN` arrays named by their starting
//! byte offset, and the layouts are checked at compile time.
//!
//! One file per kind of structure: `ctrl` (CNS 01h and 06h), `ns` (CNS 00h) and
//! `lists` (CNS 02h, 03h, 07h). Every public item is re-exported here, so the paths
//! stay `nvme_spec::identify::IdentifyController` and so on.

mod ctrl;
mod lists;
mod ns;

pub use ctrl::{
    ascii_pad, cmic, cntrltype, ctratt, frmw, lpa, nul_pad, oacs, oaes, oncs, ps_flags, sgls, vwc,
    IdentifyController, IoCommandSetNvmController, PowerStateDescriptor,
};
pub use lists::{
    active_ns_list, nidt, ns_descriptor_list, ActiveNamespaceList, NsIdDescriptorHeader, NS_LIST_MAX,
};
pub use ns::{
    dlfeat, dpc, dps, elbaf, flbas, mc, nmic, nsattr, nsfeat, IdentifyNamespace, IdentifyNamespaceNvm,
    LbaFormat,
};

/// Size of every Identify data structure.
pub const IDENTIFY_DATA_SIZE: usize = 4096;

/// Controller or Namespace Structure values (Base §5.1.13, Figure "CNS Values").
pub mod cns {
    /// Identify Namespace data structure for the specified NSID (NVM Command Set).
    pub const NAMESPACE: u8 = 0x00;
    /// Identify Controller data structure.
    pub const CONTROLLER: u8 = 0x01;
    /// Active Namespace ID list.
    pub const ACTIVE_NAMESPACE_LIST: u8 = 0x02;
    /// Namespace Identification Descriptor list.
    pub const NS_DESCRIPTOR_LIST: u8 = 0x03;
    /// I/O Command Set specific Identify Namespace data structure.
    pub const CSI_NAMESPACE: u8 = 0x05;
    /// I/O Command Set specific Identify Controller data structure.
    pub const CSI_CONTROLLER: u8 = 0x06;
    /// Active Namespace ID list associated with the specified I/O Command Set.
    pub const CSI_ACTIVE_NAMESPACE_LIST: u8 = 0x07;
    /// I/O Command Set Independent Identify Namespace data structure.
    pub const CS_INDEPENDENT_NAMESPACE: u8 = 0x08;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes() {
        assert_eq!(core::mem::size_of::<IdentifyController>(), 4096);
        assert_eq!(core::mem::size_of::<IdentifyNamespace>(), 4096);
        assert_eq!(core::mem::size_of::<IoCommandSetNvmController>(), 4096);
        assert_eq!(core::mem::size_of::<ActiveNamespaceList>(), 4096);
        assert_eq!(core::mem::size_of::<PowerStateDescriptor>(), 32);
    }
}
