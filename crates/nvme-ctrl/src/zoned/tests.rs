use std::os::unix::fs::FileExt;

use super::*;

const Z: u64 = 1 << 20;

fn cfg(max_open: u32, max_active: u32) -> ZonedConfig {
    ZonedConfig { zone_size: Z, zone_capacity: Z / 2, max_open, max_active, state_file: None }
}

fn state(z: &Zones, zi: u64) -> (ZoneState, u64) {
    let (_, d) = z.report(zi * Z, None, 9, 1);
    (d[0].state().unwrap(), d[0].wp.get())
}

#[test]
fn writes_go_at_the_pointer_and_fill_the_zone() {
    let z = Zones::new(&cfg(0, 0), 4 * Z + 4096, None).unwrap();
    assert_eq!(z.count(), 4);
    assert_eq!(state(&z, 1), (ZoneState::Empty, Z >> 9));
    let w = z.start_write(Z, 4096, false, false).unwrap();
    assert_eq!((w.zone, w.offset, w.len), (1, Z, 4096));
    // Started, not finished: the host still sees the pointer at the start.
    assert_eq!(state(&z, 1), (ZoneState::ImplicitlyOpened, Z >> 9));
    assert_eq!(z.start_write(Z, 4096, false, false), Err(ZoneError::NotAtWritePointer(Z + 4096)));
    z.finish_write(w);
    assert_eq!(state(&z, 1), (ZoneState::ImplicitlyOpened, (Z + 4096) >> 9));
    // An append goes at the pointer, whatever was asked of it.
    let a = z.start_write(Z, 4096, true, false).unwrap();
    assert_eq!(a.offset, Z + 4096);
    assert_eq!(z.start_write(Z + 512, 512, true, false), Err(ZoneError::NotZoneStart));
    // Past the capacity: a boundary error; up to it: full.
    assert_eq!(z.start_write(Z + 8192, Z / 2, false, false), Err(ZoneError::Boundary));
    z.start_write(Z + 8192, Z / 2 - 8192, false, false).unwrap();
    assert_eq!(state(&z, 1).0, ZoneState::Full);
    assert_eq!(z.start_write(Z, 512, true, false), Err(ZoneError::Full));
    assert_eq!(z.resources(), (0, 0));
}

#[test]
fn open_and_active_limits() {
    let z = Zones::new(&cfg(2, 3), 8 * Z, None).unwrap();
    z.start_write(0, 512, false, false).unwrap();
    z.act(ZoneAction::Open, Z, false).unwrap();
    assert_eq!(z.resources(), (2, 2));
    // A third open zone: the implicitly opened one is closed to make room.
    z.start_write(2 * Z, 512, false, false).unwrap();
    assert_eq!(state(&z, 0).0, ZoneState::Closed);
    assert_eq!(z.resources(), (2, 3));
    // Active limit reached: an empty zone cannot open.
    assert_eq!(z.start_write(3 * Z, 512, false, false), Err(ZoneError::TooManyActive));
    // Both open zones explicitly opened: no room for a closed zone to reopen.
    z.act(ZoneAction::Open, 2 * Z, false).unwrap();
    assert_eq!(z.start_write(512, 512, false, false), Err(ZoneError::TooManyOpen));
    assert_eq!(z.act(ZoneAction::Open, 0, true), Err(ZoneError::TooManyOpen));
    // Finishing one frees both resources.
    z.act(ZoneAction::Finish, Z, false).unwrap();
    assert_eq!(z.resources(), (1, 2));
    z.start_write(512, 512, false, false).unwrap();
}

