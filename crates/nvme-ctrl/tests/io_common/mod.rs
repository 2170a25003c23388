//! Shared pieces of the I/O test tier (io_commands, io_dptr, doorbells, queues_full).
#![allow(dead_code)]

use std::sync::Arc;

use block_backend::{Backend, BackendInfo, NullBackend, RamBackend};
use nvme_ctrl::Lifecycle;
use nvme_ctrl::{ControllerConfig, MetaFile, MetadataConfig, NamespaceConfig};
use nvme_spec::admin::GetLogPageCmd;
use nvme_spec::features::{fid, NumberOfQueues};
use nvme_spec::log::lid;
use nvme_spec::opcode::nvm as iop;
use nvme_spec::{Cqe, Status};
use test_kit::{InitOptions, MockHost};
use test_util::Rng;

/// Guest memory every test host gets.
pub const MEM: u64 = 64 << 20;

/// A host with one RAM namespace per `(bytes, lba_format)`, initialised the Linux way.
pub fn ram_host(namespaces: &[(u64, u8)], opts: InitOptions) -> (MockHost, Vec<RamBackend>) {
    let rams: Vec<RamBackend> = namespaces.iter().map(|&(size, _)| RamBackend::new(size)).collect();
    let backends: Vec<(Arc<dyn Backend>, u8)> = rams
        .iter()
        .zip(namespaces)
        .map(|(r, &(_, f))| (Arc::new(r.clone()) as Arc<dyn Backend>, f))
        .collect();
    (host_with(backends, opts), rams)
}

/// A host with one null namespace of `bytes` and LBA format `lbaf`.
pub fn null_host(bytes: u64, lbaf: u8, opts: InitOptions) -> MockHost {
    host_with(vec![(Arc::new(NullBackend::new(bytes)), lbaf)], opts)
}

pub fn host_with(backends: Vec<(Arc<dyn Backend>, u8)>, opts: InitOptions) -> MockHost {
    let cfg = ControllerConfig {
        namespaces: backends
            .into_iter()
            .map(|(backend, lba_format)| NamespaceConfig::new(backend, lba_format))
            .collect(),
        ..Default::default()
    };
    let mut h = MockHost::new(cfg, MEM);
    h.init(opts).expect("bring-up");
    h
}

/// Small queues, two pairs, shadow doorbells on: the default for command tests.
pub fn opts() -> InitOptions {
    InitOptions { io_queues: 2, queue_size: 64, ..Default::default() }
}

/// Asserts the exact status (SCT, SC) and the DNR bit of a completion.
#[track_caller]
pub fn assert_status(c: &Cqe, want: Status, dnr: bool) {
    let got = c.status();
    assert_eq!(got.code(), want.code(), "cid {}: got {got:?}, want {want:?}", c.cid.get());
    assert_eq!(got.dnr(), dnr, "cid {}: DNR of {got:?}", c.cid.get());
}

/// Asserts the controller is still enabled and not fatal, and that a write/read round
/// trip on `nsid` (LBA size `lba`) through queue `qid` still works.
#[track_caller]
pub fn assert_still_works(h: &mut MockHost, qid: u16, nsid: u32, lba: u32) {
    assert_eq!(h.ctrl.lifecycle(), Lifecycle::Ready, "controller left the Ready state");
    assert!(!h.csts().cfs(), "CSTS.CFS set");
    let data = Rng::new(0x5eed ^ qid as u64 ^ nsid as u64).bytes(lba as usize * 2);
    assert_eq!(h.write_blocks(qid, nsid, 3, lba, &data), Status::SUCCESS);
    let (st, back) = h.read_blocks(qid, nsid, 3, 2, lba);
    assert_eq!(st, Status::SUCCESS);
    assert!(back == data, "data read back differs");
}

pub const READ: u8 = iop::READ;
pub const WRITE: u8 = iop::WRITE;

/// A host with one RAM namespace of `bytes` (512-byte LBAs), enabled and granted `nq`
/// I/O queue pairs but with no I/O queues yet: the test creates its own topology and
/// then (optionally) sends Doorbell Buffer Config, as Linux does after creating them.
pub fn bare_host(bytes: u64, nq: u16) -> (MockHost, RamBackend) {
    let ram = RamBackend::new(bytes);
    let cfg = ControllerConfig {
        namespaces: vec![NamespaceConfig::new(Arc::new(ram.clone()), 0)],
        ..Default::default()
    };
    let mut h = MockHost::new(cfg, MEM);
    h.enable(32).expect("enable");
    let n = nq as u32 - 1;
    h.set_feature(fid::NUMBER_OF_QUEUES, NumberOfQueues::new(n as u16, n as u16).0)
        .expect("Number of Queues");
    (h, ram)
}

/// A namespace with metadata for the protection information tests: 4 MiB of RAM
/// with a metadata store in format `lbaf` and protection `dps` (NSID 1), and NSID 2
/// over the same data without metadata, the host under the namespace, able to
/// change its data behind the protection information.
pub fn pi_host(lbaf: u8, dps: u8) -> MockHost {
    let ram: Arc<dyn Backend> = Arc::new(RamBackend::new(4 << 20));
    let with_meta = NamespaceConfig {
        metadata: Some(MetadataConfig { store: MetaFile::memory().unwrap(), dps, extended: false }),
        ..NamespaceConfig::new(ram.clone(), lbaf)
    };
    let under = NamespaceConfig::new(ram, 0);
    let cfg = ControllerConfig { namespaces: vec![with_meta, under], ..Default::default() };
    let mut h = MockHost::new(cfg, MEM);
    h.init(opts()).expect("bring-up");
    h
}

/// A RAM backend that claims neither deallocation nor native write zeroes.
#[derive(Debug)]
pub struct Plain(pub RamBackend);

impl Backend for Plain {
    fn info(&self) -> BackendInfo {
        BackendInfo { discard: false, discard_zeroes: false, write_zeroes: false, ..self.0.info() }
    }
    fn open_queue(&self) -> std::io::Result<Box<dyn block_backend::BackendQueue>> {
        self.0.open_queue()
    }
}

/// Get Log Page Commands Supported and Effects of command set `csi`: the status and
/// the 4 KiB page.
pub fn effects_log(h: &mut MockHost, csi: u8) -> (Status, Vec<u8>) {
    let mut c = GetLogPageCmd {
        nsid: 0xffff_ffff,
        lid: lid::COMMANDS_SUPPORTED_AND_EFFECTS,
        numd_z: 1023,
        csi,
        ..Default::default()
    }
    .to_sqe();
    c.set_prps(h.admin_buf, h.admin_buf + 4096);
    let st = h.admin_raw(c).status();
    let mut v = vec![0u8; 4096];
    h.mem.read(h.admin_buf, &mut v).unwrap();
    (st, v)
}
