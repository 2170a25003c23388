//! Data pointers through real commands (Base 2.1 §4.3.1 PRP, §4.3.2 SGL): every
//! layout a host may build moves the right bytes, and every malformed one fails with
//! the status the spec names, writes nothing, and leaves the controller working.

mod io_common;

use io_common::*;
use nvme_spec::command::Psdt;
use nvme_spec::nvm::DatasetManagementCmd;
use nvme_spec::opcode::nvm as iop;
use nvme_spec::sgl::{SglDescriptor, SglType, SGL_SUBTYPE_OFFSET};
use nvme_spec::{Cqe, Sqe, Status};
use test_kit::{MockHost, PAGE};
use test_util::Rng;
use zerocopy::IntoBytes;

const NS_BYTES: u64 = 8 << 20;

fn host() -> (MockHost, block_backend::RamBackend) {
    let (h, mut rams) = ram_host(&[(NS_BYTES, 0)], opts());
    (h, rams.remove(0))
}

fn cmd(h: &mut MockHost, s: Sqe) -> Cqe {
    h.io_cmd(1, s)
}

/// An SQE for `nlb` 512-byte blocks at `slba` of namespace 1 with explicit PRPs.
fn prp_sqe(opcode: u8, slba: u64, nlb: u32, prp1: u64, prp2: u64) -> Sqe {
    let mut s = MockHost::lba_sqe(opcode, 1, slba, nlb);
    s.set_prps(prp1, prp2);
    s
}

fn write_list(h: &MockHost, at: u64, entries: &[u64]) {
    let bytes: Vec<u8> = entries.iter().flat_map(|e| e.to_le_bytes()).collect();
    h.mem.write(at, &bytes).unwrap();
}

/// Scatters `data` over `pages` (one page each; the first may start at `first_off`).
fn scatter(h: &MockHost, data: &[u8], first_off: u64, pages: &[u64]) {
    let mut off = 0usize;
    for (i, &p) in pages.iter().enumerate() {
        let start = if i == 0 { first_off } else { 0 };
        let n = ((PAGE - start) as usize).min(data.len() - off);
        h.mem.write(p + start, &data[off..off + n]).unwrap();
        off += n;
    }
    assert_eq!(off, data.len(), "pages cover the data");
}

fn gather(h: &MockHost, len: usize, first_off: u64, pages: &[u64]) -> Vec<u8> {
    let mut out = vec![0u8; len];
    let mut off = 0usize;
    for (i, &p) in pages.iter().enumerate() {
        let start = if i == 0 { first_off } else { 0 };
        let n = ((PAGE - start) as usize).min(len - off);
        h.mem.read(p + start, &mut out[off..off + n]).unwrap();
        off += n;
    }
    out
}

/// `n` separate, non-adjacent pages in shuffled order, so nothing works by accident
/// of contiguity.
fn scattered_pages(h: &mut MockHost, n: usize, rng: &mut Rng) -> Vec<u64> {
    let base = h.alloc.alloc_pages(2 * n as u64);
    let mut v: Vec<u64> = (0..n).map(|i| base + 2 * i as u64 * PAGE).collect();
    for i in (1..v.len()).rev() {
        v.swap(i, rng.below(i as u64 + 1) as usize);
    }
    v
}

fn backend(ram: &block_backend::RamBackend, slba: u64, len: usize) -> Vec<u8> {
    let mut v = vec![0u8; len];
    ram.read_at(slba * 512, &mut v).unwrap();
    v
}

// ---- PRP

#[test]
fn spec_4_3_1_prp1_with_offset_and_prp2_as_second_data_page() {
    let (mut h, ram) = host();
    let mut rng = Rng::new(20);
    // Within one page at an offset: PRP2 is reserved and ignored.
    let p = h.alloc.alloc_pages(1);
    let data = rng.bytes(1024);
    h.mem.write(p + 0x204, &data).unwrap();
    assert_status(&cmd(&mut h, prp_sqe(WRITE, 0, 2, p + 0x204, 0xdead_0000_0001)), Status::SUCCESS, false);
    assert!(backend(&ram, 0, 1024) == data);
    // Crossing one page boundary from an offset: PRP2 is a separate data page.
    let pages = scattered_pages(&mut h, 2, &mut rng);
    let data = rng.bytes(4096);
    scatter(&h, &data, 0xa00, &pages);
    assert_status(&cmd(&mut h, prp_sqe(WRITE, 10, 8, pages[0] + 0xa00, pages[1])), Status::SUCCESS, false);
    assert!(backend(&ram, 10, 4096) == data);
    let out = scattered_pages(&mut h, 2, &mut rng);
    assert_status(&cmd(&mut h, prp_sqe(READ, 10, 8, out[0] + 0x104, out[1])), Status::SUCCESS, false);
    assert!(gather(&h, 4096, 0x104, &out) == data);
}

