//! PRP data pointers (Base §4.1.1 "Physical Region Page Entry and List"): PRP1 holds
//! the first page (possibly at an offset), PRP2 the second page or, for transfers of
//! more than two pages, a PRP List; a list page whose entries do not all fit ends with
//! a pointer to the next list page (chaining).
#![forbid(unsafe_code)]

use crate::dma::{DmaBuf, DmaPool, PAGE};
use crate::error::Result;

/// Entries in one PRP list page.
const PER_PAGE: u64 = PAGE / 8;

/// A command's data pointer and the list pages it needs kept alive until completion.
#[derive(Debug)]
pub struct Prps {
    pub prp1: u64,
    pub prp2: u64,
    pub list: Option<DmaBuf>,
}

/// Addresses of the pages after the first one touched by `[addr, addr+len)`.
fn later_pages(addr: u64, len: u64) -> impl Iterator<Item = u64> {
    let first_end = (addr / PAGE + 1) * PAGE;
    let end = addr + len;
    (first_end..end).step_by(PAGE as usize)
}

/// List pages needed for `n` entries beyond PRP1 (0 when PRP2 can hold the one entry).
pub fn list_pages(n: u64) -> u64 {
    if n <= 1 {
        0
    } else if n <= PER_PAGE {
        1
    } else {
        // Every page but the last gives up its final slot to the chain pointer.
        (n - 1).div_ceil(PER_PAGE - 1)
    }
}

/// Builds the data pointer for `len` bytes (> 0) of DMA memory at `addr`, allocating
/// PRP list pages from `pool` when the transfer spans more than two pages.
pub fn build(pool: &DmaPool, addr: u64, len: u64) -> Result<Prps> {
    let n = later_pages(addr, len).count() as u64;
    with_entries(pool, addr, n, later_pages(addr, len))
}

/// Whether a transfer made of `segs` — `(address, length)` pieces, in order — can be
/// described by PRPs: the first piece may start anywhere dword aligned, every later
/// one must start on a page boundary, and every piece but the last must end on one.
/// Empty pieces are not allowed.
pub fn segments_fit(segs: &[(u64, u64)]) -> bool {
    let Some(&(first, _)) = segs.first() else { return false };
    let last = segs.len() - 1;
    first.is_multiple_of(4)
        && segs.iter().enumerate().all(|(i, &(a, n))| {
            n > 0 && (i == 0 || a.is_multiple_of(PAGE)) && (i == last || (a + n).is_multiple_of(PAGE))
        })
}

/// Builds the data pointer for a transfer made of `segs` (device addresses, see
/// [`segments_fit`], which must hold), with list pages from `pool` when needed.
pub fn build_segments(pool: &DmaPool, segs: &[(u64, u64)]) -> Result<Prps> {
    debug_assert!(segments_fit(segs));
    let (first, first_len) = segs[0];
    // Every page of the transfer after the one PRP1 points into.
    let later = || {
        let rest = segs[1..].iter().flat_map(|&(a, n)| (a..a + n).step_by(PAGE as usize));
        later_pages(first, first_len).chain(rest)
    };
    with_entries(pool, first, later().count() as u64, later())
}

