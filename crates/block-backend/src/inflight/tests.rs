//! The revoke guarantee (for wires that copy the data and for direct ones), the FUA
//! rule and the data copies, once, against the core; each backend's tests check its
//! wire keeps to them.

use super::*;

const PAGE: u64 = 4096;

fn memory() -> GuestMemory {
    GuestMemory::anonymous(&[(0, 4 * PAGE)]).unwrap()
}

fn guest(op: Op, tag: u64) -> Request {
    let segs = vec![Segment::Guest { gpa: PAGE, len: PAGE }];
    Request { tag, op, offset: 0, len: PAGE, data: DataBuf::Guest(segs) }
}

fn slot(a: Admit) -> usize {
    match a {
        Admit::Slot(s) => s,
        Admit::Done => panic!("completed at admission"),
    }
}

#[test]
fn a_revoked_read_drops_its_data_and_completes_without_it() {
    let mem = memory();
    mem.fill(PAGE, PAGE, 0xee).unwrap();
    let mut r: Requests<()> = Requests::default();
    let s = slot(r.admit(&mem, guest(Op::Read, 7), Ok(Some(())), false));
    assert_eq!(r.revoke(7), Some(true));
    r.get_mut(s).unwrap().copy_in(0, PAGE, Some(&[0x11; PAGE as usize])).unwrap();
    r.finish(s);
    let mut out = Vec::new();
    assert_eq!(r.reap(&mut out), 1);
    assert!(matches!(out[0].result, Err(BackendError::NotReady(_))), "{:?}", out[0].result);
    assert!(matches!(out[0].data, DataBuf::None));
    let mut b = vec![0u8; PAGE as usize];
    mem.read(PAGE, &mut b).unwrap();
    assert!(b.iter().all(|&x| x == 0xee), "late read data reached guest memory");
    assert_eq!(r.in_flight(), 0);
}

#[test]
fn a_revoked_write_cannot_read_guest_memory_nor_flush() {
    let mem = memory();
    let mut r: Requests<()> = Requests::default();
    let s = slot(r.admit(&mem, guest(Op::Write { fua: true }, 3), Ok(Some(())), true));
    let mut buf = vec![0u8; PAGE as usize];
    r.get(s).unwrap().copy_out(0, &mut buf).expect("before revoke the data is there");
    assert_eq!(r.revoke(3), Some(true));
    assert!(
        r.get(s).unwrap().copy_out(0, &mut buf).is_err(),
        "a resend after revoke reads the host's buffer"
    );
    assert!(!r.get_mut(s).unwrap().flush_now(), "a revoked write's flush went out");
}

#[test]
fn fua_by_flush_flushes_once_after_a_good_write_only() {
    let mem = memory();
    let mut r: Requests<()> = Requests::default();
    let s = slot(r.admit(&mem, guest(Op::Write { fua: true }, 1), Ok(Some(())), true));
    assert!(r.get_mut(s).unwrap().flush_now());
    assert!(!r.get_mut(s).unwrap().flush_now(), "the flush is sent once");
    let s2 = slot(r.admit(&mem, guest(Op::Write { fua: true }, 2), Ok(Some(())), true));
    r.get_mut(s2).unwrap().fail(BackendError::NoSpace);
    assert!(!r.get_mut(s2).unwrap().flush_now(), "a failed write is not flushed");
    let s3 = slot(r.admit(&mem, guest(Op::Write { fua: true }, 4), Ok(Some(())), false));
    assert!(!r.get_mut(s3).unwrap().flush_now(), "a wire with FUA sends no flush");
}

#[test]
fn the_first_error_stands_and_refusals_complete_at_once() {
    let mem = memory();
    let mut r: Requests<()> = Requests::default();
    let s = slot(r.admit(&mem, guest(Op::Read, 1), Ok(Some(())), false));
    r.get_mut(s).unwrap().fail(BackendError::ReadOnly);
    r.get_mut(s).unwrap().fail(BackendError::NoSpace);
    r.finish(s);
    assert!(matches!(r.admit(&mem, guest(Op::Read, 2), Err(BackendError::ReadOnly), false), Admit::Done));
    assert!(matches!(r.admit(&mem, guest(Op::Read, 3), Ok(None), false), Admit::Done));
    assert_eq!(r.revoke(2), Some(true), "a completion not yet reaped is revoked trivially");
    assert_eq!(r.revoke(99), None);
    let mut out = Vec::new();
    assert_eq!(r.reap(&mut out), 3);
    assert!(matches!(out[0].result, Err(BackendError::ReadOnly)));
    assert!(matches!(out[1].result, Err(BackendError::ReadOnly)));
    assert!(out[2].result.is_ok());
}

