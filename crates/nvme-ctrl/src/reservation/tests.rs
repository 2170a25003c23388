//! The rules, case by case, and the shared file between two opens.

use nvme_spec::resv::{cptpl, notification as n, racqa, rrega, rrela, ReservationType as T};
use nvme_spec::Status;

use super::rules::{Access, Ask, Requester, ResvState};
use super::ResvFile;

fn host(b: u8, cntlid: u16) -> Requester {
    let mut h = [0u8; 16];
    h[0] = b;
    Requester { host: h, cntlid }
}

const NO_PTPL: (u8, bool) = (cptpl::NO_CHANGE, true);

fn ask(action: u8, iekey: bool, crkey: u64) -> Ask {
    Ask { action, iekey, crkey }
}

fn reg(s: &mut ResvState, me: &Requester, key: u64) -> Result<(), Status> {
    s.register(me, ask(rrega::REGISTER, false, 0), key, NO_PTPL)
}

#[test]
fn registering_keys_and_controllers() {
    let (a, a2, b) = (host(1, 1), host(1, 2), host(2, 3));
    let mut s = ResvState::default();
    assert_eq!(reg(&mut s, &a, 0), Err(Status::INVALID_FIELD), "key 0");
    reg(&mut s, &a, 10).unwrap();
    assert_eq!(s.generation, 1);
    // The same host through another controller, with its key: one registrant,
    // two controllers.
    reg(&mut s, &a2, 10).unwrap();
    assert_eq!(s.registrants.len(), 1);
    assert_eq!(s.registrants[0].cntlids, vec![1, 2]);
    assert_eq!(reg(&mut s, &a, 11), Err(Status::RESERVATION_CONFLICT), "another key");
    reg(&mut s, &b, 20).unwrap();
    // Replace needs the current key (unless IEKEY); unregister too.
    assert_eq!(
        s.register(&b, ask(rrega::REPLACE, false, 99), 21, NO_PTPL),
        Err(Status::RESERVATION_CONFLICT)
    );
    s.register(&b, ask(rrega::REPLACE, false, 20), 21, NO_PTPL).unwrap();
    s.register(&b, ask(rrega::REPLACE, true, 0), 22, NO_PTPL).unwrap();
    assert_eq!(s.registrants[1].key, 22);
    assert_eq!(
        s.register(&b, ask(rrega::UNREGISTER, false, 21), 0, NO_PTPL),
        Err(Status::RESERVATION_CONFLICT)
    );
    s.register(&b, ask(rrega::UNREGISTER, false, 22), 0, NO_PTPL).unwrap();
    assert_eq!(s.registrants.len(), 1);
    // PTPL: set where the namespace can keep it, refused where not; 01b reserved.
    s.register(&a, ask(rrega::REGISTER, false, 0), 10, (cptpl::SET, true)).unwrap();
    assert!(s.ptpl);
    assert_eq!(
        s.register(&a, ask(rrega::REGISTER, false, 0), 10, (cptpl::SET, false)),
        Err(Status::INVALID_FIELD)
    );
    assert_eq!(s.register(&a, ask(rrega::REGISTER, false, 0), 10, (1, true)), Err(Status::INVALID_FIELD));
    assert_eq!(s.register(&a, ask(3, false, 0), 10, NO_PTPL), Err(Status::INVALID_FIELD), "reserved action");
}

