//! Zoned namespaces (NVMe ZNS 1.1) through the mock host: the Identify structures a
//! Linux host reads to take a zoned namespace (CAP.CSS, the CSI descriptor, CNS
//! 05h/06h/07h/1Ch with CSI 02h, the effects log of CSI 02h), writes held to the
//! write pointer, Zone Append's LBA, Report Zones with its filters and partial
//! reports, the zone actions and limits with their statuses, Copy into a zone, and
//! write pointers that come back after a restart from the zone state file.

mod common;
mod io_common;

use std::fs::File;
use std::sync::Arc;

use block_backend::{Backend, RamBackend};
use common::{le16, le32, le64};
use io_common::*;
use nvme_ctrl::zoned::ZonedConfig;
use nvme_ctrl::{ControllerConfig, NamespaceConfig};
use nvme_spec::admin::GetLogPageCmd;
use nvme_spec::identify::cns;
use nvme_spec::nvm::{CopyCmd, CopyRange, ReadWriteCmd};
use nvme_spec::opcode::zns as zop;
use nvme_spec::zns::{zra, zsa, ZoneMgmtCmd, ZoneState, CSI_ZNS};
use nvme_spec::{Cqe, Status};
use test_kit::MockHost;
use test_util::pattern;
use zerocopy::IntoBytes;

/// Zones of 1 MiB (2,048 blocks of 512 B), 768 KiB writable.
const ZONE: u64 = 1 << 20;
const ZCAP: u64 = 768 << 10;
const BLOCKS: u64 = ZONE / 512;

fn zoned(max_open: u32, max_active: u32, state_file: Option<Arc<File>>) -> ZonedConfig {
    ZonedConfig { zone_size: ZONE, zone_capacity: ZCAP, max_open, max_active, state_file }
}

/// NSID 1 zoned (8 zones and a half: the half is not part of it), NSID 2 not.
fn host(z: ZonedConfig) -> (MockHost, RamBackend) {
    let ram = RamBackend::new(8 * ZONE + ZONE / 2);
    let cfg = ControllerConfig {
        namespaces: vec![
            NamespaceConfig { zoned: Some(z), ..NamespaceConfig::new(Arc::new(ram.clone()), 0) },
            NamespaceConfig::new(Arc::new(RamBackend::new(4 << 20)), 0),
        ],
        ..Default::default()
    };
    let mut h = MockHost::new(cfg, MEM);
    h.init(opts()).expect("bring-up");
    (h, ram)
}

fn write_at(h: &mut MockHost, opcode: u8, slba: u64, data: &[u8]) -> Cqe {
    let buf = h.alloc.alloc(data.len() as u64, 4096);
    h.mem.write(buf, data).unwrap();
    let nlb = (data.len() / 512) as u32;
    let s = h.rw_sqe(opcode, 1, slba, nlb, (buf, data.len() as u64));
    h.io_cmd(1, s)
}

fn send(h: &mut MockHost, nsid: u32, slba: u64, action: u8, all: bool) -> Cqe {
    h.io_cmd(1, ZoneMgmtCmd { nsid, slba }.send(action, all))
}

/// Report Zones of `len` bytes: the header's count and each (state, zslba, wp).
fn report(
    h: &mut MockHost,
    slba: u64,
    zrasf: u8,
    partial: bool,
    len: u32,
) -> (u64, Vec<(ZoneState, u64, u64)>) {
    let (c, raw) = report_raw(h, 1, slba, zrasf, partial, len);
    assert_status(&c, Status::SUCCESS, false);
    let n = le64(&raw, 0);
    let mut zones = Vec::new();
    for d in raw[64..].chunks_exact(64) {
        if d[0] == 0 {
            break;
        }
        assert_eq!(d[0], 2, "zone type: sequential write required");
        assert_eq!(le64(d, 8), ZCAP / 512, "zone capacity");
        zones.push((ZoneState::from_raw(d[1] >> 4).expect("a zone state"), le64(d, 16), le64(d, 24)));
    }
    (n, zones)
}

