//! Backend failures become the statuses the spec names (Base "Generic Command
//! Status" and "Media and Data Integrity Errors"), fill the Error Information log,
//! count in SMART / Health and set its critical warnings, raise a SMART / Health
//! event when the host enabled one, and never stop the controller. Driven by the
//! fault injection backend; what the controller advertises for optional commands
//! follows what the backend can do.

mod common;
mod io_common;

use std::sync::Arc;

use block_backend::{Backend, BackendInfo, FaultBackend, FaultRule, RamBackend};
use common::{le16, le32, le64};
use io_common::*;
use nvme_ctrl::{ControllerConfig, NamespaceConfig};
use nvme_spec::features::fid;
use nvme_spec::log::{critical_warning, lid};
use nvme_spec::nvm::DatasetManagementCmd;
use nvme_spec::opcode::nvm as iop;
use nvme_spec::Status;
use test_kit::{InitOptions, MockHost};

const NS_BYTES: u64 = 8 << 20;
const LBA: u32 = 512;

fn faulty(rules: &[&str]) -> (MockHost, FaultBackend) {
    let ram: Arc<dyn Backend> = Arc::new(RamBackend::new(NS_BYTES));
    let be = FaultBackend::new(ram, rules.iter().map(|r| r.parse::<FaultRule>().unwrap()).collect());
    (host_with(vec![(Arc::new(be.clone()), 0)], opts()), be)
}

fn smart(h: &mut MockHost) -> Vec<u8> {
    h.get_log(lid::SMART_HEALTH, 0xffff_ffff, 512, false).unwrap()
}

/// The newest Error Information log entry: (error count, sqid, cid, status, lba, nsid).
fn newest_error(h: &mut MockHost) -> (u64, u16, u16, u16, u64, u32) {
    let e = h.get_log(lid::ERROR_INFORMATION, 0xffff_ffff, 64, false).unwrap();
    (le64(&e, 0), le16(&e, 8), le16(&e, 10), le16(&e, 12) >> 1, le64(&e, 16), le32(&e, 24))
}

#[test]
fn read_media_error_is_unrecovered_read_error_logged_and_counted() {
    let (mut h, be) = faulty(&["read/eio/lba=100+4"]);
    let buf = h.alloc.alloc_pages(1);
    let mut s = MockHost::lba_sqe(iop::READ, 1, 101, 1);
    s.set_prps(buf, 0);
    let c = h.io_cmd(1, s);
    assert_status(&c, Status::UNRECOVERED_READ_ERROR, false);
    assert_eq!(be.injected(), 1);
    let (count, sqid, cid, status, lba, nsid) = newest_error(&mut h);
    assert_eq!((count, sqid, cid, nsid, lba), (1, 1, c.cid.get(), 1, 101));
    assert_eq!(Status::from_raw(status).code(), Status::UNRECOVERED_READ_ERROR.code());
    let log = smart(&mut h);
    assert_eq!(log[0] & critical_warning::RELIABILITY, critical_warning::RELIABILITY, "reliability degraded");
    assert_eq!(le64(&log, 160), 1, "Media and Data Integrity Errors");
    assert_eq!(le64(&log, 176), 1, "Number of Error Information Log Entries");
    // Outside the faulty range, reads and writes still work.
    assert_still_works(&mut h, 1, 1, LBA);
}

#[test]
fn write_failures_map_to_write_fault_capacity_exceeded_write_protect_and_not_ready() {
    for (rule, want, dnr, warning) in [
        ("write/eio", Status::WRITE_FAULT, false, critical_warning::RELIABILITY),
        ("write/short", Status::WRITE_FAULT, false, critical_warning::RELIABILITY),
        ("write/enospc", Status::CAPACITY_EXCEEDED, true, 0),
        ("write/rofs", Status::NAMESPACE_WRITE_PROTECTED, true, critical_warning::READ_ONLY),
        ("write/gone", Status::NAMESPACE_NOT_READY, false, critical_warning::RELIABILITY),
        ("read/short", Status::UNRECOVERED_READ_ERROR, false, critical_warning::RELIABILITY),
        ("read/gone", Status::NAMESPACE_NOT_READY, false, critical_warning::RELIABILITY),
    ] {
        let (mut h, _) = faulty(&[&format!("{rule}/count=1")]);
        let data = vec![0x5a; LBA as usize];
        let st = if rule.starts_with("write") {
            h.write_blocks(1, 1, 7, LBA, &data)
        } else {
            h.read_blocks(1, 1, 7, 1, LBA).0
        };
        assert_eq!(st.code(), want.code(), "{rule}: {st:?}");
        assert_eq!(st.dnr(), dnr, "{rule}: DNR of {st:?}");
        assert_eq!(smart(&mut h)[0], warning, "{rule}: critical warning");
        // The rule fired once; the same command now succeeds (the host's retry).
        assert_eq!(h.write_blocks(1, 1, 7, LBA, &data), Status::SUCCESS, "{rule}: retry");
        assert_still_works(&mut h, 2, 1, LBA);
    }
}

