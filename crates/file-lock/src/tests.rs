//! Two opens of one file in this process exclude each other exactly as two
//! processes do (the locks are the open file's), so most cases need one process;
//! a Python child that locks as QEMU does stands for a holder that is not vnvme.
//!
//! An OFD lock goes when the last descriptor of its open goes, and a child
//! spawned by another test thread holds a copy of every descriptor from its fork
//! to its exec. So a test that frees a lock by closing a file holds `SPAWNS` for
//! reading, and the test that spawns holds it for writing: no child is between
//! fork and exec while a test counts on a close freeing its lock.

use std::fs::File;
use std::path::PathBuf;
use std::sync::{RwLock, RwLockReadGuard};

use super::*;

static SPAWNS: RwLock<()> = RwLock::new(());

/// Held by a test that counts on a closed file's lock being gone.
fn no_spawns() -> RwLockReadGuard<'static, ()> {
    SPAWNS.read().unwrap_or_else(|e| e.into_inner())
}

fn temp(name: &str) -> PathBuf {
    let p = std::env::temp_dir().join(format!("vnvme-file-lock-{}-{name}", std::process::id()));
    std::fs::write(&p, b"data").unwrap();
    p
}

fn open(p: &PathBuf) -> File {
    std::fs::OpenOptions::new().read(true).write(true).open(p).unwrap()
}

fn req(mode: Mode, nsid: u32) -> Request {
    Request { mode, role: Role::Data, nsid: Some(nsid), accept: Vec::new(), share_with_vnvme: false }
}

fn shared(group: &str) -> Mode {
    Mode::SharedWrite { group: group.into() }
}

fn in_use(r: Result<(), LockError>) -> InUse {
    match r {
        Err(LockError::InUse(u)) => u,
        other => panic!("expected a refusal, got {other:?}"),
    }
}

#[test]
fn a_second_writer_is_refused_and_told_who_holds_the_file() {
    let _quiet = no_spawns();
    let p = temp("writers");
    let (a, b) = (open(&p), open(&p));
    lock(&a, &req(Mode::Write, 1)).unwrap();
    let u = in_use(lock(&b, &req(Mode::Write, 3)));
    assert_eq!(u.holders, vec![Holder { pid: std::process::id(), role: Some(Role::Data), nsid: Some(1) }]);
    assert!(u.only_this_process());
    assert!(u.to_string().contains("in use by a writer: this process (namespace 1's data)"), "{u}");
    // Refused, it holds nothing: once the first open closes, the file is free.
    drop(a);
    lock(&b, &req(Mode::Write, 3)).unwrap();
    // Locking the same open again changes nothing.
    lock(&b, &req(Mode::Write, 3)).unwrap();
    std::fs::remove_file(&p).unwrap();
}

#[test]
fn readers_share_and_keep_writers_out() {
    let _quiet = no_spawns();
    let p = temp("readers");
    let (r1, r2, w) = (open(&p), open(&p), open(&p));
    lock(&r1, &req(Mode::Read, 1)).unwrap();
    lock(&r2, &req(Mode::Read, 2)).unwrap();
    assert_eq!(in_use(lock(&w, &req(Mode::Write, 3))).conflict, Conflict::Guarded);
    assert_eq!(in_use(lock(&w, &req(shared("s"), 3))).conflict, Conflict::Guarded);
    drop((r1, r2));
    lock(&w, &req(Mode::Write, 3)).unwrap();
    let r3 = open(&p);
    assert_eq!(in_use(lock(&r3, &req(Mode::Read, 4))).conflict, Conflict::Written);
    std::fs::remove_file(&p).unwrap();
}