#[test]
fn transitions_and_select_all() {
    let z = Zones::new(&cfg(0, 0), 4 * Z, None).unwrap();
    let refused = |a, off| matches!(z.act(a, off, false), Err(ZoneError::Transition(..)));
    assert!(refused(ZoneAction::Close, 0));
    assert!(refused(ZoneAction::Offline, 0));
    assert_eq!(z.act(ZoneAction::Reset, 512, false), Err(ZoneError::NotZoneStart));
    assert_eq!(z.act(ZoneAction::Reset, 4 * Z, false), Err(ZoneError::NotZoneStart));
    // Close of a zone nothing was written to empties it.
    z.act(ZoneAction::Open, 0, false).unwrap();
    z.act(ZoneAction::Close, 0, false).unwrap();
    assert_eq!(state(&z, 0).0, ZoneState::Empty);
    let w = z.start_write(Z, 8192, false, false).unwrap();
    z.finish_write(w);
    z.start_write(2 * Z, 512, false, false).unwrap();
    z.act(ZoneAction::Close, 0, true).unwrap();
    assert_eq!(state(&z, 1), (ZoneState::Closed, (Z + 8192) >> 9));
    // Reset all: each written zone hands back the range writes reached.
    let stale = z.act(ZoneAction::Reset, 0, true).unwrap();
    assert_eq!(stale, vec![(Z, 8192), (2 * Z, 512)]);
    assert_eq!(z.resources(), (0, 0));
    assert_eq!(state(&z, 1), (ZoneState::Empty, Z >> 9));
    // Read only, then offline; reads of an offline zone fail.
    assert_eq!(z.fail_zone(3 * Z, ZoneState::ReadOnly), Ok(true));
    assert_eq!(z.fail_zone(3 * Z, ZoneState::ReadOnly), Ok(false));
    assert_eq!(z.changed_zones(9), (vec![(3 * Z) >> 9], false));
    assert_eq!(z.start_write(3 * Z, 512, true, false), Err(ZoneError::ReadOnly));
    assert!(refused(ZoneAction::Reset, 3 * Z));
    z.check_read(3 * Z, 4096).unwrap();
    z.act(ZoneAction::Offline, 0, true).unwrap();
    assert_eq!(z.check_read(3 * Z - 512, 1024), Err(ZoneError::Offline));
    assert!(matches!(z.fail_zone(3 * Z, ZoneState::ReadOnly), Err(ZoneError::Transition(..))));
    assert!(matches!(z.fail_zone(0, ZoneState::Full), Err(ZoneError::Transition(..))));
    assert_eq!(z.changed_zones(12), (vec![(3 * Z) >> 12], false));
    z.clear_changed_zones();
    assert_eq!(z.changed_zones(12), (vec![], false));
    z.check_read(0, 4096).unwrap();
    let (n, d) = z.report(0, Some(ZoneState::Offline), 12, 8);
    assert_eq!((n, d.len(), d[0].zslba.get()), (1, 1, (3 * Z) >> 12));
}

#[test]
fn a_reset_controller_closes_open_zones() {
    let z = Zones::new(&cfg(0, 0), 2 * Z, None).unwrap();
    let w = z.start_write(0, 4096, false, false).unwrap();
    z.finish_write(w);
    z.act(ZoneAction::Open, Z, false).unwrap();
    z.reset_controller(false);
    assert_eq!((state(&z, 0).0, state(&z, 1).0), (ZoneState::Closed, ZoneState::Empty));
    z.reset_controller(true);
    assert_eq!(state(&z, 0), (ZoneState::Empty, 0));
}

#[test]
fn the_state_file_keeps_pointers_and_refuses_another_layout() {
    // One file, opened again as a restart would: its page cache is what a SIGKILL
    // leaves.
    let file = File::from(test_util::memfd::memfd_unsealed(0));
    let open = || file.try_clone();
    // Empty and not said to be new: refused, never written.
    let e = Zones::new(&cfg(0, 0), 4 * Z, Some(open().unwrap())).unwrap_err();
    assert!(e.contains("it is empty, not a new one"), "{e}");
    assert_eq!(file.metadata().unwrap().len(), 0);
    state_file_made_new(&file).unwrap();
    {
        let z = Zones::new(&cfg(0, 0), 4 * Z, Some(open().unwrap())).unwrap();
        assert!(z.durable());
        let w = z.start_write(Z, 8192, false, false).unwrap();
        z.finish_write(w);
        // Started but never finished: not recorded.
        z.start_write(Z + 8192, 4096, false, false).unwrap();
        z.act(ZoneAction::Finish, 2 * Z, false).unwrap();
        z.act(ZoneAction::Open, 3 * Z, false).unwrap();
    }
    let z = Zones::new(&cfg(0, 0), 4 * Z, Some(open().unwrap())).unwrap();
    assert_eq!(state(&z, 1), (ZoneState::Closed, (Z + 8192) >> 9));
    assert_eq!(state(&z, 2).0, ZoneState::Full);
    assert_eq!(state(&z, 3).0, ZoneState::Empty);
    z.start_write(Z + 8192, 512, false, false).unwrap();
    let e = Zones::new(&cfg(0, 0), 8 * Z, Some(open().unwrap())).unwrap_err();
    assert!(e.contains("recorded for 4 zones"), "{e}");
    // Cut short: in its records, then in its header.
    let whole = file.metadata().unwrap().len();
    for len in [whole - 1, 40] {
        file.set_len(len).unwrap();
        let e = Zones::new(&cfg(0, 0), 4 * Z, Some(open().unwrap())).unwrap_err();
        assert!(e.contains(&format!("it is {len} bytes, cut short")), "{e}");
    }
    // Emptied after it was made: refused too.
    file.set_len(0).unwrap();
    let e = Zones::new(&cfg(0, 0), 4 * Z, Some(open().unwrap())).unwrap_err();
    assert!(e.contains("it is empty"), "{e}");
    file.write_all_at(b"not a zone file at all, no", 0).unwrap();
    let e = Zones::new(&cfg(0, 0), 4 * Z, Some(open().unwrap())).unwrap_err();
    assert!(e.contains("VNVMEZNS"), "{e}");
}

