//! Dispatch, Identify and the Commands Supported and Effects log agree (issue 51):
//! for every configuration a `vnvme serve` command line can make, every admin and
//! I/O opcode 00h-FFh is answered Invalid Opcode exactly when the log leaves it
//! out, and exactly when its OACS or ONCS bit (where it has one) is clear.
//!
//! Each opcode is sent as the host would send it by mistake: zero fields, nothing
//! valid but the opcode (and, for I/O, namespace 1 and a buffer). Whatever else it
//! is answered, only Invalid Opcode says "not supported".

mod io_common;

use std::path::PathBuf;
use std::sync::Arc;

use block_backend::{Backend, NullBackend, RamBackend};
use io_common::{effects_log, opts, Plain, MEM};
use nvme_ctrl::pool::{LockPolicy, NamespacePool};
use nvme_ctrl::zoned::ZonedConfig;
use nvme_ctrl::{ControllerConfig, FdpConfig, MetaFile, MetadataConfig, NamespaceConfig, SubsystemConfig};
use nvme_spec::opcode::{admin as aop, nvm as iop};
use nvme_spec::zns::{CSI_NVM, CSI_ZNS};
use nvme_spec::{Sqe, Status};
use test_kit::MockHost;
use zerocopy::little_endian::U32;

const NS_BYTES: u64 = 8 << 20;

/// Files a configuration uses, removed when it is done.
struct Scratch(Vec<PathBuf>);

impl Drop for Scratch {
    fn drop(&mut self) {
        for p in &self.0 {
            let _ = std::fs::remove_dir_all(p);
            let _ = std::fs::remove_file(p);
        }
    }
}

