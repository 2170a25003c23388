//! Namespace Management and Attachment (issue 31 item 4) across two controllers of
//! one subsystem sharing a namespace pool (a directory each opens, as each
//! controller's process does): what one host creates, attaches, detaches and
//! deletes through its controller, both controllers' Identify structures, active
//! lists, notices and data follow; every refusal has the status the spec names;
//! a controller made again finds what the pool attached to it.

mod common;

use std::path::{Path, PathBuf};
use std::sync::Arc;

use block_backend::RamBackend;
use common::*;
use nvme_ctrl::pool::NamespacePool;
use nvme_ctrl::{ControllerConfig, NamespaceConfig, SubsystemConfig};
use nvme_spec::features::fid;
use nvme_spec::identify::{oacs, IdentifyController, IdentifyNamespace};
use nvme_spec::log::lid;
use nvme_spec::nsmgmt::cns;
use nvme_spec::opcode::admin as aop;
use nvme_spec::{Sqe, Status, NSID_ALL};
use test_kit::{InitOptions, MockHost};
use zerocopy::little_endian::{U32, U64};
use zerocopy::{FromBytes, FromZeros, IntoBytes};

const CAPACITY: u64 = 64 << 20;
const NS_ATTRIBUTE_CHANGED: u32 = 2 | ((lid::CHANGED_NAMESPACE_LIST as u32) << 16);

struct Dir(PathBuf);