#[test]
fn flush_failure_is_a_write_fault() {
    let (mut h, _) = faulty(&["flush/eio/count=1"]);
    let c = h.io_cmd(1, MockHost::lba_sqe(iop::FLUSH, 1, 0, 0));
    assert_status(&c, Status::WRITE_FAULT, false);
    let c = h.io_cmd(1, MockHost::lba_sqe(iop::FLUSH, 1, 0, 0));
    assert_status(&c, Status::SUCCESS, false);
}

#[test]
fn smart_event_only_when_enabled_and_once_per_warning() {
    let (mut h, _) = faulty(&["read/eio"]);
    // Enable SMART / Health events for the reliability warning (AEC bit 2).
    h.set_feature(fid::ASYNC_EVENT_CONFIG, critical_warning::RELIABILITY as u32).unwrap();
    let aer = h.submit_aer();
    assert!(h.reap_admin().is_empty());
    assert_eq!(h.read_blocks(1, 1, 0, 1, LBA).0.code(), Status::UNRECOVERED_READ_ERROR.code());
    h.process();
    let got = h.reap_admin();
    assert_eq!(got.len(), 1, "one SMART event: {got:?}");
    assert_eq!(got[0].cid.get(), aer);
    // Type 1 (SMART / Health), info 0 (NVM subsystem reliability), log page 02h.
    assert_eq!(got[0].dw0.get(), 1 | ((lid::SMART_HEALTH as u32) << 16));
    // The warning is already set: more errors raise no new event.
    let _ = smart(&mut h);
    h.submit_aer();
    assert_eq!(h.read_blocks(1, 1, 0, 1, LBA).0.code(), Status::UNRECOVERED_READ_ERROR.code());
    h.process();
    assert!(h.reap_admin().is_empty(), "no second event for the same warning");

    // Without AEC, the warning is set but no event is posted.
    let (mut h, _) = faulty(&["read/eio"]);
    h.submit_aer();
    assert_eq!(h.read_blocks(1, 1, 0, 1, LBA).0.code(), Status::UNRECOVERED_READ_ERROR.code());
    h.process();
    assert!(h.reap_admin().is_empty());
    assert_eq!(smart(&mut h)[0], critical_warning::RELIABILITY);
}

#[test]
fn every_failure_gets_an_error_log_entry_and_io_goes_on_under_load() {
    // One block in eight fails; queue depth well above one.
    let (mut h, be) = faulty(&["read/eio/lba=0+1", "read/eio/lba=8+1", "read/eio/lba=16+1"]);
    let mut failed = 0;
    for lba in 0..32u64 {
        let (st, _) = h.read_blocks(1 + (lba % 2) as u16, 1, lba, 1, LBA);
        if !st.is_success() {
            failed += 1;
            assert_eq!(st.code(), Status::UNRECOVERED_READ_ERROR.code());
        }
    }
    assert_eq!(failed, 3);
    assert_eq!(be.injected(), 3);
    let (count, _, _, _, lba, _) = newest_error(&mut h);
    assert_eq!((count, lba), (3, 16));
    assert_eq!(le64(&smart(&mut h), 160), 3);
}

#[test]
fn optional_commands_are_advertised_only_when_the_backend_has_them() {
    const ONCS_DSM: u16 = 1 << 2;
    const ONCS_WRITE_ZEROES: u16 = 1 << 3;
    let mut h = host_with(vec![(Arc::new(Plain(RamBackend::new(NS_BYTES))), 0)], opts());
    let id = h.identify(0x01, 0).unwrap();
    let oncs = le16(&id, 520);
    assert_eq!(oncs & (ONCS_DSM | ONCS_WRITE_ZEROES), 0, "ONCS {oncs:#x}");
    let c = h.io_cmd(1, MockHost::lba_sqe(iop::WRITE_ZEROES, 1, 0, 7));
    assert_status(&c, Status::INVALID_OPCODE, true);
    let s = DatasetManagementCmd { nsid: 1, nr_z: 0, ad: true, ..Default::default() }.to_sqe();
    let c = h.io_cmd(1, s);
    assert_status(&c, Status::INVALID_OPCODE, true);
    assert_still_works(&mut h, 1, 1, LBA);

    // RAM does both, so both are advertised.
    let (mut h, _) = ram_host(&[(NS_BYTES, 0)], opts());
    let oncs = le16(&h.identify(0x01, 0).unwrap(), 520);
    assert_eq!(oncs & (ONCS_DSM | ONCS_WRITE_ZEROES), ONCS_DSM | ONCS_WRITE_ZEROES);
}