#[test]
fn spec_4_3_1_prp_list_of_scattered_pages() {
    let (mut h, ram) = host();
    let mut rng = Rng::new(21);
    for (off, len) in [(0u64, 3 * PAGE as usize), (0x800, 5 * PAGE as usize + 512), (0x1fc, 64 * 1024)] {
        let npages = (off as usize + len).div_ceil(PAGE as usize);
        let pages = scattered_pages(&mut h, npages, &mut rng);
        let data = rng.bytes(len);
        scatter(&h, &data, off, &pages);
        let list = h.alloc.alloc_pages(1);
        write_list(&h, list, &pages[1..]);
        let nlb = (len / 512) as u32;
        assert_status(&cmd(&mut h, prp_sqe(WRITE, 100, nlb, pages[0] + off, list)), Status::SUCCESS, false);
        assert!(backend(&ram, 100, len) == data, "write through a PRP list (offset {off:#x}, {len} bytes)");
        // Read back through a different list that starts at an offset in its page.
        let out = scattered_pages(&mut h, npages, &mut rng);
        let list2 = h.alloc.alloc_pages(1) + 0x328;
        write_list(&h, list2, &out[1..]);
        assert_status(&cmd(&mut h, prp_sqe(READ, 100, nlb, out[0] + off, list2)), Status::SUCCESS, false);
        assert!(gather(&h, len, off, &out) == data, "read through a PRP list");
    }
}

#[test]
fn spec_4_3_1_chained_prp_list_when_entries_reach_the_end_of_the_list_page() {
    let (mut h, ram) = host();
    let mut rng = Rng::new(22);
    let len = 40 * PAGE as usize; // 160 KiB: 39 list entries after PRP1
    let pages = scattered_pages(&mut h, 40, &mut rng);
    let data = rng.bytes(len);
    scatter(&h, &data, 0, &pages);
    // The list starts 3 entries before the end of its page: 2 data entries, then a
    // pointer to the next list page; that one holds the rest.
    let l1 = h.alloc.alloc_pages(1) + PAGE - 24;
    let l2 = h.alloc.alloc_pages(1);
    write_list(&h, l1, &[pages[1], pages[2], l2]);
    write_list(&h, l2, &pages[3..]);
    assert_status(&cmd(&mut h, prp_sqe(WRITE, 0, (len / 512) as u32, pages[0], l1)), Status::SUCCESS, false);
    assert!(backend(&ram, 0, len) == data);
    // Read through a list that has room for one data entry before its chain pointer.
    let out = scattered_pages(&mut h, 40, &mut rng);
    let a = h.alloc.alloc_pages(1) + PAGE - 16;
    let b = h.alloc.alloc_pages(1);
    let c = h.alloc.alloc_pages(1);
    write_list(&h, a, &[out[1], b]);
    // The second list page holds the remaining 38 entries.
    write_list(&h, b, &out[2..]);
    assert_status(&cmd(&mut h, prp_sqe(READ, 0, (len / 512) as u32, out[0], a)), Status::SUCCESS, false);
    assert!(gather(&h, len, 0, &out) == data);
    // MDTS-sized transfer from an offset PRP1: 256 entries, chained after one entry.
    let big = 1usize << 20;
    let data = rng.bytes(big);
    let src = h.alloc.alloc((big as u64) + PAGE, PAGE);
    h.mem.write(src + 0x200, &data).unwrap();
    let pages: Vec<u64> = (1..=256).map(|i| src + i * PAGE).collect();
    write_list(&h, c + PAGE - 16, &[pages[0], b]);
    write_list(&h, b, &pages[1..]);
    assert_status(
        &cmd(&mut h, prp_sqe(WRITE, 4096, 2048, src + 0x200, c + PAGE - 16)),
        Status::SUCCESS,
        false,
    );
    assert!(backend(&ram, 4096, big) == data);
}