fn report_raw(h: &mut MockHost, nsid: u32, slba: u64, zrasf: u8, partial: bool, len: u32) -> (Cqe, Vec<u8>) {
    let buf = h.alloc.alloc(len as u64, 4096);
    h.mem.fill(buf, len as u64, 0).unwrap();
    let mut s = ZoneMgmtCmd { nsid, slba }.receive(zra::REPORT_ZONES, zrasf, partial, len);
    let (prp1, prp2) = h.build_prps(buf, len as u64);
    s.set_prps(prp1, prp2);
    let c = h.io_cmd(1, s);
    let mut v = vec![0u8; len as usize];
    h.mem.read(buf, &mut v).unwrap();
    (c, v)
}

fn zone(h: &mut MockHost, zi: u64) -> (ZoneState, u64) {
    let (_, z) = report(h, zi * BLOCKS, 0, true, 128);
    assert_eq!(z[0].1, zi * BLOCKS);
    (z[0].0, z[0].2)
}

#[test]
fn identify_tells_a_host_what_the_zoned_namespace_is() {
    let (mut h, _) = host(zoned(4, 6, None));
    assert!(h.cap().css() & (1 << 6) != 0, "CAP.CSS bit 6: I/O command sets");
    // The Namespace Identification Descriptor with the CSI (type 4, length 1).
    for (nsid, csi) in [(1, CSI_ZNS), (2, 0)] {
        let d = h.identify(cns::NS_DESCRIPTOR_LIST, nsid).unwrap();
        // Descriptors: type, length, 2 reserved bytes, the value; type 0 ends them.
        let mut i = 0;
        while d[i] != 4 {
            assert_ne!(d[i], 0, "NSID {nsid}: no CSI descriptor");
            i += 4 + d[i + 1] as usize;
        }
        assert_eq!((d[i + 1], d[i + 4]), (1, csi), "NSID {nsid}'s CSI");
    }
    // The namespace is the whole zones only.
    let ns = h.identify(cns::NAMESPACE, 1).unwrap();
    assert_eq!(le64(&ns, 0), 8 * BLOCKS);
    let zns = h.identify_raw(cns::CSI_NAMESPACE, 1, (CSI_ZNS as u32) << 24).unwrap();
    assert_eq!(zns[0..2], [0, 0], "ZOC: no variable capacity, no active excursions");
    assert_eq!(zns[2] & 1, 1, "OZCS: reads across zone boundaries");
    assert_eq!((le32(&zns, 4), le32(&zns, 8)), (5, 3), "MAR and MOR, 0's based");
    assert_eq!(le64(&zns, 2816), BLOCKS, "ZSZE of LBA format 0");
    assert_eq!(le64(&zns, 2832), ZONE / 4096, "ZSZE of LBA format 1");
    assert_eq!(
        h.identify_raw(cns::CSI_NAMESPACE, 2, (CSI_ZNS as u32) << 24).unwrap_err().code(),
        Status::INVALID_FIELD,
        "NSID 2 is not zoned"
    );
    let ctrl = h.identify_raw(cns::CSI_CONTROLLER, 0, (CSI_ZNS as u32) << 24).unwrap();
    assert_eq!(ctrl[0], 0, "ZASL 0: Zone Append up to MDTS");
    let list = h.identify_raw(cns::CSI_ACTIVE_NAMESPACE_LIST, 0, (CSI_ZNS as u32) << 24).unwrap();
    assert_eq!((le32(&list, 0), le32(&list, 4)), (1, 0), "the zoned NSIDs");
    let list = h.identify_raw(cns::CSI_ACTIVE_NAMESPACE_LIST, 0, 0).unwrap();
    assert_eq!((le32(&list, 0), le32(&list, 4)), (2, 0), "the NVM NSIDs");
    let sets = h.identify_raw(0x1c, 0, 0).unwrap();
    assert_eq!(sets[0], 0b101, "combination 0: NVM and Zoned Namespace");
    // Linux forces a zoned namespace read-only unless this says Zone Append is there.
    let (st, log) = effects_log(&mut h, CSI_ZNS);
    assert_eq!(st, Status::SUCCESS);
    let iocs = |log: &[u8], op: u8| le32(log, 1024 + 4 * op as usize);
    assert_eq!(iocs(&log, zop::ZONE_APPEND) & 3, 3, "Zone Append: supported, changes LBA content");
    assert_eq!(iocs(&log, zop::ZONE_MGMT_RECV) & 1, 1);
    let (st, log) = effects_log(&mut h, 0);
    assert_eq!(st, Status::SUCCESS);
    assert_eq!(iocs(&log, zop::ZONE_APPEND), 0, "not in the NVM set's log");
    assert_eq!(effects_log(&mut h, 1).0.code(), Status::INVALID_FIELD);
}

