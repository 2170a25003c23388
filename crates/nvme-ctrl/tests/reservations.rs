//! Reservations across two controllers of one subsystem (issue 31 item 3): each a
//! controller of its own over one backend and one reservation state file (opened
//! by each, as each controller's process does), each host naming itself with the
//! Host Identifier feature. What one host registers, acquires, preempts or
//! releases through its controller, the other's commands and reports see at once;
//! conflicts complete with Reservation Conflict; a preempted host hears of it
//! through its own controller's notification log.

mod common;
mod io_common;

use std::sync::Arc;

use block_backend::{Backend, RamBackend};
use io_common::*;
use nvme_ctrl::{ControllerConfig, NamespaceConfig, SubsystemConfig};
use nvme_spec::admin::{GetFeaturesCmd, SetFeaturesCmd};
use nvme_spec::identify::{oncs, IdentifyController, IdentifyNamespace};
use nvme_spec::opcode::nvm as op;
use nvme_spec::resv::{fid, notification, RegisteredController, ReportHeader, ReservationType as T};
use nvme_spec::{Cqe, Sqe, Status};
use test_kit::MockHost;
use zerocopy::little_endian::U32;
use zerocopy::FromBytes;

struct Pair {
    a: MockHost,
    b: MockHost,
    path: std::path::PathBuf,
}

