//! Flexible Data Placement (Base §8.1.10) through the mock host: what Identify
//! says, the four FDP log pages of endurance group 1, the FDP and FDP Events
//! features, I/O Management Receive (reclaim unit handle status) and Send (handle
//! update), writes placed by their Data Placement directive, an invalid placement
//! identifier, and the state carried into a restored controller.

mod common;
mod io_common;

use std::sync::Arc;

use block_backend::{Backend, RamBackend};
use io_common::*;
use nvme_ctrl::{Controller, ControllerConfig, FdpConfig, NamespaceConfig};
use nvme_spec::admin::{GetFeaturesCmd, GetLogPageCmd, SetFeaturesCmd};
use nvme_spec::fdp::{event, RuhStatusDescriptor};
use nvme_spec::features::fid;
use nvme_spec::identify::{IdentifyController, IdentifyNamespace};
use nvme_spec::log::lid;
use nvme_spec::opcode::nvm as iop;
use nvme_spec::{Cqe, Sqe, Status};
use test_kit::MockHost;
use zerocopy::little_endian::U32;
use zerocopy::FromBytes;

const NS_BYTES: u64 = 8 << 20;
const RU: u64 = 1 << 20;
const RUHS: u16 = 4;

fn config(fdp: bool) -> (ControllerConfig, RamBackend) {
    let ram = RamBackend::new(NS_BYTES);
    let ns = NamespaceConfig::new(Arc::new(ram.clone()) as Arc<dyn Backend>, 1);
    let cfg = ControllerConfig {
        namespaces: vec![ns],
        fdp: fdp.then_some(FdpConfig { ruhs: RUHS, ru_size: RU }),
        ..Default::default()
    };
    (cfg, ram)
}

fn host(fdp: bool) -> MockHost {
    let (cfg, _) = config(fdp);
    let mut h = MockHost::new(cfg, MEM);
    h.init(opts()).expect("bring-up");
    h
}

/// Get Log Page `lid` of endurance group `lsi`, `len` bytes.
fn log(h: &mut MockHost, lid: u8, lsp: u8, lsi: u16, len: u32) -> (Status, Vec<u8>) {
    let mut c = GetLogPageCmd { nsid: 0xffff_ffff, lid, lsp, lsi, numd_z: len / 4 - 1, ..Default::default() }
        .to_sqe();
    c.set_prps(h.admin_buf, h.admin_buf + 4096);
    let st = h.admin_status(c);
    let mut v = vec![0u8; len as usize];
    h.mem.read(h.admin_buf, &mut v).unwrap();
    (st, v)
}

/// An I/O command of `opcode` on namespace 1 with CDW10-13 given and a one-page
/// data buffer holding `data`; the completion and the buffer after.
fn io(h: &mut MockHost, opcode: u8, cdw: [u32; 4], data: &[u8]) -> (Cqe, Vec<u8>) {
    let buf = h.alloc.alloc_pages(2);
    let mut page = data.to_vec();
    page.resize(8192, 0);
    h.mem.write(buf, &page).unwrap();
    let mut s = Sqe::with_opcode(opcode);
    s.nsid = U32::new(1);
    s.set_prps(buf, buf + 4096);
    (s.cdw10, s.cdw11, s.cdw12, s.cdw13) =
        (U32::new(cdw[0]), U32::new(cdw[1]), U32::new(cdw[2]), U32::new(cdw[3]));
    let c = h.io_cmd(1, s);
    let mut out = vec![0u8; 8192];
    h.mem.read(buf, &mut out).unwrap();
    (c, out)
}

/// Reclaim Unit Available Media Writes of each handle (I/O Management Receive MO 1).
fn ruamw(h: &mut MockHost) -> Vec<u64> {
    let (c, out) = io(h, iop::IO_MGMT_RECV, [1, 1023, 0, 0], &[]);
    assert_status(&c, Status::SUCCESS, false);
    let n = u16::from_le_bytes([out[14], out[15]]) as usize;
    (0..n)
        .map(|i| {
            let d = RuhStatusDescriptor::read_from_bytes(&out[16 + 32 * i..48 + 32 * i]).unwrap();
            assert_eq!((d.pid.get(), d.ruhid.get()), (i as u16, i as u16));
            d.ruamw.get()
        })
        .collect()
}