fn scratch(name: &str) -> PathBuf {
    let p = std::env::temp_dir().join(format!("vnvme-agree-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&p);
    let _ = std::fs::remove_file(&p);
    p
}

fn ram() -> Arc<dyn Backend> {
    Arc::new(RamBackend::new(NS_BYTES))
}

/// Every configuration the CLI can make that changes what is offered, by name,
/// with namespace 1's command set.
fn configurations() -> Vec<(&'static str, ControllerConfig, u8, Scratch)> {
    let base = |ns: NamespaceConfig| ControllerConfig { namespaces: vec![ns], ..Default::default() };
    let mut out = vec![
        ("ram, shadow doorbells", base(NamespaceConfig::new(ram(), 0)), CSI_NVM, Scratch(vec![])),
        (
            "ram, no shadow doorbells",
            ControllerConfig { shadow_doorbells: false, ..base(NamespaceConfig::new(ram(), 0)) },
            CSI_NVM,
            Scratch(vec![]),
        ),
        (
            "null",
            base(NamespaceConfig::new(Arc::new(NullBackend::new(NS_BYTES)), 0)),
            CSI_NVM,
            Scratch(vec![]),
        ),
        (
            "a backend without discard or write zeroes",
            base(NamespaceConfig::new(Arc::new(Plain(RamBackend::new(NS_BYTES))), 0)),
            CSI_NVM,
            Scratch(vec![]),
        ),
        (
            "a backend without discard, no shadow doorbells",
            ControllerConfig {
                shadow_doorbells: false,
                ..base(NamespaceConfig::new(Arc::new(Plain(RamBackend::new(NS_BYTES))), 0))
            },
            CSI_NVM,
            Scratch(vec![]),
        ),
        (
            "zoned",
            base(NamespaceConfig {
                zoned: Some(ZonedConfig {
                    zone_size: 1 << 20,
                    zone_capacity: 1 << 20,
                    max_open: 0,
                    max_active: 0,
                    state_file: None,
                }),
                ..NamespaceConfig::new(ram(), 0)
            }),
            CSI_ZNS,
            Scratch(vec![]),
        ),
        (
            "flexible data placement",
            ControllerConfig {
                fdp: Some(FdpConfig { ruhs: 4, ru_size: 1 << 20 }),
                ..base(NamespaceConfig::new(ram(), 1))
            },
            CSI_NVM,
            Scratch(vec![]),
        ),
        (
            "metadata",
            base(NamespaceConfig {
                metadata: Some(MetadataConfig {
                    store: MetaFile::memory().unwrap(),
                    dps: 0,
                    extended: false,
                }),
                ..NamespaceConfig::new(ram(), 0)
            }),
            CSI_NVM,
            Scratch(vec![]),
        ),
    ];
    let path = scratch("resv");
    let file = std::fs::OpenOptions::new().read(true).write(true).create_new(true).open(&path).unwrap();
    nvme_ctrl::reservation::initialize(&file).unwrap();
    out.push((
        "reservations",
        ControllerConfig {
            subsystem: Some(SubsystemConfig { cntlid: 1 }),
            serial: "AGREE001".into(),
            ..base(NamespaceConfig { reservations: Some(Arc::new(file)), ..NamespaceConfig::new(ram(), 0) })
        },
        CSI_NVM,
        Scratch(vec![path]),
    ));
    let dir = scratch("pool");
    let locks = LockPolicy { group: Some("SUBSYSTEM".into()), ..Default::default() };
    let pool = NamespacePool::open(&dir, Some(64 << 20), 1, &[1], &locks).unwrap();
    out.push((
        "a namespace pool",
        ControllerConfig {
            max_namespaces: 16,
            subsystem: Some(SubsystemConfig { cntlid: 1 }),
            pool: Some(Arc::new(pool)),
            serial: "AGREE002".into(),
            ..base(NamespaceConfig::new(ram(), 0))
        },
        CSI_NVM,
        Scratch(vec![dir]),
    ));
    out
}

fn le32(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(b[at..at + 4].try_into().unwrap())
}

/// OACS and ONCS bits by opcode, as the base specification assigns them (written
/// here, not taken from the controller's table).
fn oacs_bit(op: u8) -> Option<u16> {
    match op {
        aop::FORMAT_NVM => Some(1 << 1),
        aop::NAMESPACE_MANAGEMENT | aop::NAMESPACE_ATTACHMENT => Some(1 << 3),
        aop::DOORBELL_BUFFER_CONFIG => Some(1 << 8),
        _ => None,
    }
}

fn oncs_bit(op: u8) -> Option<u16> {
    match op {
        iop::COMPARE => Some(1 << 0),
        iop::DATASET_MANAGEMENT => Some(1 << 2),
        iop::WRITE_ZEROES => Some(1 << 3),
        iop::RESERVATION_REGISTER
        | iop::RESERVATION_REPORT
        | iop::RESERVATION_ACQUIRE
        | iop::RESERVATION_RELEASE => Some(1 << 5),
        iop::VERIFY => Some(1 << 7),
        iop::COPY => Some(1 << 8),
        _ => None,
    }
}

/// Whether the controller answered `c` as a command it has (anything but Invalid
/// Opcode; no answer yet, as for an Asynchronous Event Request, is having it).
fn answered(c: Option<nvme_spec::Cqe>) -> bool {
    c.is_none_or(|c| c.status().code() != Status::INVALID_OPCODE.code())
}

#[test]
fn dispatch_identify_and_the_effects_log_agree_on_every_opcode_in_every_configuration() {
    let mut seen_off = [false; 3];
    for (name, cfg, csi, _files) in configurations() {
        let mut h = MockHost::new(cfg, MEM);
        h.init(opts()).unwrap_or_else(|e| panic!("{name}: bring-up: {e:?}"));
        let id = h.identify(0x01, 0).unwrap();
        let oacs = u16::from_le_bytes([id[256], id[257]]);
        let oncs = u16::from_le_bytes([id[520], id[521]]);
        let (st, log) = effects_log(&mut h, csi);
        assert!(st.is_success(), "{name}: Commands Supported and Effects");
        for op in 0..=255u8 {
            // Admin: nothing valid but the opcode; unaligned pointers, so a command
            // that takes memory (Doorbell Buffer Config) refuses it rather than use it.
            let mut s = Sqe::with_opcode(op);
            s.set_prps(1, 1);
            let got = answered(h.admin_exec(s).0);
            let csupp = le32(&log, op as usize * 4) & 1 != 0;
            assert_eq!(got, csupp, "{name}: admin {op:#04x}: dispatched {got}, Effects log CSUPP {csupp}");
            if let Some(bit) = oacs_bit(op) {
                assert_eq!(oacs & bit != 0, got, "{name}: admin {op:#04x}: OACS {oacs:#x}, dispatched {got}");
            }
            // I/O: namespace 1, one block at LBA 0, a buffer of its own.
            let buf = h.alloc.alloc_pages(2);
            let mut s = Sqe::with_opcode(op);
            s.nsid = U32::new(1);
            s.set_prps(buf, buf + 4096);
            let c = h.io_cmd(1, s);
            let got = c.status().code() != Status::INVALID_OPCODE.code();
            let csupp = le32(&log, 1024 + op as usize * 4) & 1 != 0;
            assert_eq!(
                got,
                csupp,
                "{name}: I/O {op:#04x}: dispatched {got} ({:?}), Effects log CSUPP {csupp}",
                c.status()
            );
            if let Some(bit) = oncs_bit(op) {
                assert_eq!(oncs & bit != 0, got, "{name}: I/O {op:#04x}: ONCS {oncs:#x}, dispatched {got}");
            }
        }
        // The walk went through each optional command switched off at least once.
        seen_off[0] |= oacs & (1 << 8) == 0;
        seen_off[1] |= oncs & (1 << 2) == 0;
        seen_off[2] |= oncs & (1 << 5) != 0 && oacs & (1 << 3) == 0;
    }
    assert_eq!(seen_off, [true; 3], "Doorbell Buffer Config off, DSM off, reservations on");
}
