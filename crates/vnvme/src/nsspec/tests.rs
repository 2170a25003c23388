//! `--ns` parsing and opening, case by case.

use super::*;

#[test]
fn parses_specs_and_rejects_bad_ones() {
    let n: NsSpec = "ram:64M".parse().unwrap();
    assert_eq!((n.kind, n.size, n.lba_format), (Kind::Ram, Some(64 << 20), None));
    let n: NsSpec = "null:1G:lba=4096".parse().unwrap();
    assert_eq!((n.kind, n.size, n.lba_format), (Kind::Null(NullReads::Zeroes), Some(1 << 30), Some(1)));
    let n: NsSpec = "null:1G:reads=untouched".parse().unwrap();
    assert_eq!(n.kind, Kind::Null(NullReads::Untouched));
    assert_eq!(
        n.open(None, &Default::default()).expect("opens").backend.info().kind,
        "null (reads untouched)"
    );
    let e = "null:1G:reads=random".parse::<NsSpec>().unwrap_err();
    assert!(e.contains("reads=random: expected zeroes or untouched"), "{e}");
    let e = "ram:1G:reads=untouched".parse::<NsSpec>().unwrap_err();
    assert!(e.contains("unknown namespace option \"reads=untouched\""), "{e}");
    assert!("disk:1G".parse::<NsSpec>().is_err());
    assert!("ram".parse::<NsSpec>().is_err());
    assert!("ram:lba=512".parse::<NsSpec>().is_err(), "ram needs a size");
    assert!("ram:1000".parse::<NsSpec>().is_err(), "not a multiple of 512");
    assert!("ram:1M:lba=1024".parse::<NsSpec>().unwrap_err().contains("512 or 4096"));
    assert!("ram:12Q".parse::<NsSpec>().is_err());
    assert!("ram:1M:direct=on".parse::<NsSpec>().unwrap_err().contains("unknown namespace option"));
    let n: NsSpec = "file:disk.img:8M".parse().unwrap();
    assert_eq!((n.kind, n.size, n.file.engine), (Kind::File("disk.img".into()), Some(8 << 20), Engine::Auto));
    assert!("file::8M".parse::<NsSpec>().is_err());
    // An existing file needs no size; options follow the path directly.
    let n: NsSpec = "file:/dev/sdb:direct=off:engine=sync:lba=4096".parse().unwrap();
    assert_eq!(
        (n.size, n.file.direct, n.file.engine, n.lba_format),
        (None, DirectMode::Off, Engine::Sync, Some(1))
    );
    let n: NsSpec = "file:/dev/sdb:direct=on:engine=uring".parse().unwrap();
    assert_eq!((n.file.direct, n.file.engine), (DirectMode::On, Engine::Uring));
    assert!("file:x:direct=maybe".parse::<NsSpec>().unwrap_err().contains("auto, on or off"));
    let n: NsSpec = "ram:1M:fault=read/eio/lba=8+2:fault=flush/eio/count=1".parse().unwrap();
    assert_eq!(n.faults.len(), 2);
    assert!("ram:1M:fault=read/oops".parse::<NsSpec>().unwrap_err().contains("unknown error"));
    assert_eq!(n.timeout, Some(Duration::from_secs(30)), "the default timeout");
    for (t, want) in [
        ("500ms", Some(Duration::from_millis(500))),
        ("5s", Some(Duration::from_secs(5))),
        ("7", Some(Duration::from_secs(7))),
        ("0", None),
        ("off", None),
    ] {
        assert_eq!(format!("ram:1M:timeout={t}").parse::<NsSpec>().unwrap().timeout, want, "{t}");
    }
    assert!("ram:1M:timeout=soon".parse::<NsSpec>().unwrap_err().contains("N[ms|s]"));
    let n: NsSpec = "ram:1M:fault=read/hang:timeout=500ms".parse().unwrap();
    assert_eq!((n.faults.len(), n.timeout), (1, Some(Duration::from_millis(500))));
    let n: NsSpec = "nvme:///run/a.sock?ns=2".parse().unwrap();
    assert_eq!(n.kind, Kind::Nvme("nvme:///run/a.sock?ns=2".into()));
}