/// A Write of `nlb` 4 KiB blocks at `slba`, with a Data Placement directive
/// naming `pid` if given.
fn write(h: &mut MockHost, slba: u64, nlb: u32, pid: Option<u16>) -> Cqe {
    let buf = h.alloc.alloc_pages(nlb as u64);
    let mut s = h.rw_sqe(iop::WRITE, 1, slba, nlb, (buf, nlb as u64 * 4096));
    if let Some(p) = pid {
        s.cdw12 = U32::new(s.cdw12.get() | 2 << 20);
        s.cdw13 = U32::new((p as u32) << 16);
    }
    h.io_cmd(1, s)
}

fn host_bytes_written(h: &mut MockHost) -> u64 {
    let (st, v) = log(h, lid::FDP_STATISTICS, 0, 1, 64);
    assert_eq!(st, Status::SUCCESS);
    let hbmw = u64::from_le_bytes(v[..8].try_into().unwrap());
    assert_eq!(v[16..24], v[..8], "media bytes written follow host bytes written");
    hbmw
}

fn set_events(h: &mut MockHost, phndl: u16, types: &[u8], enable: bool) -> Status {
    let mut c = SetFeaturesCmd {
        fid: fid::FDP_EVENTS,
        cdw11: (types.len() as u32) << 16 | phndl as u32,
        ..Default::default()
    }
    .to_sqe();
    c.nsid = U32::new(1);
    c.cdw12 = U32::new(enable as u32);
    h.mem.write(h.admin_buf, types).unwrap();
    c.set_prps(h.admin_buf, 0);
    h.admin_status(c)
}

/// The host events in the FDP Events log: (type, PID, NSID, RUHID).
fn host_events(h: &mut MockHost) -> Vec<(u8, u16, u32, u16)> {
    let (st, v) = log(h, lid::FDP_EVENTS, 1, 1, 4096);
    assert_eq!(st, Status::SUCCESS);
    let n = u32::from_le_bytes(v[..4].try_into().unwrap()) as usize;
    (0..n)
        .map(|i| {
            let r = &v[64 * (i + 1)..64 * (i + 2)];
            let pid = u16::from_le_bytes([r[2], r[3]]);
            let nsid = u32::from_le_bytes(r[12..16].try_into().unwrap());
            (r[0], pid, nsid, u16::from_le_bytes([r[34], r[35]]))
        })
        .collect()
}

#[test]
fn identify_names_the_endurance_group_only_with_fdp() {
    for fdp in [false, true] {
        let mut h = host(fdp);
        let c = IdentifyController::read_from_bytes(&h.identify(1, 0).unwrap()).unwrap();
        let n = IdentifyNamespace::read_from_bytes(&h.identify(0, 1).unwrap()).unwrap();
        // Bit 15 (extended LBA formats) always; 19 (FDPS) and 4 (endurance groups)
        // with FDP.
        let want = if fdp { (1 << 19 | 1 << 15 | 1 << 4, 1, 1) } else { (1 << 15, 0, 0) };
        assert_eq!((c.ctratt.get(), c.endgidmax.get(), n.endgid.get()), want, "fdp {fdp}");
    }
}

#[test]
fn without_fdp_its_logs_and_commands_are_refused() {
    let mut h = host(false);
    assert_eq!(log(&mut h, lid::FDP_CONFIGURATIONS, 0, 1, 64).0.code(), Status::INVALID_LOG_PAGE.code());
    let (c, _) = io(&mut h, iop::IO_MGMT_RECV, [1, 1023, 0, 0], &[]);
    assert_status(&c, Status::FDP_DISABLED, true);
    let (c, _) = io(&mut h, iop::IO_MGMT_SEND, [1, 0, 0, 0], &[0, 0]);
    assert_status(&c, Status::FDP_DISABLED, true);
    // A write naming a placement is a write.
    assert_status(&write(&mut h, 0, 1, Some(1)), Status::SUCCESS, false);
}