impl Drop for Dir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn dir(name: &str) -> Dir {
    let p = std::env::temp_dir().join(format!("vnvme-pool-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&p);
    Dir(p)
}

/// Controller `cntlid` of the subsystem, with its own namespace 1 and the pool
/// at `path`, brought up with namespace notices on and an AER outstanding.
fn controller(path: &Path, cntlid: u16) -> MockHost {
    // The controllers of one subsystem share the pool's files.
    let locks = nvme_ctrl::pool::LockPolicy { group: Some("SUBSYSTEM".into()), ..Default::default() };
    let pool = NamespacePool::open(path, Some(CAPACITY), cntlid, &[1], &locks).unwrap();
    let cfg = ControllerConfig {
        namespaces: vec![NamespaceConfig::new(Arc::new(RamBackend::new(1 << 20)), 0)],
        max_namespaces: 16,
        subsystem: Some(SubsystemConfig { cntlid }),
        pool: Some(Arc::new(pool)),
        serial: "POOL0001".into(),
        ..Default::default()
    };
    let mut h = MockHost::new(cfg, MEM);
    h.init(InitOptions { io_queues: 1, queue_size: 64, ..Default::default() }).unwrap();
    assert_cqe(&h.set_features_raw(fid::ASYNC_EVENT_CONFIG, 1 << 8, false), Status::SUCCESS);
    h.submit_aer();
    h
}

/// Runs admin command `sqe`; an AER completing meanwhile (a notice this very
/// command raised) stays in the host's `aers` for [`notices`].
fn run(h: &mut MockHost, sqe: Sqe) -> nvme_spec::Cqe {
    let (c, others) = h.admin_exec(sqe);
    assert!(others.iter().all(|o| o.dw0.get() == NS_ATTRIBUTE_CHANGED), "{others:?}");
    AERS.with(|a| a.borrow_mut().entry(h as *const MockHost as usize).or_default().extend(others));
    c.expect("a completion")
}

thread_local! {
    /// AER completions seen while running other commands, by host.
    static AERS: std::cell::RefCell<std::collections::HashMap<usize, Vec<nvme_spec::Cqe>>> = Default::default();
}

fn with_data(h: &mut MockHost, mut sqe: Sqe, data: &[u8]) -> Status {
    let buf = h.alloc.alloc_pages(1);
    h.mem.write(buf, data).unwrap();
    sqe.set_prps(buf, 0);
    run(h, sqe).status()
}

/// Namespace Management, create: `blocks` of LBA format `flbas`.
fn create(h: &mut MockHost, blocks: u64, ncap: u64, flbas: u8, shared: bool) -> Result<u32, Status> {
    let mut id = IdentifyNamespace::new_zeroed();
    (id.nsze, id.ncap, id.flbas, id.nmic) = (U64::new(blocks), U64::new(ncap), flbas, shared as u8);
    let buf = h.alloc.alloc_pages(1);
    h.mem.write(buf, id.as_bytes()).unwrap();
    let mut sqe = Sqe::with_opcode(aop::NAMESPACE_MANAGEMENT);
    sqe.set_prps(buf, 0);
    let c = run(h, sqe);
    if c.status().is_success() {
        Ok(c.dw0.get())
    } else {
        assert!(c.status().dnr(), "{:?} with DNR", c.status());
        Err(c.status().code())
    }
}

fn delete(h: &mut MockHost, nsid: u32) -> Status {
    let mut sqe = Sqe::with_opcode(aop::NAMESPACE_MANAGEMENT);
    (sqe.nsid, sqe.cdw10) = (U32::new(nsid), U32::new(1));
    run(h, sqe).status().code()
}

/// Namespace Attachment (`detach`: SEL 1) of `nsid` for the controllers `ids`.
fn attach(h: &mut MockHost, nsid: u32, ids: &[u16], detach: bool) -> Status {
    let mut list = vec![0u8; 4096];
    list[..2].copy_from_slice(&(ids.len() as u16).to_le_bytes());
    for (i, id) in ids.iter().enumerate() {
        list[2 + 2 * i..4 + 2 * i].copy_from_slice(&id.to_le_bytes());
    }
    let mut sqe = Sqe::with_opcode(aop::NAMESPACE_ATTACHMENT);
    (sqe.nsid, sqe.cdw10) = (U32::new(nsid), U32::new(detach as u32));
    with_data(h, sqe, &list).code()
}

fn ids32(d: &[u8]) -> Vec<u32> {
    d.chunks_exact(4).map(|c| u32::from_le_bytes(c.try_into().unwrap())).take_while(|&n| n != 0).collect()
}

fn controllers(h: &mut MockHost, cns: u8, nsid: u32) -> Vec<u16> {
    let d = h.identify(cns, nsid).unwrap();
    let n = u16::from_le_bytes([d[0], d[1]]) as usize;
    (0..n).map(|i| u16::from_le_bytes([d[2 + 2 * i], d[3 + 2 * i]])).collect()
}

fn unvmcap(h: &mut MockHost) -> u64 {
    let c = IdentifyController::read_from_bytes(&h.identify(0x01, 0).unwrap()).unwrap();
    assert_ne!(c.oacs.get() & oacs::NS_MGMT, 0, "OACS Namespace Management");
    assert_ne!(c.anacap & nvme_spec::ana::anacap::GRPID_IN_NS_MGMT, 0, "ANAGRPID in Namespace Management");
    assert_eq!(u64::from_le_bytes(c.tnvmcap[..8].try_into().unwrap()), CAPACITY);
    u64::from_le_bytes(c.unvmcap[..8].try_into().unwrap())
}

/// The namespace notices `h` got since the last look (the changed list, read
/// with RAE clear; a new AER goes out for the next one).
fn notices(h: &mut MockHost) -> Vec<u32> {
    h.process();
    let mut got = AERS.with(|a| a.borrow_mut().remove(&(h as *const MockHost as usize)).unwrap_or_default());
    got.extend(h.reap_admin());
    if got.is_empty() {
        return Vec::new();
    }
    assert_eq!(got.len(), 1, "{got:?}");
    assert_eq!(got[0].dw0.get(), NS_ATTRIBUTE_CHANGED);
    let (st, data, _) = h.get_log_exec(lid::CHANGED_NAMESPACE_LIST, NSID_ALL, 1023, 0, false);
    assert_eq!(st, Status::SUCCESS);
    h.submit_aer();
    ids32(&data)
}

fn active(h: &mut MockHost) -> Vec<u32> {
    ids32(&h.identify(0x02, 0).unwrap())
}

#[test]
fn a_namespace_made_on_one_controller_is_attached_to_both_and_shares_its_data() {
    let d = dir("share");
    let (mut a, mut b) = (controller(&d.0, 1), controller(&d.0, 2));
    assert_eq!(unvmcap(&mut a), CAPACITY);
    let n = create(&mut a, 8192, 8192, 0, true).unwrap();
    assert_eq!(n, 2, "NSID 1 is each controller's own");
    assert_eq!(unvmcap(&mut b), CAPACITY - 8192 * 512, "the other controller counts it too");
    // Allocated, not yet attached anywhere.
    assert_eq!(ids32(&b.identify(cns::ALLOCATED_NAMESPACE_LIST, 0).unwrap()), [1, 2]);
    let id = IdentifyNamespace::read_from_bytes(&b.identify(cns::ALLOCATED_NAMESPACE, n).unwrap()).unwrap();
    assert_eq!((id.nsze.get(), id.nmic), (8192, 1));
    assert_eq!(active(&mut a), [1]);
    assert!(notices(&mut a).is_empty() && notices(&mut b).is_empty());

    assert_eq!(attach(&mut a, n, &[1, 2], false), Status::SUCCESS);
    assert_eq!(notices(&mut a), [n]);
    assert_eq!(notices(&mut b), [n], "the other controller raises it too");
    assert_eq!((active(&mut a), active(&mut b)), (vec![1, n], vec![1, n]));
    assert_eq!(controllers(&mut a, cns::NAMESPACE_CONTROLLER_LIST, n), [1, 2]);
    assert_eq!(controllers(&mut b, cns::CONTROLLER_LIST, 0), [1, 2]);
    let ida = a.identify(0x00, n).unwrap();
    assert_eq!(ida, b.identify(0x00, n).unwrap(), "one namespace, the same identity on both paths");

    // Written through one, read through the other.
    let data: Vec<u8> = (0..4096u32).map(|i| (i * 7) as u8).collect();
    assert_eq!(a.write_blocks(1, n, 100, 512, &data), Status::SUCCESS);
    let (st, back) = b.read_blocks(1, n, 100, 8, 512);
    assert_eq!((st, back), (Status::SUCCESS, data));

    assert_eq!(attach(&mut b, n, &[2], true), Status::SUCCESS, "detached from controller 2");
    assert_eq!(notices(&mut b), [n]);
    assert!(notices(&mut a).is_empty(), "controller 1 is not affected");
    assert_eq!((active(&mut a), active(&mut b)), (vec![1, n], vec![1]));
    assert_eq!(b.read_blocks(1, n, 100, 8, 512).0.code(), Status::INVALID_NAMESPACE);

    assert_eq!(delete(&mut b, n), Status::SUCCESS, "deleted through the controller it is not attached to");
    assert_eq!(notices(&mut a), [n], "detached from controller 1 first");
    assert_eq!(active(&mut a), [1]);
    assert_eq!(unvmcap(&mut a), CAPACITY);
    let files = std::fs::read_dir(&d.0)
        .unwrap()
        .filter_map(|e| e.ok())
        .filter(|e| e.file_name() != "pool.state")
        .count();
    assert_eq!(files, 0, "its data goes with it");
    assert_eq!(ids32(&a.identify(cns::ALLOCATED_NAMESPACE_LIST, 0).unwrap()), [1]);
}

#[test]
fn every_refusal_has_the_status_the_spec_names() {
    let d = dir("refusals");
    let (mut a, _b) = (controller(&d.0, 1), controller(&d.0, 2));
    let s = create(&mut a, 8, 8, 0, true).unwrap();
    let p = create(&mut a, 8, 8, 1, false).unwrap();
    assert_eq!(
        create(&mut a, CAPACITY / 512, CAPACITY / 512, 0, true),
        Err(Status::NAMESPACE_INSUFFICIENT_CAPACITY)
    );
    assert_eq!(create(&mut a, 16, 8, 0, true), Err(Status::THIN_PROVISIONING_NOT_SUPPORTED));
    assert_eq!(create(&mut a, 16, 16, 2, true), Err(Status::INVALID_FORMAT), "formats with metadata");
    assert_eq!(create(&mut a, 0, 0, 0, true), Err(Status::INVALID_FIELD));
    assert_eq!(attach(&mut a, s, &[1, 2], false), Status::SUCCESS);
    assert_eq!(attach(&mut a, s, &[2], false), Status::NAMESPACE_ALREADY_ATTACHED);
    assert_eq!(attach(&mut a, s, &[3], false), Status::CONTROLLER_LIST_INVALID);
    assert_eq!(attach(&mut a, s, &[], true), Status::CONTROLLER_LIST_INVALID);
    assert_eq!(attach(&mut a, p, &[1, 2], false), Status::NAMESPACE_IS_PRIVATE);
    assert_eq!(attach(&mut a, p, &[1], true), Status::NAMESPACE_NOT_ATTACHED);
    assert_eq!(attach(&mut a, NSID_ALL, &[1], false), Status::INVALID_NAMESPACE);
    assert_eq!(attach(&mut a, 9, &[1], false), Status::INVALID_NAMESPACE, "not allocated");
    assert_eq!(attach(&mut a, 1, &[2], false), Status::INVALID_FIELD, "the operator's namespace");
    assert_eq!(delete(&mut a, 1), Status::INVALID_FIELD);
    assert_eq!(delete(&mut a, 0), Status::INVALID_NAMESPACE);
    // Every NSID up to NN given out: the next create has none.
    while create(&mut a, 8, 8, 0, false).is_ok() {}
    assert_eq!(create(&mut a, 8, 8, 0, false), Err(Status::NAMESPACE_IDENTIFIER_UNAVAILABLE));
    assert_eq!(delete(&mut a, NSID_ALL), Status::SUCCESS);
    assert_eq!(ids32(&a.identify(cns::ALLOCATED_NAMESPACE_LIST, 0).unwrap()), [1]);
    assert_eq!(unvmcap(&mut a), CAPACITY);
    assert_eq!(a.read_blocks(1, 1, 0, 1, 512).0, Status::SUCCESS, "the controller serves on");
}

#[test]
fn a_controller_made_again_finds_what_the_pool_attached_to_it() {
    let d = dir("restart");
    let mut a = controller(&d.0, 1);
    let n = create(&mut a, 64, 64, 1, false).unwrap();
    assert_eq!(attach(&mut a, n, &[1], false), Status::SUCCESS);
    let data = vec![0x5au8; 4096];
    assert_eq!(a.write_blocks(1, n, 3, 4096, &data), Status::SUCCESS);
    drop(a);
    let mut again = controller(&d.0, 1);
    assert_eq!(active(&mut again), [1, n]);
    let (st, back) = again.read_blocks(1, n, 3, 1, 4096);
    assert_eq!((st, back), (Status::SUCCESS, data));
    // A pool NSID is not the operator's to take, remove or resize.
    assert!(again.ctrl.remove_namespace(n).is_err());
    assert!(again.ctrl.resize_namespace(n, 1 << 20, true).is_err());
    let ram = NamespaceConfig::new(Arc::new(RamBackend::new(1 << 20)), 0);
    assert!(again.ctrl.add_namespace(&ram, Some(n)).is_err());
    assert_eq!(again.ctrl.add_namespace(&ram, None).unwrap(), 3, "the lowest NSID the pool has not given");
    assert_eq!(create(&mut again, 8, 8, 0, false), Ok(4), "and the pool does not give it now");
}

#[test]
fn without_a_pool_there_is_no_namespace_management() {
    let (mut h, _) = ready(1, true);
    let c = IdentifyController::read_from_bytes(&h.identify(0x01, 0).unwrap()).unwrap();
    assert_eq!(c.oacs.get() & oacs::NS_MGMT, 0);
    assert_eq!(h.admin_status(Sqe::with_opcode(aop::NAMESPACE_MANAGEMENT)).code(), Status::INVALID_OPCODE);
    assert_eq!(h.admin_status(Sqe::with_opcode(aop::NAMESPACE_ATTACHMENT)).code(), Status::INVALID_OPCODE);
    let mut c = nvme_spec::admin::IdentifyCmd { cns: cns::CONTROLLER_LIST, ..Default::default() }.to_sqe();
    c.set_prps(h.alloc.alloc_pages(1), 0);
    assert_eq!(h.admin_status(c).code(), Status::INVALID_FIELD);
}

/// A pool state file changed behind the controllers' backs into one the rules
/// could not have made (a compromised controller process, a hand edit): it is
/// refused, the namespaces attached stay as they were and keep serving, and what
/// would change the pool fails with Internal Error rather than build on it.
#[test]
fn a_damaged_pool_state_is_refused_and_the_last_good_one_kept() {
    use std::os::unix::fs::FileExt;
    let d = dir("damaged");
    let (mut a, mut b) = (controller(&d.0, 1), controller(&d.0, 2));
    let n = create(&mut a, 64, 64, 0, true).unwrap();
    assert_eq!(attach(&mut a, n, &[1, 2], false), Status::SUCCESS);
    assert_eq!((notices(&mut a), notices(&mut b)), (vec![n], vec![n]));
    let f = std::fs::OpenOptions::new().read(true).write(true).open(d.0.join("pool.state")).unwrap();
    // Attached to a controller the pool does not have (and no longer to 2), past
    // the capacity.
    let bad = format!(
        r#"{{"capacity":1,"controllers":[1,2],"fixed":{{}},"namespaces":{{"{n}":{{"nsze":64,"lba_format":0,"shared":true,"ana_group":1,"attached":[1,9],"nguid":[{}]}}}}}}"#,
        ["0"; 16].join(",")
    );
    let mut rec = (bad.len() as u32).to_le_bytes().to_vec();
    rec.extend_from_slice(bad.as_bytes());
    f.write_all_at(&rec, 4096).unwrap();
    let mut c = [0u8; 4];
    f.read_exact_at(&mut c, 64).unwrap();
    f.write_all_at(&(u32::from_le_bytes(c) + 1).to_le_bytes(), 64).unwrap();
    assert!(notices(&mut b).is_empty() && notices(&mut a).is_empty(), "nothing attached or detached");
    assert_eq!((active(&mut a), active(&mut b)), (vec![1, n], vec![1, n]));
    assert_eq!(b.write_blocks(1, n, 0, 512, &[7; 512]), Status::SUCCESS, "the namespace serves on");
    assert_eq!(create(&mut a, 8, 8, 0, true), Err(Status::INTERNAL_ERROR), "no change built on it");
    assert_eq!(attach(&mut b, n, &[2], true), Status::INTERNAL_ERROR);
}

/// A namespace attached while its file cannot be opened (here: moved away behind
/// the pool's back; in life, descriptors exhausted) is tried again each second
/// and attached once it can be, with its notice; nothing waits for the pool to
/// change again.
#[test]
fn an_attach_that_could_not_open_its_file_is_tried_again() {
    let d = dir("retry");
    let mut a = controller(&d.0, 1);
    let n = create(&mut a, 64, 64, 0, false).unwrap();
    let file = std::fs::read_dir(&d.0)
        .unwrap()
        .filter_map(|e| e.ok())
        .map(|e| e.path())
        .find(|p| p.file_name().is_some_and(|f| f != "pool.state"))
        .expect("its data file");
    let aside = d.0.join("aside");
    std::fs::rename(&file, &aside).unwrap();
    assert_eq!(attach(&mut a, n, &[1], false), Status::SUCCESS, "the pool records it");
    assert!(notices(&mut a).is_empty() && active(&mut a) == [1], "not attached: no file");
    std::fs::rename(&aside, &file).unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    let mut got = Vec::new();
    while got.is_empty() && std::time::Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(100));
        got = notices(&mut a);
    }
    assert_eq!(got, [n], "attached within the retry");
    assert_eq!(active(&mut a), [1, n]);
}