#[test]
fn spec_4_3_1_prp1_not_dword_aligned_is_prp_offset_invalid() {
    let (mut h, ram) = host();
    let p = h.alloc.alloc_pages(2);
    h.mem.fill(p, 2 * PAGE, 0x5a).unwrap();
    for low in [1u64, 2, 3] {
        for opcode in [WRITE, READ, iop::COMPARE] {
            let c = cmd(&mut h, prp_sqe(opcode, 0, 1, p + 0x100 + low, 0));
            assert_status(&c, Status::PRP_OFFSET_INVALID, true);
        }
    }
    assert!(backend(&ram, 0, 512).iter().all(|&b| b == 0), "nothing written");
    assert_still_works(&mut h, 1, 1, 512);
}

#[test]
fn spec_4_3_1_prp2_data_pointer_or_list_entry_with_offset_is_prp_offset_invalid() {
    let (mut h, ram) = host();
    let pages = h.alloc.alloc_pages(8);
    h.mem.fill(pages, 8 * PAGE, 0x5a).unwrap();
    // PRP2 as the second data page must have offset 0.
    for off in [4u64, 0x200, 0xff8] {
        let c = cmd(&mut h, prp_sqe(WRITE, 0, 16, pages, pages + PAGE + off));
        assert_status(&c, Status::PRP_OFFSET_INVALID, true);
    }
    // A data entry inside a PRP list with an offset (even the last, partly used one).
    let list = h.alloc.alloc_pages(1);
    for bad_index in 0..3 {
        let mut e = [pages + PAGE, pages + 2 * PAGE, pages + 3 * PAGE];
        e[bad_index] += 0x10;
        write_list(&h, list, &e);
        let c = cmd(&mut h, prp_sqe(WRITE, 0, 31, pages, list));
        assert_status(&c, Status::PRP_OFFSET_INVALID, true);
    }
    // A next-list pointer with an offset.
    let l1 = h.alloc.alloc_pages(1) + PAGE - 16;
    let l2 = h.alloc.alloc_pages(1);
    write_list(&h, l1, &[pages + PAGE, l2 + 8]);
    write_list(&h, l2, &[0, pages + 2 * PAGE, pages + 3 * PAGE]);
    assert_status(&cmd(&mut h, prp_sqe(WRITE, 0, 32, pages, l1)), Status::PRP_OFFSET_INVALID, true);
    // A PRP List pointer in the command that is not qword aligned.
    assert_status(&cmd(&mut h, prp_sqe(WRITE, 0, 24, pages, list + 4)), Status::PRP_OFFSET_INVALID, true);
    assert!(backend(&ram, 0, 16 * 1024).iter().all(|&b| b == 0), "nothing written");
    assert_still_works(&mut h, 1, 1, 512);
}

#[test]
fn spec_4_3_1_prp_list_outside_guest_memory_is_data_transfer_error() {
    let (mut h, ram) = host();
    let pages = h.alloc.alloc_pages(4);
    for list in [MEM, MEM + 0x10_0000, 1 << 40, 0xffff_ffff_ffff_f000] {
        for opcode in [WRITE, READ] {
            let c = cmd(&mut h, prp_sqe(opcode, 0, 24, pages, list));
            assert_status(&c, Status::DATA_TRANSFER_ERROR, true);
        }
    }
    // The second list page of a chain outside guest memory.
    let l1 = h.alloc.alloc_pages(1) + PAGE - 16;
    write_list(&h, l1, &[pages + PAGE, MEM + PAGE]);
    assert_status(&cmd(&mut h, prp_sqe(WRITE, 0, 32, pages, l1)), Status::DATA_TRANSFER_ERROR, true);
    assert!(backend(&ram, 0, 16 * 1024).iter().all(|&b| b == 0), "nothing written");
    assert_still_works(&mut h, 1, 1, 512);
}