impl Drop for Pair {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

fn controller(ram: &Arc<dyn Backend>, path: &std::path::Path, cntlid: u16) -> MockHost {
    let file =
        std::fs::OpenOptions::new().read(true).write(true).create(true).truncate(false).open(path).unwrap();
    // Made (as vnvme makes a new one) by whichever controller comes first.
    nvme_ctrl::reservation::initialize(&file).unwrap();
    let cfg = ControllerConfig {
        namespaces: vec![
            NamespaceConfig { reservations: Some(Arc::new(file)), ..NamespaceConfig::new(ram.clone(), 0) },
            NamespaceConfig::new(Arc::new(RamBackend::new(1 << 20)), 0),
        ],
        subsystem: Some(SubsystemConfig { cntlid }),
        serial: "RESV0001".into(),
        ..Default::default()
    };
    let mut h = MockHost::new(cfg, MEM);
    h.init(opts()).expect("bring-up");
    h
}

fn pair(name: &str) -> Pair {
    let path = std::env::temp_dir().join(format!("vnvme-resv-{}-{name}", std::process::id()));
    let _ = std::fs::remove_file(&path);
    let ram: Arc<dyn Backend> = Arc::new(RamBackend::new(4 << 20));
    let (a, b) = (controller(&ram, &path, 1), controller(&ram, &path, 2));
    Pair { a, b, path }
}

/// Sets host `h`'s 64-bit Host Identifier to `id` repeated.
fn name_host(h: &mut MockHost, id: u8) {
    let buf = h.alloc.alloc_pages(1);
    h.mem.write(buf, &[id; 8]).unwrap();
    let mut c = SetFeaturesCmd { fid: fid::HOST_IDENTIFIER, ..Default::default() }.to_sqe();
    c.set_prps(buf, 0);
    assert_eq!(h.admin_status(c), Status::SUCCESS);
}

/// A reservation command on namespace 1 with dword 10 `cdw10` and data `data`.
fn resv(h: &mut MockHost, opcode: u8, cdw10: u32, data: &[u8]) -> Status {
    let buf = h.alloc.alloc_pages(1);
    h.mem.write(buf, data).unwrap();
    let mut s = Sqe::with_opcode(opcode);
    s.nsid = U32::new(1);
    s.cdw10 = U32::new(cdw10);
    s.set_prps(buf, 0);
    h.io_cmd(1, s).status()
}

fn keys(a: u64, b: u64) -> Vec<u8> {
    [a.to_le_bytes(), b.to_le_bytes()].concat()
}

fn register(h: &mut MockHost, key: u64) -> Status {
    resv(h, op::RESERVATION_REGISTER, 0, &keys(0, key))
}

fn acquire(h: &mut MockHost, action: u32, t: u8, crkey: u64, prkey: u64) -> Status {
    resv(h, op::RESERVATION_ACQUIRE, action | (t as u32) << 8, &keys(crkey, prkey))
}

fn write(h: &mut MockHost) -> Status {
    h.write_blocks(1, 1, 0, 512, &[7; 4096])
}

fn read(h: &mut MockHost) -> Status {
    let buf = h.alloc.alloc_pages(1);
    let s = h.rw_sqe(READ, 1, 0, 8, (buf, 4096));
    h.io_cmd(1, s).status()
}

/// Reservation Report (64-bit host identifiers): the header and the entries.
fn report(h: &mut MockHost) -> (ReportHeader, Vec<RegisteredController>) {
    let buf = h.alloc.alloc_pages(1);
    let mut s = Sqe::with_opcode(op::RESERVATION_REPORT);
    s.nsid = U32::new(1);
    s.cdw10 = U32::new(1024 / 4 - 1);
    s.set_prps(buf, 0);
    assert_eq!(h.io_cmd(1, s).status(), Status::SUCCESS);
    let mut page = vec![0u8; 1024];
    h.mem.read(buf, &mut page).unwrap();
    let (hdr, rest) = ReportHeader::read_from_prefix(&page).unwrap();
    let n = hdr.regctl.get() as usize;
    let entries =
        (0..n).map(|i| RegisteredController::read_from_prefix(&rest[i * 24..]).unwrap().0).collect();
    (hdr, entries)
}

#[test]
fn identify_reports_reservations_where_a_namespace_has_them() {
    let mut p = pair("identify");
    let c = IdentifyController::read_from_bytes(&p.a.identify(1, 0).unwrap()).unwrap();
    assert_eq!(c.oncs.get() & oncs::RESERVATIONS, oncs::RESERVATIONS);
    let n1 = IdentifyNamespace::read_from_bytes(&p.a.identify(0, 1).unwrap()).unwrap();
    let n2 = IdentifyNamespace::read_from_bytes(&p.a.identify(0, 2).unwrap()).unwrap();
    // Persist through power loss and the six types (IEKEY honoured everywhere,
    // so not bit 7); none on 2.
    assert_eq!((n1.rescap, n2.rescap), (0x7f, 0));
    // A namespace without reservations takes no reservation command.
    let mut s = Sqe::with_opcode(op::RESERVATION_REPORT);
    s.nsid = U32::new(2);
    assert_eq!(p.a.io_cmd(1, s).status().code(), Status::INVALID_OPCODE);
}

#[test]
fn a_host_must_name_itself_before_it_registers() {
    let mut p = pair("hostid");
    assert_eq!(register(&mut p.a, 5).code(), Status::COMMAND_SEQUENCE_ERROR);
    name_host(&mut p.a, 0xa1);
    assert_eq!(register(&mut p.a, 5), Status::SUCCESS);
    // Get Features gives it back, 64-bit (EXHID 0).
    let buf = p.a.alloc.alloc_pages(1);
    let mut c = GetFeaturesCmd { fid: fid::HOST_IDENTIFIER, ..Default::default() }.to_sqe();
    c.set_prps(buf, 0);
    let cqe: Cqe = p.a.admin_cmd(c).unwrap();
    assert_eq!(cqe.status(), Status::SUCCESS);
    let mut id = [0u8; 8];
    p.a.mem.read(buf, &mut id).unwrap();
    assert_eq!((id, cqe.dw0.get()), ([0xa1; 8], 0));
    // Not saveable.
    let buf = p.a.alloc.alloc_pages(1);
    let mut c = SetFeaturesCmd { fid: fid::HOST_IDENTIFIER, sv: true, ..Default::default() }.to_sqe();
    c.set_prps(buf, 0);
    assert_eq!(p.a.admin_status(c).code(), Status::FEATURE_NOT_SAVEABLE);
    // Registered, the host keeps its identifier.
    let buf = p.a.alloc.alloc_pages(1);
    p.a.mem.write(buf, &[0xa2; 8]).unwrap();
    let mut c = SetFeaturesCmd { fid: fid::HOST_IDENTIFIER, ..Default::default() }.to_sqe();
    c.set_prps(buf, 0);
    assert_eq!(p.a.admin_status(c).code(), Status::COMMAND_SEQUENCE_ERROR);
}

#[test]
fn two_hosts_through_two_controllers_conflict_preempt_and_release() {
    let mut p = pair("two-hosts");
    name_host(&mut p.a, 0xa1);
    name_host(&mut p.b, 0xb2);
    assert_eq!(register(&mut p.a, 0xaaaa), Status::SUCCESS);
    // A takes Write Exclusive: B, not registered, may read but not write.
    assert_eq!(acquire(&mut p.a, 0, T::WriteExclusive as u8, 0xaaaa, 0), Status::SUCCESS);
    assert_eq!(write(&mut p.a), Status::SUCCESS);
    let st = write(&mut p.b);
    assert_eq!((st.code(), st.dnr()), (Status::RESERVATION_CONFLICT, true), "not retried");
    assert_eq!(read(&mut p.b), Status::SUCCESS);
    // Acquiring without being registered, or with a wrong key: conflict.
    assert_eq!(acquire(&mut p.b, 0, 1, 0, 0).code(), Status::RESERVATION_CONFLICT);
    assert_eq!(register(&mut p.b, 0xbbbb), Status::SUCCESS);
    assert_eq!(acquire(&mut p.b, 0, 1, 0xbad, 0).code(), Status::RESERVATION_CONFLICT);
    // B's report shows both registered controllers and A holding Write Exclusive.
    let (hdr, entries) = report(&mut p.b);
    assert_eq!((hdr.gen.get(), hdr.rtype, hdr.regctl.get()), (2, 1, 2));
    let a = entries.iter().find(|e| e.cntlid.get() == 1).expect("controller 1");
    let b = entries.iter().find(|e| e.cntlid.get() == 2).expect("controller 2");
    assert_eq!((a.rcsts, a.hostid, a.rkey.get()), (1, [0xa1; 8], 0xaaaa));
    assert_eq!((b.rcsts, b.hostid, b.rkey.get()), (0, [0xb2; 8], 0xbbbb));
    // A Flush is a write under Write Exclusive.
    let mut flush = Sqe::with_opcode(op::FLUSH);
    flush.nsid = U32::new(1);
    assert_eq!(p.b.io_cmd(1, flush).status().code(), Status::RESERVATION_CONFLICT);
    // B preempts and aborts A: A's registration is gone, B holds Exclusive Access,
    // A may no longer even read, and A's controller tells A.
    let aer = p.a.submit_aer();
    assert_eq!(acquire(&mut p.b, 2, T::ExclusiveAccess as u8, 0xbbbb, 0xaaaa), Status::SUCCESS);
    assert_eq!(read(&mut p.a).code(), Status::RESERVATION_CONFLICT);
    assert_eq!(write(&mut p.b), Status::SUCCESS);
    p.a.process();
    let got = p.a.reap_admin();
    assert_eq!(got.len(), 1, "{got:?}");
    // I/O command specific (6), Reservation Log Page Available (0), log page 80h.
    assert_eq!((got[0].cid.get(), got[0].dw0.get()), (aer, 6 | 0x80 << 16));
    let log = p.a.log_at(0x80, 64, 0, false);
    assert_eq!(log[8], notification::REGISTRATION_PREEMPTED);
    assert_eq!(u32::from_le_bytes(log[12..16].try_into().unwrap()), 1, "namespace 1");
    assert_eq!(u64::from_le_bytes(log[..8].try_into().unwrap()), 1, "the first notification");
    // Read to its end: an empty entry.
    assert_eq!(p.a.log_at(0x80, 64, 0, false)[8], notification::EMPTY);
    // B releases (type must match), A writes again... after registering anew.
    assert_eq!(
        resv(&mut p.b, op::RESERVATION_RELEASE, 1 << 8, &0xbbbbu64.to_le_bytes()).code(),
        Status::INVALID_FIELD
    );
    assert_eq!(resv(&mut p.b, op::RESERVATION_RELEASE, 2 << 8, &0xbbbbu64.to_le_bytes()), Status::SUCCESS);
    assert_eq!(write(&mut p.a), Status::SUCCESS);
    // Clear: every registration goes.
    assert_eq!(register(&mut p.a, 0xaaaa), Status::SUCCESS);
    assert_eq!(resv(&mut p.b, op::RESERVATION_RELEASE, 1, &0xbbbbu64.to_le_bytes()), Status::SUCCESS);
    assert_eq!(report(&mut p.a).0.regctl.get(), 0);
}

/// Linux maps a passthrough buffer with an SGL of exactly the NUMD dwords asked:
/// the report fills all of it (zeroes after the data), or the lengths disagree
/// (what a Linux 7.3 guest's `nvme resv-report` first found).
#[test]
fn a_report_fills_the_whole_buffer_an_sgl_describes() {
    use nvme_spec::command::Psdt;
    use nvme_spec::sgl::{SglDescriptor, SglType};
    let mut p = pair("sgl");
    name_host(&mut p.a, 0xa1);
    register(&mut p.a, 9);
    let buf = p.a.alloc.alloc_pages(1);
    p.a.mem.fill(buf, 4096, 0xee).unwrap();
    let mut s = Sqe::with_opcode(op::RESERVATION_REPORT);
    s.set_cdw0(op::RESERVATION_REPORT, 0, Psdt::SglMptrContiguous);
    s.set_sgl1(&SglDescriptor::new(SglType::DataBlock, buf, 1024));
    s.nsid = U32::new(1);
    s.cdw10 = U32::new(1024 / 4 - 1);
    assert_eq!(p.a.io_cmd(1, s).status(), Status::SUCCESS);
    let mut page = vec![0u8; 1028];
    p.a.mem.read(buf, &mut page).unwrap();
    assert_eq!(u16::from_le_bytes([page[5], page[6]]), 1, "one registered controller");
    assert!(page[48..1024].iter().all(|&b| b == 0), "zero filled to NUMD");
    assert_eq!(&page[1024..], &[0xee; 4], "and not beyond");
}

#[test]
fn persistence_and_the_notification_mask() {
    let mut p = pair("features");
    name_host(&mut p.a, 0xa1);
    name_host(&mut p.b, 0xb2);
    // Reservation Persistence through one controller reads through the other.
    let mut c = SetFeaturesCmd { fid: fid::RESERVATION_PERSISTENCE, cdw11: 1, ..Default::default() }.to_sqe();
    c.nsid = U32::new(1);
    assert_eq!(p.a.admin_status(c), Status::SUCCESS);
    let mut g = GetFeaturesCmd { fid: fid::RESERVATION_PERSISTENCE, ..Default::default() }.to_sqe();
    g.nsid = U32::new(1);
    assert_eq!(p.b.admin_cmd(g).unwrap().dw0.get(), 1);
    assert_eq!(report(&mut p.b).0.ptpls, 1);
    // Namespace 2 has no reservations: Invalid Field.
    g.nsid = U32::new(2);
    assert_eq!(p.b.admin_raw(g).status().code(), Status::INVALID_FIELD);
    // A masks Registration Preempted: preempted, it gets no notification.
    let mut m =
        SetFeaturesCmd { fid: fid::RESERVATION_NOTIFICATION_MASK, cdw11: 1 << 1, ..Default::default() }
            .to_sqe();
    m.nsid = U32::new(1);
    assert_eq!(p.a.admin_status(m), Status::SUCCESS);
    register(&mut p.a, 1);
    register(&mut p.b, 2);
    acquire(&mut p.a, 0, 1, 1, 0);
    let _aer = p.a.submit_aer();
    assert_eq!(acquire(&mut p.b, 1, 1, 2, 1), Status::SUCCESS);
    p.a.process();
    assert!(p.a.reap_admin().is_empty(), "masked");
    assert_eq!(p.a.log_at(0x80, 64, 0, false)[8], notification::EMPTY);
}

/// A host with two controllers (multipath) that names itself on both and
/// registers through one hears a preemption through both: the spec's
/// notifications go to every controller of the host, by Host Identifier.
#[test]
fn a_host_named_on_two_controllers_hears_through_both() {
    let path = std::env::temp_dir().join(format!("vnvme-resv-{}-named", std::process::id()));
    let _ = std::fs::remove_file(&path);
    let ram: Arc<dyn Backend> = Arc::new(RamBackend::new(4 << 20));
    let (mut a1, mut a2, mut b) =
        (controller(&ram, &path, 1), controller(&ram, &path, 2), controller(&ram, &path, 3));
    name_host(&mut a1, 0xa1);
    name_host(&mut a2, 0xa1);
    name_host(&mut b, 0xb2);
    assert_eq!(register(&mut a1, 0xaaaa), Status::SUCCESS);
    assert_eq!(register(&mut b, 0xbbbb), Status::SUCCESS);
    assert_eq!(acquire(&mut a1, 0, T::WriteExclusive as u8, 0xaaaa, 0), Status::SUCCESS);
    let aer = a2.submit_aer();
    assert_eq!(acquire(&mut b, 1, T::WriteExclusive as u8, 0xbbbb, 0xaaaa), Status::SUCCESS);
    a2.process();
    let got = a2.reap_admin();
    assert_eq!(got.len(), 1, "controller 2, which A never registered through: {got:?}");
    assert_eq!((got[0].cid.get(), got[0].dw0.get()), (aer, 6 | 0x80 << 16));
    assert_eq!(a2.log_at(0x80, 64, 0, false)[8], notification::REGISTRATION_PREEMPTED);
    assert_eq!(a1.log_at(0x80, 64, 0, false)[8], notification::REGISTRATION_PREEMPTED);
    assert_eq!(b.log_at(0x80, 64, 0, false)[8], notification::EMPTY, "not the preempting host");
    let _ = std::fs::remove_file(&path);
}