/// Format NVM of `nsid` with CDW10 `cdw10`, run until it completes (an erase
/// takes several runs of the admin side); notices it raised are kept for
/// [`notices`].
fn format(h: &mut MockHost, nsid: u32, cdw10: u32) -> Status {
    let mut sqe = Sqe::with_opcode(aop::FORMAT_NVM);
    (sqe.nsid, sqe.cdw10) = (U32::new(nsid), U32::new(cdw10));
    let cid = h.submit(0, sqe).expect("admin queue has room");
    for _ in 0..10_000 {
        h.process();
        let (mine, others): (Vec<_>, Vec<_>) = h.reap_queue(0).into_iter().partition(|c| c.cid.get() == cid);
        AERS.with(|a| a.borrow_mut().entry(h as *const MockHost as usize).or_default().extend(others));
        if let Some(c) = mine.first() {
            return c.status();
        }
        std::thread::sleep(std::time::Duration::from_micros(100));
    }
    panic!("Format NVM did not complete");
}

/// NSZE and the LBA format in use, as Identify Namespace (CNS `cns`) gives them.
fn shape(h: &mut MockHost, cns: u8, nsid: u32) -> (u64, u8) {
    let id = IdentifyNamespace::read_from_bytes(&h.identify(cns, nsid).unwrap()).unwrap();
    (id.nsze.get(), id.flbas & 0xf)
}