/// A Write whose data pages are partly outside guest memory fails with Data Transfer
/// Error and writes nothing at all (not even the pages that were readable).
#[test]
fn spec_4_3_1_data_pages_outside_guest_memory_are_data_transfer_error() {
    let (mut h, ram) = host();
    let good = h.alloc.alloc_pages(2);
    h.mem.fill(good, 2 * PAGE, 0x77).unwrap();
    let list = h.alloc.alloc_pages(1);
    write_list(&h, list, &[good + PAGE, MEM + 0x4000]);
    let cases = [
        prp_sqe(WRITE, 0, 8, MEM, 0),
        prp_sqe(WRITE, 0, 16, good, MEM),
        prp_sqe(WRITE, 0, 16, good + 0x800, MEM + PAGE),
        prp_sqe(WRITE, 0, 24, good, list),
    ];
    for s in cases {
        let c = cmd(&mut h, s);
        assert_status(&c, Status::DATA_TRANSFER_ERROR, true);
        assert!(backend(&ram, 0, 12 * 1024).iter().all(|&b| b == 0), "a failed Write left no partial data");
    }
    // Reads into memory that is not there fail the same way.
    for s in [prp_sqe(READ, 0, 8, MEM, 0), prp_sqe(READ, 0, 16, good, MEM), prp_sqe(READ, 0, 24, good, list)]
    {
        assert_status(&cmd(&mut h, s), Status::DATA_TRANSFER_ERROR, true);
    }
    // Compare reads its buffer from the host: same status.
    assert_status(&cmd(&mut h, prp_sqe(iop::COMPARE, 0, 16, good, MEM)), Status::DATA_TRANSFER_ERROR, true);
    assert_still_works(&mut h, 1, 1, 512);
}

// ---- SGL

fn data_block(addr: u64, len: u32) -> SglDescriptor {
    SglDescriptor::new(SglType::DataBlock, addr, len)
}

fn segment(kind: SglType, addr: u64, count: u32) -> SglDescriptor {
    SglDescriptor::new(kind, addr, count * 16)
}

fn put_segment(h: &MockHost, at: u64, descs: &[SglDescriptor]) {
    h.mem.write(at, descs.as_bytes()).unwrap();
}

fn sgl(opcode: u8, slba: u64, nlb: u32, d: SglDescriptor) -> Sqe {
    MockHost::sgl_sqe(opcode, 1, slba, nlb, &d)
}

#[test]
fn spec_4_3_2_single_data_block_at_any_byte_address() {
    let (mut h, ram) = host();
    let mut rng = Rng::new(30);
    for (off, nlb) in [(0u64, 1u32), (3, 7), (0x801, 24)] {
        let len = nlb as usize * 512;
        let buf = h.alloc.alloc(len as u64 + PAGE, PAGE) + off;
        let data = rng.bytes(len);
        h.mem.write(buf, &data).unwrap();
        assert_status(&cmd(&mut h, sgl(WRITE, 50, nlb, data_block(buf, len as u32))), Status::SUCCESS, false);
        assert!(backend(&ram, 50, len) == data);
        let out = h.alloc.alloc(len as u64 + PAGE, PAGE) + off + 1;
        assert_status(&cmd(&mut h, sgl(READ, 50, nlb, data_block(out, len as u32))), Status::SUCCESS, false);
        let mut back = vec![0u8; len];
        h.mem.read(out, &mut back).unwrap();
        assert!(back == data);
        assert_status(
            &cmd(&mut h, sgl(iop::COMPARE, 50, nlb, data_block(out, len as u32))),
            Status::SUCCESS,
            false,
        );
    }
}

