//! The list-shaped Identify data: the Namespace Identification Descriptor list
//! (CNS 03h) and the namespace ID lists (CNS 02h, 07h), with the builders that
//! serialise them into a 4096-byte buffer.

use zerocopy::little_endian::U32;
use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout};

use super::IDENTIFY_DATA_SIZE;

/// Namespace Identification Descriptor header (CNS 03h; Base §5.1.13, Figure
/// "Identify – Namespace Identification Descriptor"). The NIDL-byte identifier follows.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, FromBytes, IntoBytes, Immutable, KnownLayout)]
#[repr(C)]
pub struct NsIdDescriptorHeader {
    /// Namespace Identifier Type, see [`nidt`].
    pub nidt: u8,
    /// Namespace Identifier Length in bytes.
    pub nidl: u8,
    pub rsvd2: [u8; 2],
}

const _: () = assert!(core::mem::size_of::<NsIdDescriptorHeader>() == 4);

/// Namespace Identifier Types and their lengths.
pub mod nidt {
    /// IEEE Extended Unique Identifier.
    pub const EUI64: u8 = 0x1;
    pub const EUI64_LEN: u8 = 8;
    /// Namespace Globally Unique Identifier.
    pub const NGUID: u8 = 0x2;
    pub const NGUID_LEN: u8 = 16;
    /// Namespace UUID.
    pub const UUID: u8 = 0x3;
    pub const UUID_LEN: u8 = 16;
    /// Command Set Identifier.
    pub const CSI: u8 = 0x4;
    pub const CSI_LEN: u8 = 1;
}

/// Serialises `(nidt, identifier)` pairs into a Namespace Identification Descriptor
/// list: each entry is a 4-byte header followed by the identifier, and the rest of the
/// 4096-byte buffer is zero (which terminates the list).
///
/// Entries with type 0 or an empty identifier (which would read as the terminator), with
/// an identifier longer than 255 bytes, or that no longer fit in the buffer are left out.
pub fn ns_descriptor_list(descs: &[(u8, &[u8])]) -> [u8; IDENTIFY_DATA_SIZE] {
    let mut out = [0u8; IDENTIFY_DATA_SIZE];
    let mut pos = 0;
    for &(nidt, id) in descs {
        let Ok(nidl) = u8::try_from(id.len()) else {
            continue;
        };
        if nidt == 0 || nidl == 0 {
            continue;
        }
        let end = pos + 4 + id.len();
        if end > out.len() {
            continue;
        }
        let hdr = NsIdDescriptorHeader { nidt, nidl, rsvd2: [0; 2] };
        out[pos..pos + 4].copy_from_slice(hdr.as_bytes());
        out[pos + 4..end].copy_from_slice(id);
        pos = end;
    }
    out
}

/// Maximum entries in a namespace ID list (CNS 02h, 07h, ...).
pub const NS_LIST_MAX: usize = 1024;

/// The Active Namespace ID list (CNS 02h; Base §5.1.13, Figure "Namespace List"):
/// up to 1024 NSIDs in increasing order, zero filled.
pub type ActiveNamespaceList = [U32; NS_LIST_MAX];

/// Builds an Active Namespace ID list: the NSIDs from `nsids` that are strictly greater
/// than `after`, in ascending order without duplicates, at most 1024 of them (the
/// smallest), as little-endian dwords, zero filled. `nsids` may come in any order;
/// 0 and FFFFFFFFh are never listed.
pub fn active_ns_list(after: u32, nsids: impl Iterator<Item = u32>) -> [u8; IDENTIFY_DATA_SIZE] {
    let mut list = [0u32; NS_LIST_MAX];
    let mut len = 0usize;
    for id in nsids {
        if id <= after || id == crate::NSID_ALL {
            continue;
        }
        let Err(pos) = list[..len].binary_search(&id) else {
            continue; // duplicate
        };
        if pos >= NS_LIST_MAX {
            continue; // larger than the 1024 smallest seen so far
        }
        if len < NS_LIST_MAX {
            list.copy_within(pos..len, pos + 1);
            len += 1;
        } else {
            list.copy_within(pos..NS_LIST_MAX - 1, pos + 1);
        }
        list[pos] = id;
    }
    let mut out = [0u8; IDENTIFY_DATA_SIZE];
    for (dst, id) in out.chunks_exact_mut(4).zip(&list[..len]) {
        dst.copy_from_slice(&id.to_le_bytes());
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn descriptor_list() {
        let eui = [0xaa; 8];
        let nguid = [0x11; 16];
        let buf = ns_descriptor_list(&[(nidt::EUI64, &eui), (nidt::NGUID, &nguid), (nidt::CSI, &[0])]);
        assert_eq!(&buf[0..4], &[1, 8, 0, 0]);
        assert_eq!(&buf[4..12], &eui);
        assert_eq!(&buf[12..16], &[2, 16, 0, 0]);
        assert_eq!(&buf[16..32], &nguid);
        assert_eq!(&buf[32..36], &[4, 1, 0, 0]);
        assert_eq!(buf[36], 0);
        assert!(buf[37..].iter().all(|&b| b == 0));
    }

    #[test]
    fn descriptor_list_skips_invalid_and_overflow() {
        let big = [0x55u8; 255];
        let descs = [(nidt::UUID, &big[..]); 20];
        let buf = ns_descriptor_list(&descs);
        // 259 bytes per entry: 15 fit in 4096 (3885 bytes), the rest is zero.
        assert_eq!(&buf[15 * 259 - 259..15 * 259 - 255], &[3, 255, 0, 0]);
        assert!(buf[15 * 259..].iter().all(|&b| b == 0));
        let empty = ns_descriptor_list(&[(nidt::EUI64, &[]), (0, &[1, 2])]);
        assert!(empty.iter().all(|&b| b == 0));
    }

    fn decode(list: &[u8; 4096]) -> impl Iterator<Item = u32> + '_ {
        list.chunks_exact(4).map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]])).take_while(|&id| id != 0)
    }

    #[test]
    fn active_ns_list_filters_and_sorts() {
        let list = active_ns_list(2, [7u32, 1, 3, 2, 5, 7, 0, crate::NSID_ALL].into_iter());
        let got: [u32; 3] = {
            let mut a = [0; 3];
            for (d, s) in a.iter_mut().zip(decode(&list)) {
                *d = s;
            }
            a
        };
        assert_eq!(got, [3, 5, 7]);
        assert_eq!(decode(&list).count(), 3);
        assert!(list[12..].iter().all(|&b| b == 0));

        let none = active_ns_list(0, core::iter::empty());
        assert!(none.iter().all(|&b| b == 0));
    }

    #[test]
    fn active_ns_list_keeps_smallest_1024() {
        // 3000 down to 1: the list must be 1..=1024 in order.
        let list = active_ns_list(0, (1..=3000u32).rev());
        assert_eq!(decode(&list).count(), 1024);
        for (i, id) in decode(&list).enumerate() {
            assert_eq!(id, i as u32 + 1);
        }
        let list = active_ns_list(1000, 1..=5000u32);
        assert_eq!(decode(&list).next(), Some(1001));
        assert_eq!(decode(&list).last(), Some(2024));
    }
}