#[test]
fn writes_follow_the_write_pointer_and_appends_say_where_they_went() {
    let (mut h, _) = host(zoned(0, 0, None));
    let z1 = BLOCKS;
    let a = pattern(1, 4096);
    assert_status(&write_at(&mut h, WRITE, z1, &a), Status::SUCCESS, false);
    assert_eq!(zone(&mut h, 1), (ZoneState::ImplicitlyOpened, z1 + 8));
    // Not at the pointer: Zone Invalid Write, nothing moves.
    assert_status(&write_at(&mut h, WRITE, z1 + 16, &a), Status::ZONE_INVALID_WRITE, true);
    assert_status(&write_at(&mut h, WRITE, z1, &a), Status::ZONE_INVALID_WRITE, true);
    // Zone Append: at the zone's start, lands at the pointer, Dwords 0-1 say where.
    let b = pattern(2, 1024);
    let c = write_at(&mut h, zop::ZONE_APPEND, z1, &b);
    assert_status(&c, Status::SUCCESS, false);
    assert_eq!(c.dw0.get() as u64 | (c.dw1.get() as u64) << 32, z1 + 8);
    assert_status(&write_at(&mut h, zop::ZONE_APPEND, z1 + 1, &b), Status::INVALID_FIELD, true);
    let (st, back) = h.read_blocks(1, 1, z1, 10, 512);
    assert_eq!(st, Status::SUCCESS);
    assert!(back[..4096] == a[..] && back[4096..] == b[..], "data at the zone's start, then the append");
    // Across the capacity: Zone Boundary Error; up to it: full; then Zone Is Full.
    let rest = ZCAP / 512 - 10;
    let c = h.io_cmd(
        1,
        ReadWriteCmd { nsid: 1, slba: z1 + 10, nlb_z: (rest + 1 - 1) as u16, ..Default::default() }
            .to_sqe(nvme_spec::opcode::nvm::WRITE_ZEROES),
    );
    assert_status(&c, Status::ZONE_BOUNDARY_ERROR, true);
    let c = h.io_cmd(
        1,
        ReadWriteCmd { nsid: 1, slba: z1 + 10, nlb_z: (rest - 1) as u16, ..Default::default() }
            .to_sqe(nvme_spec::opcode::nvm::WRITE_ZEROES),
    );
    assert_status(&c, Status::SUCCESS, false);
    assert_eq!(zone(&mut h, 1).0, ZoneState::Full);
    assert_status(&write_at(&mut h, zop::ZONE_APPEND, z1, &b), Status::ZONE_IS_FULL, true);
    // Reads anywhere, across zones too (beyond the pointer: zeroes).
    assert_eq!(h.read_blocks(1, 1, z1 - 4, 8, 512).0, Status::SUCCESS);
    // The NVM namespace has no zone commands.
    assert_status(&send(&mut h, 2, 0, zsa::RESET, false), Status::INVALID_OPCODE, true);
    let c = write_at(&mut h, zop::ZONE_APPEND, 0, &b);
    assert_status(&c, Status::SUCCESS, false);
    let mut s = h.rw_sqe(zop::ZONE_APPEND, 2, 0, 1, (h.admin_buf, 512));
    s.nsid = 2.into();
    assert_status(&h.io_cmd(1, s), Status::INVALID_OPCODE, true);
}