#[test]
fn spec_4_3_2_segment_chain_to_last_segment() {
    let (mut h, ram) = host();
    let mut rng = Rng::new(31);
    let data = rng.bytes(8 * 512);
    let bufs = h.alloc.alloc_pages(8);
    // Pieces of odd sizes at odd places: 700 + 324 + 1536 + 1536 = 4096 bytes.
    let pieces = [
        (bufs + 5, 700u32),
        (bufs + PAGE * 2 + 33, 324),
        (bufs + PAGE * 4, 1536),
        (bufs + PAGE * 6 + 1, 1536),
    ];
    let mut off = 0usize;
    for &(a, n) in &pieces {
        h.mem.write(a, &data[off..off + n as usize]).unwrap();
        off += n as usize;
    }
    let segs = h.alloc.alloc_pages(3);
    let (s1, s2, s3) = (segs, segs + PAGE + 0x40, segs + 2 * PAGE + 0x10);
    put_segment(&h, s1, &[data_block(pieces[0].0, pieces[0].1), segment(SglType::Segment, s2, 2)]);
    put_segment(&h, s2, &[data_block(pieces[1].0, pieces[1].1), segment(SglType::LastSegment, s3, 2)]);
    put_segment(&h, s3, &[data_block(pieces[2].0, pieces[2].1), data_block(pieces[3].0, pieces[3].1)]);
    assert_status(&cmd(&mut h, sgl(WRITE, 7, 8, segment(SglType::Segment, s1, 2))), Status::SUCCESS, false);
    assert!(backend(&ram, 7, data.len()) == data);
    // Read back through a Last Segment straight from the command.
    let out = h.alloc.alloc_pages(2);
    let last = h.alloc.alloc_pages(1);
    put_segment(&h, last, &[data_block(out, 1000), data_block(out + 1000 + 24, 3096)]);
    assert_status(
        &cmd(&mut h, sgl(READ, 7, 8, segment(SglType::LastSegment, last, 2))),
        Status::SUCCESS,
        false,
    );
    let mut a = vec![0u8; 1000];
    let mut b = vec![0u8; 3096];
    h.mem.read(out, &mut a).unwrap();
    h.mem.read(out + 1024, &mut b).unwrap();
    assert!(a[..] == data[..1000] && b[..] == data[1000..]);
}

#[test]
fn spec_4_3_2_bit_bucket_in_a_read_skips_those_bytes() {
    let (mut h, _) = host();
    let data = Rng::new(32).bytes(4 * 512);
    assert_eq!(h.write_blocks(1, 1, 0, 512, &data), Status::SUCCESS);
    let out = h.alloc.alloc_pages(2);
    h.mem.fill(out, 2 * PAGE, 0xee).unwrap();
    let seg = h.alloc.alloc_pages(1);
    put_segment(
        &h,
        seg,
        &[data_block(out, 512), SglDescriptor::new(SglType::BitBucket, 0, 1024), data_block(out + PAGE, 512)],
    );
    assert_status(
        &cmd(&mut h, sgl(READ, 0, 4, segment(SglType::LastSegment, seg, 3))),
        Status::SUCCESS,
        false,
    );
    let mut got = vec![0u8; 2 * PAGE as usize];
    h.mem.read(out, &mut got).unwrap();
    assert!(got[..512] == data[..512], "block 0 lands in the first data block");
    assert!(got[512..PAGE as usize].iter().all(|&b| b == 0xee), "bucket bytes go nowhere");
    assert!(
        got[PAGE as usize..PAGE as usize + 512] == data[1536..],
        "block 3 lands in the second data block"
    );
    assert!(got[PAGE as usize + 512..].iter().all(|&b| b == 0xee));
    // A read that is all bit bucket transfers nothing and succeeds.
    let c = cmd(&mut h, sgl(READ, 0, 2, SglDescriptor::new(SglType::BitBucket, 0, 1024)));
    assert_status(&c, Status::SUCCESS, false);
}

#[test]
fn spec_4_3_2_bit_bucket_in_a_write_or_keyed_data_block_is_sgl_descriptor_type_invalid() {
    let (mut h, ram) = host();
    let buf = h.alloc.alloc_pages(2);
    h.mem.fill(buf, 2 * PAGE, 0x11).unwrap();
    let seg = h.alloc.alloc_pages(1);
    put_segment(&h, seg, &[data_block(buf, 512), SglDescriptor::new(SglType::BitBucket, 0, 512)]);
    let c = cmd(&mut h, sgl(WRITE, 0, 2, segment(SglType::LastSegment, seg, 2)));
    assert_status(&c, Status::SGL_DESCRIPTOR_TYPE_INVALID, true);
    let c = cmd(&mut h, sgl(WRITE, 0, 1, SglDescriptor::new(SglType::BitBucket, 0, 512)));
    assert_status(&c, Status::SGL_DESCRIPTOR_TYPE_INVALID, true);
    // Keyed SGL Data Block (fabrics only), in the command and in a segment, both ways.
    for opcode in [WRITE, READ] {
        let keyed = SglDescriptor::new(SglType::KeyedDataBlock, buf, 512);
        assert_status(&cmd(&mut h, sgl(opcode, 0, 1, keyed)), Status::SGL_DESCRIPTOR_TYPE_INVALID, true);
        put_segment(&h, seg, &[data_block(buf, 512), keyed]);
        let c = cmd(&mut h, sgl(opcode, 0, 2, segment(SglType::LastSegment, seg, 2)));
        assert_status(&c, Status::SGL_DESCRIPTOR_TYPE_INVALID, true);
    }
    assert!(backend(&ram, 0, 1024).iter().all(|&b| b == 0), "nothing written");
    assert_still_works(&mut h, 1, 1, 512);
}