#[test]
fn the_configuration_is_one_reclaim_group_of_the_handles_in_endurance_group_1() {
    let mut h = host(true);
    let (st, v) = log(&mut h, lid::FDP_CONFIGURATIONS, 0, 1, 512);
    assert_eq!(st, Status::SUCCESS);
    let sze = u32::from_le_bytes(v[4..8].try_into().unwrap()) as usize;
    assert_eq!((u16::from_le_bytes([v[0], v[1]]), sze), (0, 16 + 64 + 4 * RUHS as usize));
    let d = &v[16..];
    assert_eq!(d[2] & 0x80, 0x80, "valid");
    assert_eq!(u32::from_le_bytes(d[4..8].try_into().unwrap()), 1, "NRG");
    assert_eq!(u16::from_le_bytes([d[8], d[9]]), RUHS);
    assert_eq!(u64::from_le_bytes(d[16..24].try_into().unwrap()), RU);
    assert!(v[sze..].iter().all(|&b| b == 0), "zeroes past the page");
    // Endurance group 2 does not exist.
    assert_eq!(log(&mut h, lid::FDP_CONFIGURATIONS, 0, 2, 64).0, Status::INVALID_FIELD.with_dnr());
    let (st, u) = log(&mut h, lid::RUH_USAGE, 0, 1, 64);
    assert_eq!((st, u16::from_le_bytes([u[0], u[1]]), u[8]), (Status::SUCCESS, RUHS, 1), "host specified");
}

#[test]
fn the_fdp_feature_reads_enabled_and_cannot_change() {
    let mut h = host(true);
    let get = GetFeaturesCmd { fid: fid::FDP, cdw11: 1, ..Default::default() }.to_sqe();
    assert_eq!(h.admin_raw(get).dw0.get(), 1, "FDPE, configuration 0");
    let get2 = GetFeaturesCmd { fid: fid::FDP, cdw11: 2, ..Default::default() }.to_sqe();
    assert_eq!(h.admin_status(get2), Status::INVALID_FIELD.with_dnr());
    let set = |enable: u32, sv: bool| {
        let mut c = SetFeaturesCmd { fid: fid::FDP, cdw11: 1, sv, ..Default::default() }.to_sqe();
        c.cdw12 = U32::new(enable);
        c
    };
    assert_eq!(h.admin_status(set(1, true)), Status::SUCCESS, "what is in effect, saved");
    let c = h.admin_raw(set(0, false));
    assert_status(&c, Status::COMMAND_SEQUENCE_ERROR, true);
}

#[test]
fn writes_use_up_the_unit_their_directive_names() {
    let mut h = host(true);
    let full = RU / 4096;
    assert_eq!(ruamw(&mut h), vec![full; RUHS as usize]);
    assert_status(&write(&mut h, 0, 2, Some(1)), Status::SUCCESS, false);
    assert_status(&write(&mut h, 8, 3, None), Status::SUCCESS, false);
    assert_eq!(ruamw(&mut h), vec![full - 3, full - 2, full, full]);
    assert_eq!(host_bytes_written(&mut h), 5 * 4096);
    // Write Zeroes is placed as a write is.
    let (c, _) = io(&mut h, iop::WRITE_ZEROES, [16, 0, 3 | 2 << 20, 3 << 16], &[]);
    assert_status(&c, Status::SUCCESS, false);
    assert_eq!(ruamw(&mut h)[3], full - 4);
    // Reads charge nothing.
    let buf = h.alloc.alloc_pages(1);
    let s = h.rw_sqe(iop::READ, 1, 0, 1, (buf, 4096));
    assert_status(&h.io_cmd(1, s), Status::SUCCESS, false);
    assert_eq!(host_bytes_written(&mut h), 9 * 4096);
}

#[test]
fn an_invalid_placement_goes_through_handle_0_and_is_reported_when_enabled() {
    let mut h = host(true);
    let full = RU / 4096;
    assert_status(&write(&mut h, 0, 1, Some(RUHS)), Status::SUCCESS, false);
    assert_eq!(ruamw(&mut h)[0], full - 1);
    assert!(host_events(&mut h).is_empty(), "not enabled");
    assert_eq!(set_events(&mut h, 0, &[event::INVALID_PID], true), Status::SUCCESS);
    assert_status(&write(&mut h, 0, 1, Some(0x1234)), Status::SUCCESS, false);
    assert_eq!(host_events(&mut h), vec![(event::INVALID_PID, 0x1234, 1, 0)]);
    // Get Features reads back the handle's event types, enabled or not.
    let mut c = GetFeaturesCmd { fid: fid::FDP_EVENTS, cdw11: 255 << 16, ..Default::default() }.to_sqe();
    c.nsid = U32::new(1);
    c.set_prps(h.admin_buf, 0);
    let cqe = h.admin_raw(c);
    let mut v = [0u8; 4];
    h.mem.read(h.admin_buf, &mut v).unwrap();
    assert_eq!((cqe.dw0.get(), v), (2, [event::RU_NOT_FULLY_WRITTEN, 0, event::INVALID_PID, 1]));
    // Event types this controller has not, or a handle it has not: refused.
    assert_eq!(set_events(&mut h, 0, &[event::MEDIA_REALLOCATED], true), Status::INVALID_FIELD.with_dnr());
    assert_eq!(set_events(&mut h, RUHS, &[0], true), Status::INVALID_FIELD.with_dnr());
}