#[test]
fn report_zones_filters_and_partial_reports() {
    let (mut h, _) = host(zoned(0, 0, None));
    write_at(&mut h, WRITE, 2 * BLOCKS, &pattern(3, 512));
    send(&mut h, 1, 3 * BLOCKS, zsa::OPEN, false);
    send(&mut h, 1, 5 * BLOCKS, zsa::FINISH, false);
    let (n, z) = report(&mut h, 0, 0, false, 64 + 8 * 64);
    assert_eq!((n, z.len()), (8, 8));
    let states: Vec<_> = z.iter().map(|z| z.0).collect();
    use ZoneState::*;
    assert_eq!(states, [Empty, Empty, ImplicitlyOpened, ExplicitlyOpened, Empty, Full, Empty, Empty]);
    assert_eq!(z[2].2, 2 * BLOCKS + 1, "the write pointer past the write");
    // From the zone holding SLBA; a buffer for two: without Partial Report the
    // header counts every match, with it the two returned.
    assert_eq!(report(&mut h, 3 * BLOCKS + 7, 0, false, 64 + 2 * 64), (5, z[3..5].to_vec()));
    assert_eq!(report(&mut h, 3 * BLOCKS + 7, 0, true, 64 + 2 * 64).0, 2);
    // Only empty zones (ZRASF 1), only full ones (5).
    assert_eq!(report(&mut h, 0, 1, false, 4096).0, 5);
    assert_eq!(report(&mut h, 0, 5, false, 4096).1, vec![(Full, 5 * BLOCKS, u64::MAX)]);
    // A header alone.
    assert_eq!(report(&mut h, 0, 0, false, 64), (8, vec![]));
    let (c, _) = report_raw(&mut h, 1, 0, 8, false, 4096);
    assert_status(&c, Status::INVALID_FIELD, true);
    let (c, _) = report_raw(&mut h, 1, 8 * BLOCKS, 0, false, 4096);
    assert_status(&c, Status::LBA_OUT_OF_RANGE, true);
}

#[test]
fn zone_actions_limits_and_their_statuses() {
    let (mut h, _) = host(zoned(2, 3, None));
    assert_status(&send(&mut h, 1, 0, zsa::CLOSE, false), Status::INVALID_ZONE_STATE_TRANSITION, true);
    assert_status(&send(&mut h, 1, 5, zsa::OPEN, false), Status::INVALID_FIELD, true);
    assert_status(&send(&mut h, 1, 0, zsa::SET_DESCRIPTOR_EXTENSION, false), Status::INVALID_FIELD, true);
    assert_status(&send(&mut h, 1, 0, 0x09, false), Status::INVALID_FIELD, true);
    assert_status(&send(&mut h, 1, 0, zsa::OPEN, false), Status::SUCCESS, false);
    assert_status(&send(&mut h, 1, BLOCKS, zsa::OPEN, false), Status::SUCCESS, false);
    // Two explicitly open: a third cannot open, by a write or by an Open.
    assert_status(&write_at(&mut h, WRITE, 2 * BLOCKS, &[1; 512]), Status::TOO_MANY_OPEN_ZONES, true);
    assert_status(&send(&mut h, 1, 2 * BLOCKS, zsa::OPEN, false), Status::TOO_MANY_OPEN_ZONES, true);
    write_at(&mut h, WRITE, BLOCKS, &[1; 512]);
    assert_status(&send(&mut h, 1, BLOCKS, zsa::CLOSE, false), Status::SUCCESS, false);
    assert_eq!(zone(&mut h, 1), (ZoneState::Closed, BLOCKS + 1));
    write_at(&mut h, WRITE, 2 * BLOCKS, &[1; 512]);
    // Three active (zone 0 open, 1 closed, 2 open): a fourth cannot start.
    assert_status(&write_at(&mut h, WRITE, 3 * BLOCKS, &[1; 512]), Status::TOO_MANY_ACTIVE_ZONES, true);
    // Finish frees zone 0's resources; reset all empties the rest.
    assert_status(&send(&mut h, 1, 0, zsa::FINISH, false), Status::SUCCESS, false);
    assert_status(&write_at(&mut h, WRITE, 3 * BLOCKS, &[1; 512]), Status::SUCCESS, false);
    assert_status(&send(&mut h, 1, 0, zsa::RESET, true), Status::SUCCESS, false);
    for zi in 0..4 {
        assert_eq!(zone(&mut h, zi), (ZoneState::Empty, zi * BLOCKS), "zone {zi}");
    }
    // A reset zone reads back zeroes.
    assert_eq!(h.read_blocks(1, 1, BLOCKS, 1, 512).1, vec![0; 512]);
    assert_status(&send(&mut h, 1, 0, zsa::OFFLINE, false), Status::INVALID_ZONE_STATE_TRANSITION, true);
    assert_status(&send(&mut h, 1, 9 * BLOCKS, zsa::RESET, false), Status::LBA_OUT_OF_RANGE, true);
}