/// The direct-I/O rule: a request revoked while the device holds a piece of it
/// completes at once, the device's answer is swallowed, and its slot (with what
/// the wire keeps there) is not handed out again before that answer lands; one
/// whose piece reaches guest memory itself cannot be revoked; one with nothing at
/// the device is freed at once.
#[test]
fn direct_wires_hold_a_revoked_slot_until_the_device_answers() {
    let mem = memory();
    let mut r: Requests<u32> = Requests::direct();
    let mut out = Vec::new();
    let s = slot(r.admit(&mem, guest(Op::Read, 7), Ok(Some(70)), false));
    r.get_mut(s).unwrap().sent(false);
    match r.give_up(7) {
        Revoked::Given { slot, freed: None } => assert_eq!(slot, s),
        other => panic!("a bounced piece at the device: {other:?}"),
    }
    assert_eq!(r.reap(&mut out), 1, "a revoked request completes at once");
    assert!(matches!(out[0].result, Err(BackendError::NotReady(_))), "{:?}", out[0].result);
    assert!(matches!(out[0].data, DataBuf::None));
    assert_eq!(r.in_flight(), 0);
    // The owner reuses the tag at once; the slot the device holds is not reused.
    let s2 = slot(r.admit(&mem, guest(Op::Read, 7), Ok(Some(71)), false));
    assert_ne!(s2, s, "a slot was handed out while the device held it");
    assert!(r.get(s).is_some_and(|p| p.revoked() && p.wire == 70));
    assert!(
        matches!(r.give_up(7), Revoked::Given { slot, .. } if slot == s2),
        "the tag is the new request's"
    );
    out.clear();
    r.reap(&mut out);
    // The device answers the revoked piece: swallowed, and the slot is free.
    assert!(matches!(r.landed(s, false), Landed::Swallowed { freed: Some(70) }));
    assert!(r.get(s).is_none());
    assert!(matches!(r.landed(s2, false), Landed::Unknown), "nothing of s2 was at the device");
    assert_eq!(r.reap(&mut out), 0, "the device's answer reached the caller");
    assert_eq!(slot(r.admit(&mem, guest(Op::Read, 8), Ok(Some(80)), false)), s, "reused after it");

    // A piece into guest memory itself: refused until it lands.
    let z = slot(r.admit(&mem, guest(Op::Write { fua: false }, 9), Ok(Some(90)), false));
    r.get_mut(z).unwrap().sent(true);
    r.get_mut(z).unwrap().sent(false);
    assert!(matches!(r.give_up(9), Revoked::Refused));
    assert_eq!(r.revoke(9), Some(false));
    assert!(r.get(z).unwrap().mem().is_some(), "a refused revoke keeps the guest mappings");
    assert!(matches!(r.landed(z, true), Landed::Live(_)));
    assert!(matches!(r.give_up(9), Revoked::Given { freed: None, .. }), "a bounced piece is still out");
    assert!(matches!(r.landed(z, false), Landed::Swallowed { freed: Some(90) }));
    out.clear();
    assert_eq!(r.reap(&mut out), 1, "9 completed once, when revoked");
    assert_eq!(out[0].tag, 9);
    assert_eq!(r.in_flight(), 1, "tag 8");
}

#[test]
fn a_direct_request_not_at_the_device_is_freed_when_revoked() {
    let mem = memory();
    let mut r: Requests<u32> = Requests::direct();
    let s = slot(r.admit(&mem, guest(Op::Read, 1), Ok(Some(10)), false));
    assert!(matches!(r.give_up(1), Revoked::Given { freed: Some(10), .. }));
    assert!(r.get(s).is_none());
    assert_eq!(slot(r.admit(&mem, guest(Op::Read, 2), Ok(Some(20)), false)), s);
    let mut out = Vec::new();
    assert_eq!(r.reap(&mut out), 1);
    assert_eq!(out[0].tag, 1);
    assert_eq!(r.in_flight(), 1);
}