#[test]
fn a_format_through_one_controller_is_the_namespaces_format_on_every_controller() {
    let d = dir("format");
    let (mut a, mut b) = (controller(&d.0, 1), controller(&d.0, 2));
    let n = create(&mut a, 8192, 8192, 0, true).unwrap();
    assert_eq!(attach(&mut a, n, &[1, 2], false), Status::SUCCESS);
    assert_eq!((notices(&mut a), notices(&mut b)), (vec![n], vec![n]));
    let data: Vec<u8> = (0..4096u32).map(|i| (i * 13) as u8).collect();
    assert_eq!(b.write_blocks(1, n, 8, 512, &data), Status::SUCCESS);

    // 4 KiB blocks (LBAF 1), user data kept, through controller 1.
    assert_eq!(format(&mut a, n, 1), Status::SUCCESS);
    assert_eq!(notices(&mut a), [n]);
    assert_eq!(notices(&mut b), [n], "the other controller tells its host too");
    assert_eq!((shape(&mut a, 0x00, n), shape(&mut b, 0x00, n)), ((1024, 1), (1024, 1)));
    let (st, back) = b.read_blocks(1, n, 1, 1, 4096);
    assert_eq!((st, back), (Status::SUCCESS, data.clone()), "the same bytes, in 4 KiB blocks");
    assert_eq!(unvmcap(&mut b), CAPACITY - (4 << 20), "the capacity it takes is unchanged");
    assert_eq!(shape(&mut b, cns::ALLOCATED_NAMESPACE, n), (1024, 1));

    // A controller made again attaches it in the format it has now.
    drop(b);
    let mut b = controller(&d.0, 2);
    assert_eq!(shape(&mut b, 0x00, n), (1024, 1));
    assert_eq!(b.read_blocks(1, n, 1, 1, 4096), (Status::SUCCESS, data));

    // Back to 512 B with the user data erased (SES 1), through controller 2.
    assert_eq!(format(&mut b, n, 1 << 9), Status::SUCCESS);
    assert_eq!(notices(&mut b), [n]);
    assert_eq!(notices(&mut a), [n]);
    assert_eq!((shape(&mut a, 0x00, n), shape(&mut b, 0x00, n)), ((8192, 0), (8192, 0)));
    assert_eq!(a.read_blocks(1, n, 8, 8, 512), (Status::SUCCESS, vec![0u8; 4096]), "erased for both");
    assert!(notices(&mut a).is_empty() && notices(&mut b).is_empty(), "one notice per change");
}