#[test]
fn who_may_read_and_write_under_each_type() {
    let (holder, other, stranger) = (host(1, 1), host(2, 2), host(3, 3));
    // (type, holder writes, registrant reads, registrant writes, stranger reads, stranger writes)
    let table = [
        (T::WriteExclusive, true, true, false, true, false),
        (T::ExclusiveAccess, true, false, false, false, false),
        (T::WriteExclusiveRegistrantsOnly, true, true, true, true, false),
        (T::ExclusiveAccessRegistrantsOnly, true, true, true, false, false),
        (T::WriteExclusiveAllRegistrants, true, true, true, true, false),
        (T::ExclusiveAccessAllRegistrants, true, true, true, false, false),
    ];
    for (t, hw, rr, rw, sr, sw) in table {
        let mut s = ResvState::default();
        reg(&mut s, &holder, 1).unwrap();
        reg(&mut s, &other, 2).unwrap();
        assert!(s.allows(&stranger.host, Access::Write), "no reservation: all may");
        assert_eq!(
            s.acquire(&stranger, ask(racqa::ACQUIRE, false, 0), t as u8, 0),
            Err(Status::RESERVATION_CONFLICT)
        );
        assert_eq!(
            s.acquire(&holder, ask(racqa::ACQUIRE, false, 9), t as u8, 0),
            Err(Status::RESERVATION_CONFLICT)
        );
        s.acquire(&holder, ask(racqa::ACQUIRE, false, 1), t as u8, 0).unwrap();
        // Acquiring again what it holds: success; another type: conflict.
        s.acquire(&holder, ask(racqa::ACQUIRE, false, 1), t as u8, 0).unwrap();
        let other_t = if t == T::WriteExclusive { 2 } else { 1 };
        assert_eq!(
            s.acquire(&holder, ask(racqa::ACQUIRE, false, 1), other_t, 0),
            Err(Status::RESERVATION_CONFLICT)
        );
        let got = (
            s.allows(&holder.host, Access::Write),
            s.allows(&other.host, Access::Read),
            s.allows(&other.host, Access::Write),
            s.allows(&stranger.host, Access::Read),
            s.allows(&stranger.host, Access::Write),
        );
        assert_eq!(got, (hw, rr, rw, sr, sw), "{t:?}");
        assert!(s.allows(&holder.host, Access::Read));
    }
    let mut s = ResvState::default();
    reg(&mut s, &holder, 1).unwrap();
    assert_eq!(s.acquire(&holder, ask(racqa::ACQUIRE, false, 1), 7, 0), Err(Status::INVALID_FIELD), "type 7");
    assert_eq!(s.acquire(&holder, ask(3, false, 1), 1, 0), Err(Status::INVALID_FIELD), "reserved action");
}

#[test]
fn release_and_clear_and_what_they_tell_the_others() {
    let (a, b, c) = (host(1, 1), host(2, 2), host(3, 3));
    let mut s = ResvState::default();
    for (h, k) in [(&a, 1), (&b, 2), (&c, 3)] {
        reg(&mut s, h, k).unwrap();
    }
    s.acquire(&a, ask(racqa::ACQUIRE, false, 1), T::WriteExclusiveRegistrantsOnly as u8, 0).unwrap();
    // Not the holder: nothing happens; the holder with another type: Invalid Field.
    s.release(&b, ask(rrela::RELEASE, false, 2), 3).unwrap();
    assert_eq!(s.rtype, Some(3));
    assert_eq!(s.release(&a, ask(rrela::RELEASE, false, 1), 1), Err(Status::INVALID_FIELD));
    assert_eq!(
        s.release(&a, ask(rrela::RELEASE, false, 9), 3),
        Err(Status::RESERVATION_CONFLICT),
        "wrong key"
    );
    let generation = s.generation;
    s.release(&a, ask(rrela::RELEASE, false, 1), 3).unwrap();
    assert_eq!((s.rtype, s.holder, s.generation), (None, None, generation), "release keeps the generation");
    // A registrants-only reservation released: the other registrants hear of it.
    assert_eq!(s.take_notices(2), vec![n::RESERVATION_RELEASED]);
    assert_eq!(s.take_notices(3), vec![n::RESERVATION_RELEASED]);
    assert_eq!(s.take_notices(1), Vec::<u8>::new(), "not the host that released");
    // Write Exclusive released: nobody is told.
    s.acquire(&a, ask(racqa::ACQUIRE, false, 1), 1, 0).unwrap();
    s.release(&a, ask(rrela::RELEASE, false, 1), 1).unwrap();
    assert!(s.notices.is_empty());
    // Clear: every registration and the reservation go; the others are told.
    s.acquire(&b, ask(racqa::ACQUIRE, false, 2), 2, 0).unwrap();
    s.release(&c, ask(rrela::CLEAR, false, 3), 0).unwrap();
    assert!(s.registrants.is_empty() && s.rtype.is_none());
    assert_eq!((s.take_notices(1), s.take_notices(2), s.take_notices(3)), (vec![3], vec![3], vec![]));
}