#[test]
fn configs_are_checked() {
    let bad = |zone_size, zone_capacity, size| {
        ZonedConfig { zone_size, zone_capacity, ..Default::default() }.check(size).is_err()
    };
    assert!(bad(3 << 20, 1 << 20, 1 << 30));
    assert!(bad(Z, Z + 4096, 1 << 30));
    assert!(bad(Z, 1000, 1 << 30));
    assert!(bad(Z, Z, Z / 2));
    assert!(!bad(Z, Z, Z));
    assert!(ZonedConfig { max_open: 4, max_active: 2, ..cfg(0, 0) }.check(Z).is_err());
}

#[test]
fn the_pointer_is_past_the_furthest_finished_write_whatever_the_order() {
    let z = Zones::new(&cfg(0, 0), 2 * Z, None).unwrap();
    let a = z.start_write(0, 64 << 10, false, false).unwrap();
    let b = z.start_write(0, 4096, true, false).unwrap();
    assert_eq!(b.offset, 64 << 10);
    // B finishes first: the pointer goes past it (A's place is taken; a crash now
    // leaves A's blocks as whatever reached them, never B's overwritten).
    z.finish_write(b);
    assert_eq!(state(&z, 0).1, ((64 << 10) + 4096) >> 9);
    z.finish_write(a);
    assert_eq!(state(&z, 0).1, ((64 << 10) + 4096) >> 9);
}

#[test]
fn a_write_finishing_after_its_zone_was_reset_moves_nothing() {
    let z = Zones::new(&cfg(0, 0), 2 * Z, None).unwrap();
    let old = z.start_write(0, 8192, false, false).unwrap();
    z.act(ZoneAction::Reset, 0, false).unwrap();
    let new = z.start_write(0, 512, false, false).unwrap();
    z.finish_write(old);
    assert_eq!(state(&z, 0), (ZoneState::ImplicitlyOpened, 0), "the old write is not the zone's now");
    z.finish_write(new);
    assert_eq!(state(&z, 0).1, 1);
}

#[test]
fn a_zone_filled_by_a_write_still_out_is_full_after_a_reset_and_in_a_saved_state() {
    let file = File::from(test_util::memfd::memfd_unsealed(0));
    state_file_made_new(&file).unwrap();
    let z = Zones::new(&cfg(0, 0), 2 * Z, Some(file.try_clone().unwrap())).unwrap();
    let _out = z.start_write(0, Z / 2, false, false).unwrap();
    assert_eq!(state(&z, 0).0, ZoneState::Full);
    assert_eq!(z.save()[0], (ZoneState::Full as u8, Z / 2));
    z.check_saved(&z.save(), Some(z.layout()), 9).unwrap();
    // Restarted from the file (the write never finished): full all the same.
    let again = Zones::new(&cfg(0, 0), 2 * Z, Some(file)).unwrap();
    assert_eq!(again.save()[0], (ZoneState::Full as u8, Z / 2));
    again.check_saved(&again.save(), Some(again.layout()), 9).unwrap();
}

#[test]
fn saved_states_that_no_zone_can_be_in_are_refused() {
    let z = Zones::new(&cfg(0, 0), 2 * Z, None).unwrap();
    let good = z.save();
    let shift = 12;
    z.check_saved(&good, Some(z.layout()), shift).unwrap();
    let bad = |s: Vec<(u8, u64)>| z.check_saved(&s, Some(z.layout()), shift).is_err();
    assert!(bad(vec![(4, 512), (1, 0)]), "a pointer off the 4 KiB LBAs");
    assert!(bad(vec![(4, Z / 2), (1, 0)]), "a closed zone at its capacity");
    assert!(bad(vec![(1, 4096), (1, 0)]), "an empty zone with data");
    assert!(bad(vec![(0xe, 4096), (1, 0)]), "a full zone short of its capacity");
    assert!(bad(vec![(1, 0)]), "one zone short");
    assert!(z.check_saved(&good, Some((Z, Z)), shift).is_err(), "another capacity");
}

#[test]
fn a_write_of_other_zones_moves_nothing_here() {
    // Another namespace's zones (the NSID removed and added again): same layout,
    // same zone, same generation, still not this zone's write.
    let (here, there) =
        (Zones::new(&cfg(0, 0), 2 * Z, None).unwrap(), Zones::new(&cfg(0, 0), 2 * Z, None).unwrap());
    let w = there.start_write(0, 8192, false, false).unwrap();
    here.start_write(0, 512, false, false).unwrap();
    here.finish_write(w);
    assert_eq!(state(&here, 0).1, 0);
}
