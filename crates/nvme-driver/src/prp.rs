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
    match n {
        0 => return Ok(Prps { prp1: addr, prp2: 0, list: None }),
        1 => {
            let p2 = later_pages(addr, len).next().expect("one page");
            return Ok(Prps { prp1: addr, prp2: p2, list: None });
        }
        _ => {}
    }
    let pages = list_pages(n);
    let list = pool.alloc(pages * PAGE)?;
    let mut bytes = Vec::with_capacity((pages * PAGE) as usize);
    let mut entries = later_pages(addr, len);
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
    Ok(Prps { prp1: addr, prp2: list.iova(), list: Some(list) })
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