#[test]
fn spec_4_3_2_length_mismatch_is_data_sgl_length_invalid() {
    let (mut h, ram) = host();
    let buf = h.alloc.alloc_pages(2);
    h.mem.fill(buf, 2 * PAGE, 0x22).unwrap();
    for opcode in [WRITE, READ] {
        for len in [511u32, 513, 1024, 0] {
            let c = cmd(&mut h, sgl(opcode, 0, 1, data_block(buf, len)));
            assert_status(&c, Status::DATA_SGL_LENGTH_INVALID, true);
        }
        let seg = h.alloc.alloc_pages(1);
        put_segment(&h, seg, &[data_block(buf, 512), data_block(buf + 1024, 256)]);
        let c = cmd(&mut h, sgl(opcode, 0, 2, segment(SglType::LastSegment, seg, 2)));
        assert_status(&c, Status::DATA_SGL_LENGTH_INVALID, true);
    }
    assert!(backend(&ram, 0, 1024).iter().all(|&b| b == 0), "nothing written");
    assert_still_works(&mut h, 1, 1, 512);
}

#[test]
fn spec_4_3_2_segment_length_not_a_multiple_of_16_is_invalid_sgl_segment_descriptor() {
    let (mut h, _) = host();
    let buf = h.alloc.alloc_pages(1);
    let seg = h.alloc.alloc_pages(1);
    put_segment(&h, seg, &[data_block(buf, 256), data_block(buf + 256, 256)]);
    for kind in [SglType::Segment, SglType::LastSegment] {
        for len in [8u32, 17, 24, 31, 0] {
            let c = cmd(&mut h, sgl(READ, 0, 1, SglDescriptor::new(kind, seg, len)));
            assert_status(&c, Status::INVALID_SGL_SEGMENT_DESCRIPTOR, true);
        }
    }
    // A segment descriptor that is not the last of its segment.
    let tail = h.alloc.alloc_pages(1);
    put_segment(&h, tail, &[data_block(buf + 256, 256)]);
    put_segment(&h, seg, &[segment(SglType::LastSegment, tail, 1), data_block(buf, 256)]);
    let c = cmd(&mut h, sgl(READ, 0, 1, segment(SglType::Segment, seg, 2)));
    assert_status(&c, Status::INVALID_SGL_SEGMENT_DESCRIPTOR, true);
    assert_still_works(&mut h, 1, 1, 512);
}

#[test]
fn spec_4_3_2_offset_subtype_is_sgl_offset_invalid() {
    let (mut h, _) = host();
    let buf = h.alloc.alloc_pages(1);
    let mut d = data_block(buf, 512);
    d.id |= SGL_SUBTYPE_OFFSET;
    assert_status(&cmd(&mut h, sgl(READ, 0, 1, d)), Status::SGL_OFFSET_INVALID, true);
    let seg = h.alloc.alloc_pages(1);
    put_segment(&h, seg, &[d]);
    let c = cmd(&mut h, sgl(WRITE, 0, 1, segment(SglType::LastSegment, seg, 1)));
    assert_status(&c, Status::SGL_OFFSET_INVALID, true);
    let mut s = segment(SglType::LastSegment, seg, 1);
    s.id |= SGL_SUBTYPE_OFFSET;
    assert_status(&cmd(&mut h, sgl(READ, 0, 1, s)), Status::SGL_OFFSET_INVALID, true);
    assert_still_works(&mut h, 1, 1, 512);
}

