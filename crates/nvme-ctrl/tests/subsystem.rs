//! A controller that is one of several in its NVM subsystem (issue 31's first
//! part): Identify gives its own CNTLID, says the subsystem may have more
//! controllers (CMIC bit 1) and marks every namespace shareable (NMIC bit 0), the
//! two things Linux's native multipath looks for before it joins two controllers'
//! paths to one namespace. The identity of a namespace (NGUID, EUI-64, UUID) comes
//! from the serial and NSID, so two controllers given the same serial agree on it.
//!
//! Such a controller also reports Asymmetric Namespace Access (Base §8.1.1): each
//! namespace's ANA group, the groups' states in the ANA log page, ANA Change
//! notices, and commands to a group that is not reachable refused with the path
//! error its state names, so the host uses another controller.

mod common;
mod io_common;

use std::sync::Arc;

use block_backend::{Backend, RamBackend};
use io_common::*;
use nvme_ctrl::{Controller, ControllerConfig, NamespaceConfig, SubsystemConfig};
use nvme_spec::admin::GetLogPageCmd;
use nvme_spec::ana::{AnaGroupDescriptor, AnaLogHeader, AnaState};
use nvme_spec::features::fid;
use nvme_spec::identify::{cmic, nmic, oaes, IdentifyController, IdentifyNamespace};
use nvme_spec::log::lid;
use nvme_spec::{Cqe, Status, NSID_ALL};
use test_kit::MockHost;
use zerocopy::little_endian::U32;
use zerocopy::FromBytes;

fn host(ram: &Arc<dyn Backend>, subsystem: Option<SubsystemConfig>) -> MockHost {
    let cfg = ControllerConfig {
        namespaces: vec![NamespaceConfig::new(ram.clone(), 0)],
        subsystem,
        serial: "SUBSYS01".into(),
        ..Default::default()
    };
    let mut h = MockHost::new(cfg, MEM);
    h.init(opts()).expect("bring-up");
    h
}

fn identify(h: &mut MockHost) -> (IdentifyController, IdentifyNamespace) {
    let c = IdentifyController::read_from_bytes(&h.identify(1, 0).unwrap()).unwrap();
    let n = IdentifyNamespace::read_from_bytes(&h.identify(0, 1).unwrap()).unwrap();
    (c, n)
}

#[test]
fn each_controller_of_a_subsystem_has_its_id_and_shares_the_namespace() {
    let ram: Arc<dyn Backend> = Arc::new(RamBackend::new(4 << 20));
    let mut one = host(&ram, Some(SubsystemConfig { cntlid: 1 }));
    let mut two = host(&ram, Some(SubsystemConfig { cntlid: 2 }));
    let (c1, n1) = identify(&mut one);
    let (c2, n2) = identify(&mut two);
    assert_eq!((c1.cntlid.get(), c2.cntlid.get()), (1, 2));
    let both = cmic::MULTI_CONTROLLER | cmic::ANA_REPORTING;
    assert_eq!((c1.cmic, c2.cmic), (both, both));
    assert_eq!((n1.nmic, n2.nmic), (nmic::SHARED, nmic::SHARED));
    // One subsystem, one namespace: the same NQN and identifiers through both.
    assert_eq!(c1.subnqn, c2.subnqn);
    assert_eq!((n1.nguid, n1.eui64), (n2.nguid, n2.eui64));
    // Data one writes, the other reads (here one RAM backend; across processes the
    // same file).
    let data = test_util::pattern(9, 4096);
    assert_eq!(one.write_blocks(1, 1, 8, 512, &data), nvme_spec::Status::SUCCESS);
    let buf = two.alloc.alloc_pages(1);
    let s = two.rw_sqe(READ, 1, 8, 8, (buf, 4096));
    assert_status(&two.io_cmd(1, s), nvme_spec::Status::SUCCESS, false);
    let mut got = vec![0u8; 4096];
    two.mem.read(buf, &mut got).unwrap();
    assert!(got == data);
}

#[test]
fn a_controller_alone_is_cntlid_0_and_its_namespaces_private() {
    let ram: Arc<dyn Backend> = Arc::new(RamBackend::new(4 << 20));
    let mut h = host(&ram, None);
    let (c, n) = identify(&mut h);
    assert_eq!((c.cntlid.get(), c.cmic, n.nmic), (0, 0, 0));
    // No ANA: no group, no log page, and the operator is told why.
    assert_eq!((n.anagrpid.get(), c.anacap, c.mnan.get(), c.oaes.get() & oaes::ANA_CHANGE), (0, 0, 0, 0));
    let (st, _) = h.get_log_raw(lid::ANA, NSID_ALL, 1023, 0, false);
    assert_eq!(st.code(), Status::INVALID_LOG_PAGE);
    let e = h.ctrl.set_ana_state(None, AnaState::Inaccessible).unwrap_err();
    assert!(e.to_string().contains("--cntlid"), "{e}");
    assert!(h.ctrl.ana_groups().is_empty());
}