/// A RAM backend that claims limits, to see them in Identify and the requests split.
#[derive(Debug)]
struct Limited(RamBackend, Arc<std::sync::atomic::AtomicU64>);

#[derive(Debug)]
struct LimitedQueue(Box<dyn block_backend::BackendQueue>, Arc<std::sync::atomic::AtomicU64>, u64);

impl Backend for Limited {
    fn info(&self) -> BackendInfo {
        BackendInfo { discard_max: 64 << 10, write_zeroes_max: 128 << 10, ..self.0.info() }
    }
    fn open_queue(&self) -> std::io::Result<Box<dyn block_backend::BackendQueue>> {
        Ok(Box::new(LimitedQueue(self.0.open_queue()?, self.1.clone(), 128 << 10)))
    }
}

impl block_backend::BackendQueue for LimitedQueue {
    fn submit(&mut self, mem: &guest_mem::GuestMemory, req: block_backend::Request) {
        if matches!(req.op, block_backend::Op::WriteZeroes { .. } | block_backend::Op::Discard) {
            assert!(req.len <= self.2, "request of {} bytes exceeds the advertised limit", req.len);
        }
        self.1.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        self.0.submit(mem, req)
    }
    fn reap(&mut self, out: &mut Vec<block_backend::Completion>) -> usize {
        self.0.reap(out)
    }
    fn in_flight(&self) -> usize {
        self.0.in_flight()
    }
}

#[test]
fn limits_are_reported_in_identify_and_honoured_by_splitting() {
    let n = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let be = Limited(RamBackend::new(NS_BYTES), n.clone());
    let mut h = host_with(vec![(Arc::new(be), 0)], opts());
    // I/O Command Set specific Identify Controller (CNS 06h, CSI 0).
    let id = h.identify_raw(0x06, 0, 0).unwrap();
    assert_eq!(id[1], 5, "WZSL: 128 KiB = 2^5 x 4 KiB");
    assert_eq!(le32(&id, 4), 128, "DMRSL: 64 KiB in 512-byte blocks");
    // A 1 MiB Write Zeroes goes to the backend as 8 requests of 128 KiB.
    let data = vec![0xee; 1 << 20];
    for (i, chunk) in data.chunks(128 << 10).enumerate() {
        assert_eq!(h.write_blocks(1, 1, i as u64 * 256, LBA, chunk), Status::SUCCESS);
    }
    let before = n.load(std::sync::atomic::Ordering::Relaxed);
    let c = h.io_cmd(1, MockHost::lba_sqe(iop::WRITE_ZEROES, 1, 0, 2048));
    assert_status(&c, Status::SUCCESS, false);
    assert_eq!(n.load(std::sync::atomic::Ordering::Relaxed) - before, 8);
    let (st, back) = h.read_blocks(1, 1, 0, 2048, LBA);
    assert_eq!(st, Status::SUCCESS);
    assert!(back.iter().all(|&b| b == 0), "zeroed");
}

#[test]
fn lba_size_must_suit_the_backend() {
    #[derive(Debug)]
    struct FourK(RamBackend);
    impl Backend for FourK {
        fn info(&self) -> BackendInfo {
            BackendInfo { block_size: 4096, ..self.0.info() }
        }
        fn open_queue(&self) -> std::io::Result<Box<dyn block_backend::BackendQueue>> {
            self.0.open_queue()
        }
    }
    let cfg = |lbaf| ControllerConfig {
        namespaces: vec![NamespaceConfig::new(Arc::new(FourK(RamBackend::new(NS_BYTES))), lbaf)],
        ..Default::default()
    };
    let err = nvme_ctrl::Controller::new(
        cfg(0),
        guest_mem::GuestMemory::empty(),
        Arc::new(test_kit::CountingIrq::new(4)),
    )
    .expect_err("512-byte LBAs on a 4 KiB backend are refused");
    assert!(err.to_string().contains("block size 4096"), "{err}");
    // With 4 KiB LBAs it works, and Format NVM back to 512 B is an Invalid Format.
    let mut h = MockHost::new(cfg(1), MEM);
    h.init(InitOptions { io_queues: 1, queue_size: 16, ..Default::default() }).unwrap();
    assert_eq!(h.format_raw(1, 0).code(), Status::INVALID_FORMAT.code());
    assert_still_works(&mut h, 1, 1, 4096);
}