#[test]
fn copy_writes_at_the_destination_zone_pointer() {
    let (mut h, _) = host(zoned(0, 0, None));
    let src = pattern(9, 2048);
    write_at(&mut h, WRITE, 0, &src);
    let copy = |h: &mut MockHost, sdlba: u64| {
        let raw = CopyRange::new(0, 4).as_bytes().to_vec();
        let buf = h.alloc.alloc_pages(1);
        h.mem.write(buf, &raw).unwrap();
        let mut s = CopyCmd { nsid: 1, sdlba, nr_z: 0, desfmt: 0, fua: false }.to_sqe();
        s.set_prps(buf, 0);
        h.io_cmd(1, s)
    };
    assert_status(&copy(&mut h, BLOCKS + 1), Status::ZONE_INVALID_WRITE, true);
    assert_status(&copy(&mut h, BLOCKS), Status::SUCCESS, false);
    assert_eq!(zone(&mut h, 1), (ZoneState::ImplicitlyOpened, BLOCKS + 4));
    assert!(h.read_blocks(1, 1, BLOCKS, 4, 512).1 == src[..]);
}

#[test]
fn write_pointers_come_back_from_the_zone_state_file() {
    let file = Arc::new(File::from(test_util::memfd::memfd_unsealed(0)));
    nvme_ctrl::zoned::state_file_made_new(&file).unwrap();
    let ram = {
        let (mut h, ram) = host(zoned(0, 0, Some(file.clone())));
        write_at(&mut h, WRITE, 0, &pattern(4, 4096));
        write_at(&mut h, WRITE, 3 * BLOCKS, &pattern(5, 512));
        send(&mut h, 1, 3 * BLOCKS, zsa::CLOSE, false);
        send(&mut h, 1, 6 * BLOCKS, zsa::FINISH, false);
        ram
    };
    // A new controller on the same data and state, as after a SIGKILL: open zones
    // come back closed, pointers where the writes ended.
    let cfg = ControllerConfig {
        namespaces: vec![NamespaceConfig {
            zoned: Some(zoned(0, 0, Some(file))),
            ..NamespaceConfig::new(Arc::new(ram) as Arc<dyn Backend>, 0)
        }],
        ..Default::default()
    };
    let mut h = MockHost::new(cfg, MEM);
    h.init(opts()).unwrap();
    assert_eq!(zone(&mut h, 0), (ZoneState::Closed, 8));
    assert_eq!(zone(&mut h, 3), (ZoneState::Closed, 3 * BLOCKS + 1));
    assert_eq!(zone(&mut h, 6).0, ZoneState::Full);
    assert_status(&write_at(&mut h, WRITE, 8, &pattern(6, 512)), Status::SUCCESS, false);
    assert!(h.read_blocks(1, 1, 0, 8, 512).1 == pattern(4, 4096));
}

