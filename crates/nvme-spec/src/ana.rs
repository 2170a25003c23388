//! Asymmetric Namespace Access (Base §8.1.1): the state in which a controller
//! reaches each group of namespaces, the ANA log page (LID 0Ch) that reports it,
//! and the Identify fields that describe it.

use zerocopy::little_endian::{U16, U32, U64};
use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout};

/// An ANA group's state on a controller (Base §8.1.1.3 to §8.1.1.7), as the ANA
/// log page encodes it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum AnaState {
    /// Commands are processed, and this is the best path.
    Optimized = 0x01,
    /// Commands are processed, though another path may do better.
    NonOptimized = 0x02,
    /// Commands that access the namespace fail with Asymmetric Access
    /// Inaccessible: for now, the host uses another path.
    Inaccessible = 0x03,
    /// As Inaccessible, for good (Asymmetric Access Persistent Loss).
    PersistentLoss = 0x04,
    /// Changing between states (Asymmetric Access Transition), for at most ANATT
    /// seconds.
    Change = 0x0f,
}

impl AnaState {
    pub const ALL: [AnaState; 5] = [
        AnaState::Optimized,
        AnaState::NonOptimized,
        AnaState::Inaccessible,
        AnaState::PersistentLoss,
        AnaState::Change,
    ];

    pub fn from_u8(v: u8) -> Option<AnaState> {
        AnaState::ALL.into_iter().find(|s| *s as u8 == v)
    }

    /// Its name as Linux's sysfs `ana_state` and nvme-cli print it.
    pub fn name(self) -> &'static str {
        match self {
            AnaState::Optimized => "optimized",
            AnaState::NonOptimized => "non-optimized",
            AnaState::Inaccessible => "inaccessible",
            AnaState::PersistentLoss => "persistent-loss",
            AnaState::Change => "change",
        }
    }

    pub fn from_name(s: &str) -> Option<AnaState> {
        AnaState::ALL.into_iter().find(|a| a.name() == s)
    }

    /// Commands that access a namespace in this state are processed.
    pub fn accessible(self) -> bool {
        matches!(self, AnaState::Optimized | AnaState::NonOptimized)
    }

    /// What a command that accesses a namespace in this state completes with,
    /// when it is not processed (a path error: the host may retry it on another
    /// controller, so DNR stays clear).
    pub fn refusal(self) -> Option<crate::Status> {
        match self {
            AnaState::Optimized | AnaState::NonOptimized => None,
            AnaState::Inaccessible => Some(crate::Status::ASYMMETRIC_ACCESS_INACCESSIBLE),
            AnaState::PersistentLoss => Some(crate::Status::ASYMMETRIC_ACCESS_PERSISTENT_LOSS),
            AnaState::Change => Some(crate::Status::ASYMMETRIC_ACCESS_TRANSITION),
        }
    }
}

/// Asymmetric Namespace Access Capabilities (ANACAP) bits of Identify Controller.
pub mod anacap {
    pub const OPTIMIZED: u8 = 1 << 0;
    pub const NON_OPTIMIZED: u8 = 1 << 1;
    pub const INACCESSIBLE: u8 = 1 << 2;
    pub const PERSISTENT_LOSS: u8 = 1 << 3;
    pub const CHANGE: u8 = 1 << 4;
    /// A namespace's ANAGRPID does not change while it is attached.
    pub const GRPID_STATIC: u8 = 1 << 6;
    /// A non-zero ANAGRPID may be given in Namespace Management.
    pub const GRPID_IN_NS_MGMT: u8 = 1 << 7;
}

/// Return Groups Only (Get Log Page LSP bit 0 for the ANA log): the descriptors
/// carry no NSIDs.
pub const LSP_RETURN_GROUPS_ONLY: u8 = 1 << 0;

/// The ANA log page's header (Base §5.1.12.1.13).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, FromBytes, IntoBytes, Immutable, KnownLayout)]
#[repr(C)]
pub struct AnaLogHeader {
    /// Change Count: moves whenever the page's content changes.
    pub change_count: U64,
    /// Number of ANA Group Descriptors that follow.
    pub ngrps: U16,
    pub rsvd10: [u8; 6],
}

/// One ANA Group Descriptor; `nnsids` NSIDs (U32 each, increasing) follow it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, FromBytes, IntoBytes, Immutable, KnownLayout)]
#[repr(C)]
pub struct AnaGroupDescriptor {
    pub grpid: U32,
    pub nnsids: U32,
    /// Change Count of this group's descriptor.
    pub change_count: U64,
    /// ANA State (bits 3:0), see [`AnaState`].
    pub state: u8,
    pub rsvd17: [u8; 15],
}

const _: () = assert!(core::mem::size_of::<AnaLogHeader>() == 16);
const _: () = assert!(core::mem::size_of::<AnaGroupDescriptor>() == 32);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn states_round_trip_and_refuse_as_the_spec_says() {
        for s in AnaState::ALL {
            assert_eq!(AnaState::from_u8(s as u8), Some(s));
            assert_eq!(AnaState::from_name(s.name()), Some(s));
            assert_eq!(s.accessible(), s.refusal().is_none());
        }
        assert_eq!(AnaState::from_u8(0), None);
        assert_eq!(AnaState::from_u8(5), None);
        let r = AnaState::Inaccessible.refusal().unwrap();
        assert_eq!((r.sct(), r.sc(), r.dnr()), (3, 0x02, false));
        let r = AnaState::PersistentLoss.refusal().unwrap();
        assert_eq!((r.sct(), r.sc()), (3, 0x01));
        let r = AnaState::Change.refusal().unwrap();
        assert_eq!((r.sct(), r.sc()), (3, 0x03));
    }
}