#[test]
fn preempting_the_holder_or_registrants() {
    let (a, b, c) = (host(1, 1), host(2, 2), host(3, 3));
    let mut s = ResvState::default();
    for (h, k) in [(&a, 1), (&b, 2), (&c, 3)] {
        reg(&mut s, h, k).unwrap();
    }
    s.acquire(&a, ask(racqa::ACQUIRE, false, 1), T::ExclusiveAccess as u8, 0).unwrap();
    // B preempts the holder: A's registration goes, B holds the reservation (of
    // the type B asks), A hears its registration was preempted, C that the
    // reservation was.
    let g = s.generation;
    let taken = s.acquire(&b, ask(racqa::PREEMPT_AND_ABORT, false, 2), T::WriteExclusive as u8, 1).unwrap();
    assert_eq!(taken, vec![a.host]);
    assert_eq!((s.rtype, s.holder, s.generation), (Some(1), Some(b.host), g + 1));
    assert!(!s.registrants.iter().any(|r| r.host == a.host));
    assert_eq!(s.take_notices(1), vec![n::REGISTRATION_PREEMPTED]);
    assert_eq!(s.take_notices(3), vec![n::RESERVATION_PREEMPTED]);
    // Preempting another key than the holder's: those registrants go, the
    // reservation stays; a key nobody has: conflict; key 0: Invalid Field.
    assert_eq!(s.acquire(&b, ask(racqa::PREEMPT, false, 2), 1, 3).unwrap(), vec![c.host]);
    assert_eq!(s.holder, Some(b.host));
    assert_eq!(s.acquire(&b, ask(racqa::PREEMPT, false, 2), 1, 77), Err(Status::RESERVATION_CONFLICT));
    assert_eq!(s.acquire(&b, ask(racqa::PREEMPT, false, 2), 1, 0), Err(Status::INVALID_FIELD));
}

#[test]
fn all_registrants_reservations() {
    let (a, b, c) = (host(1, 1), host(2, 2), host(3, 3));
    let mut s = ResvState::default();
    for (h, k) in [(&a, 1), (&b, 2)] {
        reg(&mut s, h, k).unwrap();
    }
    s.acquire(&a, ask(racqa::ACQUIRE, false, 1), T::ExclusiveAccessAllRegistrants as u8, 0).unwrap();
    assert!(s.holds(&a.host) && s.holds(&b.host) && !s.holds(&c.host));
    // B may acquire it too (it holds it already).
    s.acquire(&b, ask(racqa::ACQUIRE, false, 2), 6, 0).unwrap();
    // One registrant leaving keeps it; the last one ends it.
    s.register(&a, ask(rrega::UNREGISTER, false, 1), 0, NO_PTPL).unwrap();
    assert_eq!(s.rtype, Some(6));
    s.register(&b, ask(rrega::UNREGISTER, false, 2), 0, NO_PTPL).unwrap();
    assert_eq!(s.rtype, None);
    // PRKEY 0 preempts every other registrant and takes the reservation.
    for (h, k) in [(&a, 1), (&b, 2), (&c, 3)] {
        reg(&mut s, h, k).unwrap();
    }
    s.acquire(&a, ask(racqa::ACQUIRE, false, 1), 5, 0).unwrap();
    let mut taken = s.acquire(&c, ask(racqa::PREEMPT, false, 3), 1, 0).unwrap();
    taken.sort();
    assert_eq!(taken, vec![a.host, b.host]);
    assert_eq!((s.rtype, s.holder, s.registrants.len()), (Some(1), Some(c.host), 1));
}

#[test]
fn the_holder_unregistering_ends_its_reservation() {
    let (a, b) = (host(1, 1), host(2, 2));
    let mut s = ResvState::default();
    reg(&mut s, &a, 1).unwrap();
    reg(&mut s, &b, 2).unwrap();
    s.acquire(&a, ask(racqa::ACQUIRE, false, 1), 3, 0).unwrap();
    s.register(&a, ask(rrega::UNREGISTER, true, 0), 0, NO_PTPL).unwrap();
    assert_eq!((s.rtype, s.holder), (None, None));
    assert_eq!(s.take_notices(2), vec![n::RESERVATION_RELEASED]);
}

#[test]
fn a_damaged_state_is_refused() {
    let a = host(1, 1);
    let mut s = ResvState::default();
    reg(&mut s, &a, 1).unwrap();
    s.acquire(&a, ask(racqa::ACQUIRE, false, 1), 1, 0).unwrap();
    assert!(s.check().is_ok());
    let mut bad = s.clone();
    bad.registrants.clear();
    assert!(bad.check().unwrap_err().contains("holder"));
    let mut bad = s.clone();
    bad.rtype = Some(9);
    assert!(bad.check().is_err());
    let bad = ResvState { holder: Some(a.host), ..Default::default() };
    assert!(bad.check().is_err());
}