/// Sets Host Behavior Support with ACRE = `acre` (the 512-byte buffer in the admin
/// buffer) and reads it back.
fn set_acre(h: &mut MockHost, acre: bool) {
    let mut data = [0u8; 512];
    data[0] = acre as u8;
    h.mem.write(h.admin_buf, &data).unwrap();
    let c = h.set_features_raw(fid::HOST_BEHAVIOR_SUPPORT, 0, false);
    assert_eq!(c.status(), Status::SUCCESS, "Set Features Host Behavior Support");
    h.mem.fill(h.admin_buf, 512, 0xff).unwrap();
    let c = h.get_features_raw(fid::HOST_BEHAVIOR_SUPPORT, 0, 0);
    assert_eq!(c.status(), Status::SUCCESS, "Get Features Host Behavior Support");
    let mut back = [0u8; 512];
    h.mem.read(h.admin_buf, &mut back).unwrap();
    assert_eq!(back[0], acre as u8, "ACRE reads back");
    assert!(back[1..].iter().all(|&b| b == 0), "fields not supported read back as 0");
}

/// Command Retry Delay (Base: Completion Queue Entry, CRD; Identify Controller
/// CRDT1-3; Host Behavior Support, ACRE): Identify reports the delay times; once the
/// host enables Advanced Command Retry, a command that failed because the storage is
/// unreachable carries CRD 1 (retry after CRDT1), a timed-out one CRD 2, and a
/// failure a retry at once may clear, or one with DNR, none; without ACRE no status
/// carries a CRD; a reset turns ACRE off again.
#[test]
fn retryable_failures_carry_a_command_retry_delay_once_the_host_enables_acre() {
    let (mut h, _be) = faulty(&["read/gone/lba=0+8", "read/eio/lba=8+8", "write/enospc/lba=16+8"]);
    let id = h.identify(1, 0).unwrap();
    let crdt = |i: usize| u16::from_le_bytes([id[128 + 2 * i], id[129 + 2 * i]]);
    assert_eq!([crdt(0), crdt(1), crdt(2)], nvme_ctrl::RETRY_DELAYS);
    assert!(crdt(0) > 0, "CRDT1 must be set, or Linux never enables ACRE");
    let read = |h: &mut MockHost, slba: u64| {
        let buf = h.alloc.alloc_pages(1);
        let mut s = MockHost::lba_sqe(iop::READ, 1, slba, 1);
        s.set_prps(buf, 0);
        h.io_cmd(1, s).status()
    };
    let write = |h: &mut MockHost, slba: u64| {
        let buf = h.alloc.alloc_pages(1);
        let mut s = MockHost::lba_sqe(iop::WRITE, 1, slba, 1);
        s.set_prps(buf, 0);
        h.io_cmd(1, s).status()
    };
    // Before ACRE: no delay anywhere.
    assert_eq!(read(&mut h, 0), Status::NAMESPACE_NOT_READY);
    set_acre(&mut h, true);
    let gone = read(&mut h, 0);
    assert_eq!((gone.code(), gone.crd(), gone.dnr()), (Status::NAMESPACE_NOT_READY, 1, false));
    let media = read(&mut h, 8);
    assert_eq!((media.code(), media.crd()), (Status::UNRECOVERED_READ_ERROR, 0));
    let full = write(&mut h, 16);
    assert_eq!((full.code(), full.crd(), full.dnr()), (Status::CAPACITY_EXCEEDED, 0, true));
    assert_eq!(read(&mut h, 100), Status::SUCCESS);
    // The Error Information log keeps the status as completed.
    let (_, _, _, status, _, _) = newest_error(&mut h);
    assert_eq!(Status::from_raw(status).code(), Status::CAPACITY_EXCEEDED);
    set_acre(&mut h, false);
    assert_eq!(read(&mut h, 0).crd(), 0, "ACRE off again: no delay");
    set_acre(&mut h, true);
    h.enable(32).unwrap();
    let c = h.get_features_raw(fid::HOST_BEHAVIOR_SUPPORT, 0, 0);
    assert_eq!(c.status(), Status::SUCCESS);
    let mut back = [0u8; 1];
    h.mem.read(h.admin_buf, &mut back).unwrap();
    assert_eq!(back[0], 0, "a Controller Level Reset turns ACRE off");
}

/// A command that timed out at the backend carries CRD 2 once ACRE is on.
#[test]
fn a_timed_out_command_carries_the_second_retry_delay() {
    let ram: Arc<dyn Backend> = Arc::new(RamBackend::new(NS_BYTES));
    let be = FaultBackend::new(ram, vec!["read/hang".parse::<FaultRule>().unwrap()]);
    let mut n = NamespaceConfig::new(Arc::new(be), 0);
    n.timeout = Some(std::time::Duration::from_millis(50));
    let cfg = ControllerConfig { namespaces: vec![n], ..Default::default() };
    let mut h = MockHost::new(cfg, 64 << 20);
    h.init(opts()).unwrap();
    set_acre(&mut h, true);
    let buf = h.alloc.alloc_pages(1);
    let mut s = MockHost::lba_sqe(iop::READ, 1, 0, 1);
    s.set_prps(buf, 0);
    let st = h.io_cmd(1, s).status();
    assert_eq!((st.code(), st.crd(), st.dnr()), (Status::INTERNAL_ERROR, 2, false));
}