/// A subsystem controller with namespace 1 in ANA group 1 and namespace 2 in group 3.
fn ana_cfg() -> ControllerConfig {
    let a: Arc<dyn Backend> = Arc::new(RamBackend::new(4 << 20));
    let b: Arc<dyn Backend> = Arc::new(RamBackend::new(4 << 20));
    ControllerConfig {
        namespaces: vec![
            NamespaceConfig::new(a, 0),
            NamespaceConfig { ana_group: Some(3), ..NamespaceConfig::new(b, 0) },
        ],
        subsystem: Some(SubsystemConfig { cntlid: 7 }),
        serial: "SUBSYS02".into(),
        max_namespaces: 8,
        ..Default::default()
    }
}

fn ana_host() -> MockHost {
    let mut h = MockHost::new(ana_cfg(), MEM);
    h.init(opts()).expect("bring-up");
    h
}

/// The ANA log page as a host reads it: the change count, then (group, group
/// change count, state, NSIDs) per descriptor.
/// One descriptor of the ANA log: group, its change count, state, NSIDs.
type Descriptor = (u32, u64, u8, Vec<u32>);

fn ana_log(h: &mut MockHost, lsp: u8, rae: bool) -> (u64, Vec<Descriptor>, Vec<Cqe>) {
    let mut c = GetLogPageCmd { nsid: NSID_ALL, lid: lid::ANA, lsp, rae, numd_z: 1023, ..Default::default() }
        .to_sqe();
    let buf = h.alloc.alloc_pages(1);
    c.set_prps(buf, 0);
    let (c, others) = h.admin_exec(c);
    assert_eq!(c.expect("get log page completed").status(), Status::SUCCESS);
    let mut page = vec![0u8; 4096];
    h.mem.read(buf, &mut page).unwrap();
    let (hdr, mut rest) = AnaLogHeader::read_from_prefix(&page).unwrap();
    let mut groups = Vec::new();
    for _ in 0..hdr.ngrps.get() {
        let (d, tail) = AnaGroupDescriptor::read_from_prefix(rest).unwrap();
        let n = d.nnsids.get() as usize;
        let nsids = tail[..4 * n].chunks(4).map(|b| u32::from_le_bytes(b.try_into().unwrap())).collect();
        groups.push((d.grpid.get(), d.change_count.get(), d.state, nsids));
        rest = &tail[4 * n..];
    }
    (hdr.change_count.get(), groups, others)
}

#[test]
fn a_subsystem_controller_reports_asymmetric_namespace_access() {
    let mut h = ana_host();
    let c = IdentifyController::read_from_bytes(&h.identify(1, 0).unwrap()).unwrap();
    assert_eq!(c.cmic & cmic::ANA_REPORTING, cmic::ANA_REPORTING, "CMIC bit 3");
    // Optimized, non-optimized, inaccessible, persistent loss and change states,
    // and a namespace's group fixed while it is attached.
    assert_eq!(c.anacap, 0b0101_1111);
    assert_eq!((c.anagrpmax.get(), c.nanagrpid.get(), c.anatt), (32, 32, 10));
    // Linux refuses ANA without MNAN set, at most NN.
    assert_eq!((c.mnan.get(), c.nn.get()), (8, 8));
    assert_eq!(c.oaes.get() & oaes::ANA_CHANGE, oaes::ANA_CHANGE);
    let grp = |h: &mut MockHost, nsid| {
        IdentifyNamespace::read_from_bytes(&h.identify(0, nsid).unwrap()).unwrap().anagrpid.get()
    };
    assert_eq!((grp(&mut h, 1), grp(&mut h, 2)), (1, 3));
    // The log: the two groups with namespaces, both optimized, in group order.
    let (count, groups, _) = ana_log(&mut h, 0, false);
    assert_eq!(count, 0);
    assert_eq!(groups, vec![(1, 0, 0x01, vec![1]), (3, 0, 0x01, vec![2])]);
    // Return Groups Only: the descriptors without their NSIDs.
    let (_, groups, _) = ana_log(&mut h, nvme_spec::ana::LSP_RETURN_GROUPS_ONLY, false);
    assert_eq!(groups, vec![(1, 0, 0x01, vec![]), (3, 0, 0x01, vec![])]);
    assert_eq!(
        h.ctrl.ana_groups(),
        vec![(1, AnaState::Optimized, vec![1]), (3, AnaState::Optimized, vec![2])]
    );
}