#[test]
fn spec_4_3_2_self_referencing_segment_terminates_with_an_error() {
    let (mut h, _) = host();
    let buf = h.alloc.alloc_pages(1);
    let seg = h.alloc.alloc_pages(1);
    // A segment that only points to itself never describes any data.
    put_segment(&h, seg, &[segment(SglType::Segment, seg, 1)]);
    let c = cmd(&mut h, sgl(READ, 0, 1, segment(SglType::Segment, seg, 1)));
    assert_status(&c, Status::INVALID_SGL_DESCRIPTOR_COUNT, true);
    // One that adds data each lap overruns the transfer length first.
    put_segment(&h, seg, &[data_block(buf, 16), segment(SglType::Segment, seg, 2)]);
    let c = cmd(&mut h, sgl(READ, 0, 1, segment(SglType::Segment, seg, 2)));
    assert_status(&c, Status::DATA_SGL_LENGTH_INVALID, true);
    // Two segments pointing at each other.
    let other = h.alloc.alloc_pages(1);
    put_segment(&h, seg, &[segment(SglType::Segment, other, 1)]);
    put_segment(&h, other, &[segment(SglType::Segment, seg, 1)]);
    let c = cmd(&mut h, sgl(WRITE, 0, 1, segment(SglType::Segment, seg, 1)));
    assert_status(&c, Status::INVALID_SGL_DESCRIPTOR_COUNT, true);
    assert_still_works(&mut h, 1, 1, 512);
}

#[test]
fn spec_4_3_2_segments_or_data_blocks_outside_guest_memory_are_data_transfer_error() {
    let (mut h, ram) = host();
    let buf = h.alloc.alloc_pages(1);
    for opcode in [READ, WRITE] {
        let c = cmd(&mut h, sgl(opcode, 0, 2, segment(SglType::LastSegment, MEM + 0x100, 2)));
        assert_status(&c, Status::DATA_TRANSFER_ERROR, true);
        let c = cmd(&mut h, sgl(opcode, 0, 1, data_block(MEM - 256, 512)));
        assert_status(&c, Status::DATA_TRANSFER_ERROR, true);
    }
    h.mem.fill(buf, PAGE, 0x33).unwrap();
    let seg = h.alloc.alloc_pages(1);
    put_segment(&h, seg, &[data_block(buf, 512), data_block(MEM, 512)]);
    let c = cmd(&mut h, sgl(WRITE, 0, 2, segment(SglType::LastSegment, seg, 2)));
    assert_status(&c, Status::DATA_TRANSFER_ERROR, true);
    assert!(backend(&ram, 0, 1024).iter().all(|&b| b == 0), "a failed Write left no partial data");
    assert_still_works(&mut h, 1, 1, 512);
}

#[test]
fn spec_4_1_psdt_11b_is_invalid_field() {
    let (mut h, ram) = host();
    let buf = h.alloc.alloc_pages(1);
    for opcode in [WRITE, READ, iop::COMPARE, iop::DATASET_MANAGEMENT] {
        let mut s = MockHost::lba_sqe(opcode, 1, 0, 1);
        s.set_cdw0(opcode, 0, Psdt::Reserved);
        s.set_prps(buf, 0);
        assert_status(&cmd(&mut h, s), Status::INVALID_FIELD, true);
    }
    assert!(backend(&ram, 0, 512).iter().all(|&b| b == 0));
    assert_still_works(&mut h, 1, 1, 512);
}

#[test]
fn spec_4_3_2_dataset_management_ranges_through_an_sgl() {
    let (mut h, _) = host();
    let data = Rng::new(33).bytes(8 * 512);
    assert_eq!(h.write_blocks(1, 1, 0, 512, &data), Status::SUCCESS);
    let buf = h.alloc.alloc_pages(1) + 8;
    let mut range = Vec::new();
    range.extend_from_slice(&0u32.to_le_bytes());
    range.extend_from_slice(&4u32.to_le_bytes());
    range.extend_from_slice(&2u64.to_le_bytes());
    h.mem.write(buf, &range).unwrap();
    let mut s = sgl(iop::DATASET_MANAGEMENT, 0, 1, data_block(buf, 16));
    let dsm = DatasetManagementCmd { nsid: 1, nr_z: 0, ad: true, ..Default::default() }.to_sqe();
    (s.cdw10, s.cdw11, s.cdw12) = (dsm.cdw10, dsm.cdw11, dsm.cdw12);
    assert_status(&cmd(&mut h, s), Status::SUCCESS, false);
    let (st, back) = h.read_blocks(1, 1, 0, 8, 512);
    assert_eq!(st, Status::SUCCESS);
    assert!(back[..1024] == data[..1024] && back[3072..] == data[3072..]);
    assert!(back[1024..3072].iter().all(|&b| b == 0));
}