/// PRP1 = `prp1`; the `n` entries of `entries` go in PRP2 (one) or a PRP list.
fn with_entries(pool: &DmaPool, prp1: u64, n: u64, mut entries: impl Iterator<Item = u64>) -> Result<Prps> {
    match n {
        0 => return Ok(Prps { prp1, prp2: 0, list: None }),
        1 => {
            let p2 = entries.next().expect("one page");
            return Ok(Prps { prp1, prp2: p2, list: None });
        }
        _ => {}
    }
    let pages = list_pages(n);
    let list = pool.alloc(pages * PAGE)?;
    let mut bytes = Vec::with_capacity((pages * PAGE) as usize);
    let mut left = n;
    for p in 1..=pages {
        // Every page but the last holds PER_PAGE - 1 entries and the chain pointer.
        let take = if left <= PER_PAGE { left } else { PER_PAGE - 1 };
        for e in entries.by_ref().take(take as usize) {
            bytes.extend_from_slice(&e.to_le_bytes());
        }
        left -= take;
        if left == 0 {
            break;
        }
        bytes.extend_from_slice(&(list.iova() + p * PAGE).to_le_bytes());
    }
    list.write_at(0, &bytes)?;
    Ok(Prps { prp1, prp2: list.iova(), list: Some(list) })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::transport::DmaRegion;
    use guest_mem::GuestMemory;

    const BASE: u64 = 0x4000_0000;

    fn pool() -> DmaPool {
        let len = 4096 * PAGE;
        let mem = GuestMemory::anonymous(&[(BASE, len)]).unwrap();
        DmaPool::new(DmaRegion { iova: BASE, len, mem }).unwrap()
    }

    /// Walks a data pointer the way a controller does (Base §4.1.1).
    fn walk(mem: &GuestMemory, p: &Prps, len: u64) -> Vec<(u64, u64)> {
        let mut out = vec![];
        let first = (PAGE - p.prp1 % PAGE).min(len);
        out.push((p.prp1, first));
        let mut left = len - first;
        if left == 0 {
            return out;
        }
        if left <= PAGE {
            out.push((p.prp2, left));
            return out;
        }
        let mut list = p.prp2;
        let mut i = 0;
        while left > 0 {
            let e = mem.read_obj::<u64>(list + i * 8).unwrap();
            if i == PER_PAGE - 1 && left > PAGE {
                list = e;
                i = 0;
                continue;
            }
            let n = left.min(PAGE);
            out.push((e, n));
            left -= n;
            i += 1;
        }
        out
    }

    fn check(addr: u64, len: u64) {
        let pool = pool();
        let p = build(&pool, addr, len).unwrap();
        let segs = walk(pool.mem(), &p, len);
        let mut cur = addr;
        for (a, n) in segs {
            assert_eq!(a, cur, "segments are the buffer's pages in order ({addr:#x}+{len:#x})");
            cur += n;
        }
        assert_eq!(cur, addr + len);
    }

    #[test]
    fn direct_and_listed_transfers() {
        check(BASE, 512);
        check(BASE, PAGE);
        check(BASE + 0x200, PAGE); // crosses into a second page: PRP2 is data
        check(BASE, 2 * PAGE);
        check(BASE, 3 * PAGE);
        check(BASE + 8, 64 * PAGE);
        check(BASE, 1 << 20); // 256 pages: one list page
    }

    /// Walks the PRPs of a segmented transfer and checks they name its bytes in order.
    fn check_segments(segs: &[(u64, u64)]) {
        let pool = pool();
        let len = segs.iter().map(|s| s.1).sum();
        let p = build_segments(&pool, segs).unwrap();
        let got = walk(pool.mem(), &p, len);
        // Expand both to byte runs split at page boundaries and compare.
        let split = |v: &[(u64, u64)]| {
            let mut out = vec![];
            for &(a, n) in v {
                let mut cur = a;
                while cur < a + n {
                    let end = ((cur / PAGE + 1) * PAGE).min(a + n);
                    out.push((cur, end - cur));
                    cur = end;
                }
            }
            out
        };
        assert_eq!(split(&got), split(segs), "{segs:x?}");
    }

    #[test]
    fn segmented_transfers() {
        let far = 0x7_0000_0000;
        assert!(segments_fit(&[(0x1200, 0xe00), (far, PAGE), (0x9000, 0x10)]));
        assert!(!segments_fit(&[(0x1200, 0xd00), (far, PAGE)]), "first piece ends mid-page");
        assert!(!segments_fit(&[(0x1000, PAGE), (far + 8, PAGE)]), "later piece starts mid-page");
        assert!(!segments_fit(&[(0x1202, 0x10)]), "not dword aligned");
        assert!(!segments_fit(&[]));
        check_segments(&[(BASE + 0x200, 0x200)]);
        check_segments(&[(BASE + 0x200, 0xe00), (far, 0x10)]);
        check_segments(&[(BASE + 0x200, 0xe00), (far, 3 * PAGE), (BASE + 0x10_0000, 0x800)]);
        let many: Vec<(u64, u64)> = (0..600).map(|i| (far + i * 3 * PAGE, PAGE)).collect();
        check_segments(&many); // 599 entries: a chained list
    }

    #[test]
    fn chained_lists() {
        assert_eq!(list_pages(512), 1);
        assert_eq!(list_pages(513), 2);
        assert_eq!(list_pages(1023), 2, "511 + 512");
        assert_eq!(list_pages(1024), 3);
        check(BASE, 513 * PAGE); // 512 entries beyond PRP1: exactly one full page
        check(BASE, 514 * PAGE); // 513 entries: chained
        check(BASE + 0x800, 1100 * PAGE);
        check(BASE, 1024 * PAGE);
    }
}