#[test]
fn chunked_copies_walk_the_segments_once_from_any_offset() {
    let mem = memory();
    let mut r: Requests<()> = Requests::direct();
    let segs = vec![Segment::Guest { gpa: PAGE, len: 700 }, Segment::Guest { gpa: 3 * PAGE, len: 1348 }];
    let data: Vec<u8> = (0..2048u32).map(|i| (i % 251) as u8).collect();
    mem.write(PAGE, &data[..700]).unwrap();
    mem.write(3 * PAGE, &data[700..]).unwrap();
    let req =
        Request { tag: 1, op: Op::Write { fua: false }, offset: 0, len: 2048, data: DataBuf::Guest(segs) };
    let s = slot(r.admit(&mem, req, Ok(Some(())), false));
    let mut out = Vec::new();
    let mut scratch = [0u8; 300];
    r.get(s)
        .unwrap()
        .copy_out_chunks(100, None, 1500, &mut scratch, |at, b| {
            assert_eq!(at as usize, out.len());
            assert!(b.len() <= 300);
            out.extend_from_slice(b);
            Ok(())
        })
        .unwrap();
    assert!(out == data[100..1600], "gathered from two segments in chunks");
    // Read data in chunks, into guest memory and into a host buffer.
    let segs = vec![Segment::Guest { gpa: 2 * PAGE, len: 1000 }, Segment::Discard { len: 48 }];
    // Where a wire that keeps its place would start: from a mark.
    let mut c = SegmentCursor::new(&segs);
    c.advance(10).unwrap();
    let mark = Some(c.mark());
    let req = Request { tag: 2, op: Op::Read, offset: 0, len: 1048, data: DataBuf::Guest(segs) };
    let g = slot(r.admit(&mem, req, Ok(Some(())), false));
    let fill = |at: u64, room: &mut [u8]| {
        room.copy_from_slice(&data[at as usize..at as usize + room.len()]);
        Ok(())
    };
    r.get_mut(g).unwrap().copy_in_chunks(10, mark, 1038, &mut scratch, fill).unwrap();
    let mut b = vec![0u8; 990];
    mem.read(2 * PAGE + 10, &mut b).unwrap();
    assert!(b == data[..990], "scattered in chunks, the bit bucket's bytes dropped");
    let req = Request { tag: 3, op: Op::Read, offset: 0, len: 1024, data: DataBuf::Host(vec![0; 1024]) };
    let h = slot(r.admit(&mem, req, Ok(Some(())), false));
    r.get_mut(h).unwrap().copy_in_chunks(24, None, 1000, &mut scratch, fill).unwrap();
    // Revoked while a piece is at the device: when it lands, nothing is asked of
    // the device's buffer and nothing reaches guest memory.
    mem.fill(2 * PAGE, 1000, 0xee).unwrap();
    r.get_mut(g).unwrap().sent(false);
    assert_eq!(r.revoke(2), Some(true));
    let mut called = false;
    let f = |_: u64, _: &mut [u8]| {
        called = true;
        Ok(())
    };
    r.get_mut(g).unwrap().copy_in_chunks(0, None, 1048, &mut scratch, f).unwrap();
    assert!(!called && all(&mem, 2 * PAGE, 1000, 0xee), "a revoked read's data moved");
    r.finish(h);
    let mut done = Vec::new();
    r.reap(&mut done);
    let c = done.iter().find(|c| c.tag == 3).unwrap();
    assert!(matches!(&c.data, DataBuf::Host(v) if v[..24] == [0; 24] && v[24..] == data[..1000]));
}

fn all(mem: &GuestMemory, gpa: u64, len: usize, byte: u8) -> bool {
    let mut b = vec![0u8; len];
    mem.read(gpa, &mut b).unwrap();
    b.iter().all(|&x| x == byte)
}

#[test]
fn data_moves_at_any_offset_within_the_request() {
    let mem = memory();
    let mut r: Requests<()> = Requests::default();
    let segs = vec![Segment::Guest { gpa: PAGE, len: 512 }, Segment::Guest { gpa: 3 * PAGE, len: 512 }];
    let req = Request { tag: 1, op: Op::Read, offset: 0, len: 1024, data: DataBuf::Guest(segs) };
    let s = slot(r.admit(&mem, req, Ok(Some(())), false));
    r.get_mut(s).unwrap().copy_in(256, 512, Some(&[0x5a; 512])).unwrap();
    r.get_mut(s).unwrap().copy_in(768, 256, None).unwrap();
    let (mut a, mut b) = (vec![0u8; 512], vec![0u8; 512]);
    mem.read(PAGE, &mut a).unwrap();
    mem.read(3 * PAGE, &mut b).unwrap();
    assert!(a[..256].iter().all(|&x| x == 0) && a[256..].iter().all(|&x| x == 0x5a));
    assert!(b[..256].iter().all(|&x| x == 0x5a) && b[256..].iter().all(|&x| x == 0));
}
