//! Namespace Management (Base §5.1.21) and Namespace Attachment (Base §5.1.20):
//! the host creates and deletes namespaces in the subsystem's capacity and attaches
//! them to, or detaches them from, controllers; and the Identify lists that go with
//! them (CNS 10h-13h).

use zerocopy::little_endian::U16;
use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout};

/// Namespace Management's Select field (Dword 10 bits 3:0).
pub mod mgmt_sel {
    pub const CREATE: u8 = 0;
    pub const DELETE: u8 = 1;
}

/// Namespace Attachment's Select field (Dword 10 bits 3:0).
pub mod attach_sel {
    pub const ATTACH: u8 = 0;
    pub const DETACH: u8 = 1;
}

/// Identify CNS values of namespace management.
pub mod cns {
    /// Allocated Namespace ID list (NSIDs above CDW1.NSID).
    pub const ALLOCATED_NAMESPACE_LIST: u8 = 0x10;
    /// Identify Namespace data structure of an allocated NSID.
    pub const ALLOCATED_NAMESPACE: u8 = 0x11;
    /// Controllers attached to the namespace (CNTLID at or above CDW10.CNTID).
    pub const NAMESPACE_CONTROLLER_LIST: u8 = 0x12;
    /// Controllers in the NVM subsystem (CNTLID at or above CDW10.CNTID).
    pub const CONTROLLER_LIST: u8 = 0x13;
}

/// The most identifiers a Controller List holds (Base Figure "Controller List
/// Format": a count, then 2047 entries, in 4096 bytes).
pub const CONTROLLER_LIST_MAX: usize = 2047;

/// A Controller List (Base Figure "Controller List Format"), as Identify CNS
/// 12h/13h return it and Namespace Attachment takes it.
#[derive(Clone, Copy, Debug, FromBytes, IntoBytes, Immutable, KnownLayout)]
#[repr(C)]
pub struct ControllerList {
    /// Number of Identifiers.
    pub count: U16,
    pub ids: [U16; CONTROLLER_LIST_MAX],
}

const _: () = assert!(core::mem::size_of::<ControllerList>() == 4096);

impl ControllerList {
    /// The identifiers it names (at most [`CONTROLLER_LIST_MAX`]; None if the
    /// count says more).
    pub fn entries(&self) -> Option<impl Iterator<Item = u16> + '_> {
        let n = self.count.get() as usize;
        (n <= CONTROLLER_LIST_MAX).then(|| self.ids[..n].iter().map(|i| i.get()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use zerocopy::FromZeros;

    #[test]
    fn a_list_names_at_most_what_it_holds() {
        let mut l = ControllerList::new_zeroed();
        l.count = U16::new(2);
        l.ids[0] = U16::new(1);
        l.ids[1] = U16::new(7);
        {
            let mut it = l.entries().unwrap();
            assert_eq!((it.next(), it.next(), it.next()), (Some(1), Some(7), None));
        }
        l.count = U16::new(2048);
        assert!(l.entries().is_none());
    }
}