#[test]
fn a_group_made_inaccessible_refuses_its_commands_with_a_path_error_and_tells_the_host() {
    let mut h = ana_host();
    // The host asks for ANA Change notices (AEC bit 11) and leaves a request out.
    h.set_feature(fid::ASYNC_EVENT_CONFIG, 1 << 11).unwrap();
    let aer = h.submit_aer();
    let data = test_util::pattern(3, 4096);
    assert_eq!(h.write_blocks(1, 1, 0, 512, &data), Status::SUCCESS);
    assert_eq!(h.ctrl.set_ana_state(Some(1), AnaState::Inaccessible).unwrap(), vec![1]);
    // The notice: Notice type, ANA Change, log page 0Ch.
    let got = h.reap_admin();
    assert_eq!(got.len(), 1, "{got:?}");
    assert_eq!((got[0].cid.get(), got[0].dw0.get()), (aer, 2 | (0x03 << 8) | (0x0c << 16)));
    // Every command that accesses namespace 1 is refused: Asymmetric Access
    // Inaccessible, a path error (SCT 3h) without DNR, so the host retries it on
    // another controller.
    let buf = h.alloc.alloc_pages(1);
    for opcode in [READ, WRITE] {
        let s = h.rw_sqe(opcode, 1, 0, 8, (buf, 4096));
        let st = h.io_cmd(1, s).status();
        assert_eq!((st.code(), st.sct(), st.dnr()), (Status::ASYMMETRIC_ACCESS_INACCESSIBLE, 3, false));
    }
    let mut flush = MockHost::admin_sqe(0x00);
    flush.nsid = U32::new(1);
    assert_eq!(h.io_cmd(1, flush).status().code(), Status::ASYMMETRIC_ACCESS_INACCESSIBLE);
    // A broadcast Flush flushes what this controller reaches.
    flush.nsid = U32::new(NSID_ALL);
    assert_eq!(h.io_cmd(1, flush).status(), Status::SUCCESS);
    // Namespace 2, in group 3, goes on; the admin side answers for namespace 1.
    assert_eq!(h.write_blocks(1, 2, 0, 512, &data), Status::SUCCESS);
    assert!(h.identify(0, 1).is_ok());
    let (count, groups, _) = ana_log(&mut h, 0, false);
    assert_eq!(count, 1, "the log's change count moved");
    assert_eq!(groups, vec![(1, 1, 0x03, vec![1]), (3, 0, 0x01, vec![2])]);
    // The other refusals: persistent loss, and change (a transition).
    for (state, want) in [
        (AnaState::PersistentLoss, Status::ASYMMETRIC_ACCESS_PERSISTENT_LOSS),
        (AnaState::Change, Status::ASYMMETRIC_ACCESS_TRANSITION),
    ] {
        h.ctrl.set_ana_state(Some(1), state).unwrap();
        let s = h.rw_sqe(READ, 1, 0, 8, (buf, 4096));
        assert_eq!(h.io_cmd(1, s).status().code(), want, "{state:?}");
    }
    // Non-optimized still serves; back to optimized, the data is there.
    assert_eq!(h.ctrl.set_ana_state(None, AnaState::NonOptimized).unwrap(), vec![1, 3]);
    let s = h.rw_sqe(READ, 1, 0, 8, (buf, 4096));
    assert_eq!(h.io_cmd(1, s).status(), Status::SUCCESS);
    assert_eq!(h.ctrl.set_ana_state(None, AnaState::Optimized).unwrap(), vec![1, 3]);
    assert_eq!(h.ctrl.set_ana_state(None, AnaState::Optimized).unwrap(), Vec::<u32>::new(), "no change");
    let mut got = vec![0u8; 4096];
    let s = h.rw_sqe(READ, 1, 0, 8, (buf, 4096));
    assert_eq!(h.io_cmd(1, s).status(), Status::SUCCESS);
    h.mem.read(buf, &mut got).unwrap();
    assert!(got == data);
    assert!(h.ctrl.set_ana_state(Some(33), AnaState::Optimized).is_err(), "groups are 1 to 32");
}

/// An upgrade or a migration carries the groups' states: the guest was told them.
#[test]
fn ana_states_travel_with_the_controller_state() {
    let mut h = ana_host();
    h.ctrl.set_ana_state(Some(3), AnaState::Inaccessible).unwrap();
    h.ctrl.quiesce(std::time::Duration::from_secs(5)).unwrap();
    let saved = h.ctrl.save_state();
    let fresh = || Controller::new(ana_cfg(), h.mem.clone(), h.irq.clone()).unwrap();
    let mut c = fresh();
    c.restore_state(&saved).expect("restore");
    assert_eq!(c.ana_groups(), vec![(1, AnaState::Optimized, vec![1]), (3, AnaState::Inaccessible, vec![2])]);
    // A state naming a group a controller does not have is refused whole.
    let mut bad = saved.clone();
    bad.ana.groups.push((40, 1, 0));
    let e = fresh().restore_state(&bad).unwrap_err();
    assert!(e.to_string().contains("ANA group 40"), "{e}");
}