/// A saved controller state (live upgrade, migration) carries every zone's state
/// and pointer, open zones staying open; a state whose zones do not fit is
/// refused before anything changes.
#[test]
fn a_saved_state_carries_the_zones() {
    use nvme_ctrl::{Controller, StateError};
    let z = zoned(4, 6, None);
    let (mut h, ram) = host(z.clone());
    write_at(&mut h, WRITE, BLOCKS, &pattern(7, 4096));
    send(&mut h, 1, 2 * BLOCKS, zsa::OPEN, false);
    send(&mut h, 1, 3 * BLOCKS, zsa::FINISH, false);
    h.ctrl.quiesce(std::time::Duration::from_secs(5)).expect("quiesce");
    let saved = h.ctrl.save_state();
    let json = serde_json::to_string(&saved).unwrap();
    let state: nvme_ctrl::ControllerState = serde_json::from_str(&json).unwrap();
    let zones = state.namespaces[0].zones.clone().expect("the zoned namespace's zones");
    assert_eq!(&zones[..4], &[(1, 0), (2, 4096), (3, 0), (0xe, ZCAP)]);
    assert_eq!(state.namespaces[1].zones, None);
    let config = |z: Option<ZonedConfig>| ControllerConfig {
        namespaces: vec![
            NamespaceConfig { zoned: z, ..NamespaceConfig::new(Arc::new(ram.clone()), 0) },
            NamespaceConfig::new(Arc::new(RamBackend::new(4 << 20)), 0),
        ],
        ..Default::default()
    };
    let fresh = |z| Controller::new(config(z), h.mem.clone(), h.irq.clone()).unwrap();
    // Not zoned here, zoned in the state; a pointer past the capacity; too many
    // open zones for the limits here.
    let mut wrong = state.clone();
    wrong.namespaces[0].zones.as_mut().unwrap()[1].1 = ZCAP + 4096;
    assert!(matches!(fresh(Some(z.clone())).restore_state(&wrong), Err(StateError::Mismatch(_))));
    let mut c = fresh(Some(zoned(1, 6, None)));
    assert!(matches!(c.restore_state(&state), Err(StateError::Mismatch(e)) if e.contains("open")));
    let mut c = fresh(Some(z));
    c.restore_state(&state).expect("restore");
    let old = std::mem::replace(&mut h.ctrl, c);
    std::mem::forget(old);
    assert_eq!(zone(&mut h, 1), (ZoneState::ImplicitlyOpened, BLOCKS + 8));
    assert_eq!(zone(&mut h, 2), (ZoneState::ExplicitlyOpened, 2 * BLOCKS));
    assert_eq!(zone(&mut h, 3).0, ZoneState::Full);
    // The restored pointer is the one writes go to.
    assert_status(&write_at(&mut h, WRITE, BLOCKS + 8, &pattern(8, 512)), Status::SUCCESS, false);
    // The counts came back too: with zones 1 (implicitly) and 2 open, two more
    // open explicitly up to the limit of 4, a fifth closes zone 1 to open, a
    // sixth finds no implicitly opened zone to close.
    for zi in [4, 5, 6] {
        assert_status(&send(&mut h, 1, zi * BLOCKS, zsa::OPEN, false), Status::SUCCESS, false);
    }
    assert_eq!(zone(&mut h, 1).0, ZoneState::Closed);
    assert_status(&send(&mut h, 1, 7 * BLOCKS, zsa::OPEN, false), Status::TOO_MANY_OPEN_ZONES, true);
}