#[test]
fn an_update_moves_handles_to_fresh_units_all_or_none() {
    let mut h = host(true);
    let full = RU / 4096;
    assert_eq!(set_events(&mut h, 2, &[event::RU_NOT_FULLY_WRITTEN], true), Status::SUCCESS);
    for pid in [1, 2] {
        assert_status(&write(&mut h, 0, 4, Some(pid)), Status::SUCCESS, false);
    }
    // A placement identifier the namespace lacks: nothing moves.
    let (c, _) = io(&mut h, iop::IO_MGMT_SEND, [1 | 1 << 16, 0, 0, 0], &[1, 0, 9, 0]);
    assert_status(&c, Status::INVALID_FIELD, true);
    assert_eq!(ruamw(&mut h), vec![full, full - 4, full - 4, full]);
    // NPID 2 (0's based 1): handles 1 and 2.
    let (c, _) = io(&mut h, iop::IO_MGMT_SEND, [1 | 1 << 16, 0, 0, 0], &[1, 0, 2, 0]);
    assert_status(&c, Status::SUCCESS, false);
    assert_eq!(ruamw(&mut h), vec![full; RUHS as usize]);
    assert_eq!(
        host_events(&mut h),
        vec![(event::RU_NOT_FULLY_WRITTEN, 2, 1, 2)],
        "only handle 2 asked for it"
    );
    // A reserved management operation.
    let (c, _) = io(&mut h, iop::IO_MGMT_RECV, [7, 1023, 0, 0], &[]);
    assert_status(&c, Status::INVALID_FIELD, true);
}

#[test]
fn fdp_state_carries_into_a_restored_controller_and_must_match() {
    let (cfg, ram) = config(true);
    let mut h = MockHost::new(cfg.clone(), MEM);
    h.init(opts()).expect("bring-up");
    assert_eq!(set_events(&mut h, 0, &[event::INVALID_PID], true), Status::SUCCESS);
    assert_status(&write(&mut h, 0, 5, Some(3)), Status::SUCCESS, false);
    assert_status(&write(&mut h, 0, 1, Some(77)), Status::SUCCESS, false);
    let before = (ruamw(&mut h), host_bytes_written(&mut h), host_events(&mut h));
    h.ctrl.quiesce(std::time::Duration::from_secs(5)).unwrap();
    let saved = h.ctrl.save_state();
    let json = serde_json::to_string(&saved).unwrap();
    let state: nvme_ctrl::ControllerState = serde_json::from_str(&json).unwrap();
    // Into a controller without FDP, or with other handles: refused.
    for other in [None, Some(FdpConfig { ruhs: RUHS + 1, ru_size: RU })] {
        let c = ControllerConfig { fdp: other, ..config_over(&ram, &cfg) };
        let mut fresh = Controller::new(c, h.mem.clone(), h.irq.clone()).unwrap();
        assert!(fresh.restore_state(&state).is_err(), "{other:?}");
    }
    let mut fresh = Controller::new(config_over(&ram, &cfg), h.mem.clone(), h.irq.clone()).unwrap();
    fresh.restore_state(&state).expect("restore");
    let old = std::mem::replace(&mut h.ctrl, fresh);
    std::mem::forget(old);
    let after = (ruamw(&mut h), host_bytes_written(&mut h), host_events(&mut h));
    assert_eq!(after, before);
}

/// `cfg` again, over the same RAM.
fn config_over(ram: &RamBackend, cfg: &ControllerConfig) -> ControllerConfig {
    let ns = NamespaceConfig::new(Arc::new(ram.clone()) as Arc<dyn Backend>, 1);
    ControllerConfig { namespaces: vec![ns], ..cfg.clone() }
}