fn temp(name: &str) -> std::path::PathBuf {
    let d = std::env::temp_dir().join(format!("vnvme-resv-{}-{name}", std::process::id()));
    let _ = std::fs::remove_file(&d);
    d
}

/// Opens the state file at `p`, made (initialized) if it is new.
fn open(p: &std::path::Path) -> ResvFile {
    let f = std::fs::OpenOptions::new().read(true).write(true).create(true).truncate(false).open(p).unwrap();
    super::initialize(&f).unwrap();
    ResvFile::open(f).unwrap()
}

/// Two opens of one file, as two controllers' processes have: a change through
/// one is what the other reads next, with no reload while nothing moves.
#[test]
fn two_opens_of_one_file_share_the_state() {
    let p = temp("share");
    let (one, two) = (open(&p), open(&p));
    let a = host(1, 1);
    assert!(two.current().registrants.is_empty());
    one.update(|s| reg(s, &a, 5)).unwrap();
    assert_eq!(two.current().registrants[0].key, 5, "seen through the other open at once");
    one.update(|s| s.acquire(&a, ask(racqa::ACQUIRE, false, 5), 2, 0)).unwrap();
    assert!(!two.current().allows(&host(2, 2).host, Access::Read));
    // A refused update writes nothing.
    let before = two.current();
    assert!(matches!(
        two.update(|s| reg(s, &a, 6)),
        Err(crate::shared_file::UpdateError::Rules(Status::RESERVATION_CONFLICT))
    ));
    assert_eq!(one.current(), before);
    // Reopened (a restart): the state is still there.
    drop((one, two));
    assert_eq!(open(&p).current().rtype, Some(2));
    // A file that is not a state file is refused.
    std::fs::write(&p, b"something else entirely").unwrap();
    let f = std::fs::OpenOptions::new().read(true).write(true).open(&p).unwrap();
    assert!(matches!(ResvFile::open(f), Err(super::StoreError::NotOurs(_))));
    let _ = std::fs::remove_file(&p);
}

/// The registrant bound holds for every way in (Replace with IEKEY registers
/// too), and every successful Register moves the generation.
#[test]
fn the_registrant_bound_and_the_generation() {
    let mut s = ResvState::default();
    for i in 0..super::rules::MAX_REGISTRANTS {
        let mut h = [0u8; 16];
        h[..8].copy_from_slice(&(i as u64 + 1).to_le_bytes());
        reg(&mut s, &Requester { host: h, cntlid: 1 }, 1).unwrap();
    }
    let late = host(0xff, 9);
    assert_eq!(reg(&mut s, &late, 1), Err(Status::RESERVATION_CONFLICT));
    assert_eq!(
        s.register(&late, ask(rrega::REPLACE, true, 0), 5, NO_PTPL),
        Err(Status::RESERVATION_CONFLICT)
    );
    assert!(s.check().is_ok(), "the state stays one the file reads back");
    let g = s.generation;
    let first = s.registrants[0].clone();
    reg(&mut s, &Requester { host: first.host, cntlid: 2 }, first.key).unwrap();
    assert_eq!(s.generation, g + 1, "registering again with the same key moves it too");
}

/// A host with two controllers that registered through one hears through both:
/// it named itself on the other (Set Features Host Identifier).
#[test]
fn a_host_hears_through_every_controller_it_named_itself_on() {
    let (a, b) = (host(1, 1), host(2, 3));
    let mut s = ResvState::default();
    s.name_host(1, a.host);
    s.name_host(2, a.host);
    s.name_host(3, b.host);
    reg(&mut s, &a, 10).unwrap();
    reg(&mut s, &b, 20).unwrap();
    s.acquire(&a, ask(racqa::ACQUIRE, false, 10), 1, 0).unwrap();
    // b preempts a: a's registration goes, through controllers 1 and 2.
    s.acquire(&b, ask(racqa::PREEMPT, false, 20), 1, 10).unwrap();
    assert_eq!(s.take_notices(1), vec![n::REGISTRATION_PREEMPTED]);
    assert_eq!(s.take_notices(2), vec![n::REGISTRATION_PREEMPTED], "named, not registered through");
    assert!(s.take_notices(3).is_empty(), "not to the preempting host");
    // Renamed or cleared, a controller stops hearing for the old name.
    s.name_host(2, [0; 16]);
    assert_eq!(s.named.len(), 2);
    assert!(s.check().is_ok());
    let mut bad = s.clone();
    bad.named.push((1, b.host));
    assert!(bad.check().unwrap_err().contains("named twice"));
}