#[test]
fn opens_with_the_lba_the_backend_needs_and_wraps_faults() {
    let o = "ram:1M:fault=read/eio".parse::<NsSpec>().unwrap().open(None, &Default::default()).unwrap();
    assert_eq!(o.lba_format, 0);
    assert!(o.backend.info().kind.contains("fault rule"), "{}", o.backend.info().kind);
    let dir = std::env::temp_dir().join(format!("vnvme-nsspec-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let p = dir.join("a.img");
    let o = format!("file:{}:1M", p.display())
        .parse::<NsSpec>()
        .unwrap()
        .open(None, &Default::default())
        .unwrap();
    assert_eq!(o.backend.info().size, 1 << 20);
    // Closed (one open of a file at a time), then reopened without a size, it
    // keeps the size it has.
    drop(o);
    let o =
        format!("file:{}", p.display()).parse::<NsSpec>().unwrap().open(None, &Default::default()).unwrap();
    assert_eq!(o.backend.info().size, 1 << 20);
    let e = format!("file:{}", dir.join("missing.img").display())
        .parse::<NsSpec>()
        .unwrap()
        .open(None, &Default::default());
    assert!(e.is_err(), "a missing file without a size is an error");
    drop(o);
    // Auto: io_uring on a disk file system, pread/pwrite on tmpfs.
    let kind =
        |s: &str| s.parse::<NsSpec>().unwrap().open(None, &Default::default()).unwrap().backend.info().kind;
    if rustix::fs::statfs(&dir).map(|s| s.f_type as u64 != 0x0102_1994).unwrap_or(false) {
        assert!(kind(&format!("file:{}", p.display())).starts_with("uring:"));
    }
    if std::path::Path::new("/dev/shm").is_dir() {
        let shm = format!("/dev/shm/vnvme-nsspec-{}.img", std::process::id());
        assert!(kind(&format!("file:{shm}:1M")).starts_with("file:"), "tmpfs: the sync engine");
        assert!(kind(&format!("file:{shm}:engine=uring")).starts_with("uring:"));
        std::fs::remove_file(&shm).unwrap();
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

/// issue 27: URI kinds take the options too, after the URI, read from the end
/// so a port, a path or a query keeps its colons; hold= is for kinds that wait
/// for their storage, and within the timeout.
#[test]
fn uri_kinds_take_options_after_the_uri() {
    let n: NsSpec = "nbd://192.0.2.7:10810/exp:timeout=5s:hold=2s:lba=4096".parse().unwrap();
    assert_eq!(n.kind, Kind::Nbd("nbd://192.0.2.7:10810/exp".into()));
    assert_eq!(
        (n.timeout, n.hold, n.lba_format),
        (Some(Duration::from_secs(5)), Some(Duration::from_secs(2)), Some(1))
    );
    assert_eq!(n.hold(), Duration::from_secs(2));
    let n: NsSpec = "nbd+unix:///e?socket=/run/a:b.sock:fault=read/eio/lba=0+8".parse().unwrap();
    assert_eq!(n.kind, Kind::Nbd("nbd+unix:///e?socket=/run/a:b.sock".into()));
    assert_eq!(n.faults.len(), 1);
    let n: NsSpec = "nbd://h/e".parse().unwrap();
    assert_eq!((n.hold, n.hold()), (None, DEFAULT_HOLD), "the default hold");
    let n: NsSpec = "nbd://h/e:timeout=12s".parse().unwrap();
    assert_eq!(n.hold(), Duration::from_secs(10), "the default hold stays within the timeout");
    let n: NsSpec = "nbd://h/e:hold=0".parse().unwrap();
    assert_eq!(n.hold(), Duration::ZERO, "hold=0: fail at once");
    let n: NsSpec = "nvme:///run/a.sock?ns=2:timeout=3s".parse().unwrap();
    assert_eq!(
        (n.kind, n.timeout),
        (Kind::Nvme("nvme:///run/a.sock?ns=2".into()), Some(Duration::from_secs(3)))
    );
    let e = "nbd://h/e:hold=30s".parse::<NsSpec>().unwrap_err();
    assert!(e.contains("not shorter than timeout"), "{e}");
    let e = "ram:1M:hold=5s".parse::<NsSpec>().unwrap_err();
    assert!(e.contains("only nbd:// and rbd:"), "{e}");
    let e = "file:/tmp/x:hold=5s".parse::<NsSpec>().unwrap_err();
    assert!(e.contains("only nbd:// and rbd:"), "{e}");
}

/// issue 49: direct=on is had or refused, never dropped: engine=sync does no
/// O_DIRECT, nor does the engine auto picks on a memory file system.
#[test]
fn direct_on_is_refused_where_it_cannot_be_had() {
    let e = "file:/dev/sdb:direct=on:engine=sync".parse::<NsSpec>().unwrap_err();
    assert!(e.contains("engine=sync") && e.contains("leave out direct=on"), "{e}");
    if !std::path::Path::new("/dev/shm").is_dir() {
        return;
    }
    let shm = format!("/dev/shm/vnvme-nsspec-direct-{}.img", std::process::id());
    let e = format!("file:{shm}:1M:direct=on")
        .parse::<NsSpec>()
        .unwrap()
        .open(None, &Default::default())
        .unwrap_err();
    let e = e.to_string();
    for needle in [shm.as_str(), "direct=on", "tmpfs", "Leave out direct=on", "disk's file system"] {
        assert!(e.contains(needle), "{needle:?} missing from: {e}");
    }
    assert!(!std::path::Path::new(&shm).exists(), "refused before the file was created");
    // direct=auto (the default) and off serve it, with pread/pwrite.
    for direct in ["", ":direct=auto", ":direct=off"] {
        let o = format!("file:{shm}:1M{direct}")
            .parse::<NsSpec>()
            .unwrap()
            .open(None, &Default::default())
            .unwrap();
        assert!(o.backend.info().kind.starts_with("file:"), "{direct}: {}", o.backend.info().kind);
    }
    std::fs::remove_file(&shm).unwrap();
}