/// A zone the operator fails (read only, then offline) changes as a medium's
/// would: writes get Zone Is Read Only, then reads Zone Is Offline; a host that
/// enabled Zone Descriptor Changed notices gets one, and the Changed Zone List of
/// the namespace names the zone until the host reads it.
#[test]
fn a_failed_zone_is_reported_and_refused() {
    use nvme_spec::features::fid;
    let (mut h, _) = host(zoned(0, 0, None));
    let id = h.identify(cns::CONTROLLER, 0).unwrap();
    assert_ne!(le32(&id, 92) & (1 << 27), 0, "OAES: Zone Descriptor Changed notices");
    h.set_feature(fid::ASYNC_EVENT_CONFIG, 1 << 27).unwrap();
    let aer = h.submit_aer();
    write_at(&mut h, WRITE, 2 * BLOCKS, &pattern(1, 4096));
    assert!(h.ctrl.fail_zone(1, 2 * BLOCKS, ZoneState::ReadOnly).unwrap());
    let ev = h.reap_admin().into_iter().find(|c| c.cid.get() == aer).expect("the notice");
    assert_eq!(ev.dw0.get(), 0x02 | 0xef << 8 | 0xbf << 16, "Notice, Zone Descriptor Changed, log BFh");
    assert_eq!(zone(&mut h, 2).0, ZoneState::ReadOnly);
    assert_status(
        &write_at(&mut h, zop::ZONE_APPEND, 2 * BLOCKS, &[0; 512]),
        Status::ZONE_IS_READ_ONLY,
        true,
    );
    assert!(h.read_blocks(1, 1, 2 * BLOCKS, 8, 512).1 == pattern(1, 4096), "a read-only zone reads");
    // The list names the zone until read without RAE; another NSID has none.
    let log = |h: &mut MockHost, nsid: u32, rae: bool| {
        let mut c = GetLogPageCmd { nsid, lid: 0xbf, numd_z: 1023, rae, ..Default::default() }.to_sqe();
        c.set_prps(h.admin_buf, h.admin_buf + 4096);
        let st = h.admin_raw(c).status();
        let mut v = vec![0u8; 4096];
        h.mem.read(h.admin_buf, &mut v).unwrap();
        (st, v)
    };
    let (st, page) = log(&mut h, 1, true);
    assert_eq!((st, le16(&page, 0), le64(&page, 8)), (Status::SUCCESS, 1, 2 * BLOCKS));
    assert_eq!(le16(&log(&mut h, 1, false).1, 0), 1);
    assert_eq!(le16(&log(&mut h, 1, false).1, 0), 0, "read without RAE: emptied");
    assert_eq!(log(&mut h, 2, false).0.code(), Status::INVALID_FIELD);
    // Offline: reads fail too; the zone can only be taken offline again.
    assert!(h.ctrl.fail_zone(1, 2 * BLOCKS, ZoneState::Offline).unwrap());
    assert_eq!(h.read_blocks(1, 1, 2 * BLOCKS, 8, 512).0.code(), Status::ZONE_IS_OFFLINE);
    assert_eq!(h.read_blocks(1, 1, 3 * BLOCKS, 8, 512).0, Status::SUCCESS);
    assert!(h.ctrl.fail_zone(1, 2 * BLOCKS, ZoneState::ReadOnly).is_err());
    assert!(h.ctrl.fail_zone(1, 2 * BLOCKS + 1, ZoneState::Offline).is_err(), "not a zone's start");
    assert!(h.ctrl.fail_zone(2, 0, ZoneState::Offline).is_err(), "NSID 2 is not zoned");
    assert!(h.ctrl.fail_zone(1, 3 * BLOCKS, ZoneState::Full).is_err(), "only read only or offline");
}

/// A write its backend never finishes times out, and keeps its place in its zone:
/// the pointer moves past it, so the next write (at the pointer the host then
/// reads) is taken instead of refused forever.
#[test]
fn a_write_given_up_on_keeps_its_place_in_its_zone() {
    use block_backend::{FaultBackend, FaultRule};
    let ram: Arc<dyn Backend> = Arc::new(RamBackend::new(8 * ZONE));
    let rule: FaultRule = "write/hang/count=1".parse().unwrap();
    let be = Arc::new(FaultBackend::new(ram, vec![rule]));
    let mut ns = NamespaceConfig { zoned: Some(zoned(0, 0, None)), ..NamespaceConfig::new(be, 0) };
    ns.timeout = Some(std::time::Duration::from_millis(200));
    let mut h = MockHost::new(ControllerConfig { namespaces: vec![ns], ..Default::default() }, MEM);
    h.init(opts()).unwrap();
    let c = write_at(&mut h, WRITE, BLOCKS, &pattern(1, 4096));
    assert_eq!(c.status().code(), Status::INTERNAL_ERROR, "timed out");
    assert_eq!(zone(&mut h, 1), (ZoneState::ImplicitlyOpened, BLOCKS + 8), "past the write given up on");
    assert_status(&write_at(&mut h, WRITE, BLOCKS + 8, &pattern(2, 4096)), Status::SUCCESS, false);
    assert_eq!(zone(&mut h, 1).1, BLOCKS + 16);
}