#[test]
fn writers_of_one_group_share_and_no_one_else_does() {
    let _quiet = no_spawns();
    let p = temp("group");
    let (a, b, c, d, e) = (open(&p), open(&p), open(&p), open(&p), open(&p));
    lock(&a, &req(shared("SN-1"), 1)).unwrap();
    lock(&b, &req(shared("SN-1"), 2)).unwrap();
    let u = in_use(lock(&c, &req(shared("SN-2"), 1)));
    assert_eq!(u.conflict, Conflict::OtherGroup);
    assert_eq!(u.holders.len(), 2, "both holders named: {u}");
    assert_eq!(in_use(lock(&d, &req(Mode::Write, 1))).conflict, Conflict::Written);
    assert_eq!(in_use(lock(&e, &req(Mode::Read, 1))).conflict, Conflict::Written);
    // And an only writer keeps the group out.
    drop((a, b));
    lock(&d, &req(Mode::Write, 1)).unwrap();
    assert_eq!(in_use(lock(&c, &req(shared("SN-2"), 1))).conflict, Conflict::Guarded);
    std::fs::remove_file(&p).unwrap();
}

#[test]
fn an_accepted_holder_is_no_conflict() {
    let p = temp("accept");
    let (a, b) = (open(&p), open(&p));
    lock(&a, &req(Mode::Write, 1)).unwrap();
    let r = Request { accept: vec![std::process::id()], ..req(Mode::Write, 1) };
    lock(&b, &r).unwrap();
    // A migration's destination shares with any vnvme holder.
    let c = open(&p);
    lock(&c, &Request { share_with_vnvme: true, ..req(Mode::Write, 2) }).unwrap();
    std::fs::remove_file(&p).unwrap();
}

#[test]
fn holders_are_named_with_pid_role_and_namespace() {
    for (pid, role, nsid) in
        [(1, Role::Stats, None), (4_194_303, Role::PoolData, Some(1024)), (77, Role::ZoneState, Some(0xffff))]
    {
        let v = holder_value(pid, role, nsid);
        assert!((0..HOLDER_SPAN).contains(&v));
        assert_eq!(decode_holder(v), Holder { pid, role: Some(role), nsid });
    }
    assert_eq!(decode_holder(holder_value(5, Role::Data, Some(70_000))).nsid, Some(0xffff), "clamped");
    // Every role is named back as itself (a role missing from ALL would be named
    // as no role at all).
    for (i, role) in Role::ALL.into_iter().enumerate() {
        assert_eq!(role as usize, i + 1);
        assert_eq!(decode_holder(holder_value(9, role, None)).role, Some(role));
    }
}

/// QEMU's bytes alone (no vnvme holder byte): refused, and the process that has
/// the file open is named.
#[test]
fn a_holder_that_is_not_vnvme_is_named_by_its_process() {
    let _spawning = SPAWNS.write().unwrap_or_else(|e| e.into_inner());
    let p = temp("qemu-like");
    // A writer as QEMU locks one: it has read, write, write-unchanged and resize,
    // and shares neither write nor resize.
    let script = "import fcntl,os,struct,sys,time\n\
        f=os.open(sys.argv[1],os.O_RDWR)\n\
        for b in (100,101,102,103,201,203):\n\
        \x20   fcntl.fcntl(f,fcntl.F_OFD_SETLK,struct.pack('hhqqi',fcntl.F_RDLCK,0,b,1,0))\n\
        print('locked',flush=True)\n\
        time.sleep(30)\n";
    let mut child = match std::process::Command::new("python3")
        .args(["-c", script])
        .arg(&p)
        .stdout(std::process::Stdio::piped())
        .spawn()
    {
        Ok(c) => c,
        Err(e) => {
            eprintln!("SKIP: python3 cannot be run ({e})");
            return;
        }
    };
    let mut line = String::new();
    std::io::BufRead::read_line(&mut std::io::BufReader::new(child.stdout.take().unwrap()), &mut line)
        .unwrap();
    assert_eq!(line.trim(), "locked");
    let f = open(&p);
    let u = in_use(lock(&f, &req(Mode::Write, 1)));
    // Sharing with vnvme holders (a migration) is no sharing with it.
    in_use(lock(&f, &Request { share_with_vnvme: true, ..req(Mode::Write, 1) }));
    let _ = child.kill();
    let _ = child.wait();
    assert!(u.holders.is_empty());
    assert_eq!(u.others.iter().map(|o| o.0).collect::<Vec<_>>(), vec![child.id()], "{u}");
    assert!(u.to_string().contains("not vnvme"), "{u}");
    // Gone with its process.
    lock(&f, &req(Mode::Write, 1)).unwrap();
    std::fs::remove_file(&p).unwrap();
}