#[test]
fn an_operators_namespace_formatted_through_one_controller_is_so_on_every_one_that_has_it() {
    // NSID 1 is each controller's operator's (`--ns`): with a pool, the subsystem
    // knows both have it, and a Format through one is the namespace's.
    let d = dir("format-fixed");
    let (mut a, mut b) = (controller(&d.0, 1), controller(&d.0, 2));
    assert_eq!(format(&mut a, 1, 1), Status::SUCCESS);
    assert_eq!(notices(&mut a), [1]);
    assert_eq!(notices(&mut b), [1], "the other controller that has NSID 1 tells its host");
    assert_eq!((shape(&mut a, 0x00, 1), shape(&mut b, 0x00, 1)), ((256, 1), (256, 1)));
    let data: Vec<u8> = (0..4096u32).map(|i| (i * 3) as u8).collect();
    assert_eq!(b.write_blocks(1, 1, 2, 4096, &data), Status::SUCCESS);
    assert_eq!(b.read_blocks(1, 1, 2, 1, 4096), (Status::SUCCESS, data));
    // Started again, a controller serves it in that format, not its --ns one.
    drop(b);
    let mut b = controller(&d.0, 2);
    assert_eq!(shape(&mut b, 0x00, 1), (256, 1));
    // Back to 512 B through controller 2.
    assert_eq!(format(&mut b, 1, 0), Status::SUCCESS);
    assert_eq!(notices(&mut b), [1]);
    assert_eq!(notices(&mut a), [1]);
    assert_eq!(shape(&mut a, 0x00, 1), (2048, 0));
    assert!(notices(&mut a).is_empty() && notices(&mut b).is_empty(), "one notice per change");
}
