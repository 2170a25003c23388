//! A controller that is one of several in its NVM subsystem (issue 31's first
//! part): Identify gives its own CNTLID, says the subsystem may have more
//! controllers (CMIC bit 1) and marks every namespace shareable (NMIC bit 0), the
//! two things Linux's native multipath looks for before it joins two controllers'
//! paths to one namespace. The identity of a namespace (NGUID, EUI-64, UUID) comes
//! from the serial and NSID, so two controllers given the same serial agree on it.

mod common;
mod io_common;

use std::sync::Arc;

use block_backend::{Backend, RamBackend};
use io_common::*;
use nvme_ctrl::{ControllerConfig, NamespaceConfig, SubsystemConfig};
use nvme_spec::identify::{cmic, nmic, IdentifyController, IdentifyNamespace};
use test_kit::MockHost;
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
    assert_eq!((c1.cmic, c2.cmic), (cmic::MULTI_CONTROLLER, cmic::MULTI_CONTROLLER));
    assert_eq!((n1.nmic, n2.nmic), (nmic::SHARED, nmic::SHARED));
    // One subsystem, one namespace: the same NQN and identifiers through both.
    assert_eq!(c1.subnqn, c2.subnqn);
    assert_eq!((n1.nguid, n1.eui64), (n2.nguid, n2.eui64));
    // Data one writes, the other reads (here one RAM backend; across processes the
    // same file).
    let data = test_util::pattern(9, 4096);
    assert_eq!(one.write_blocks(1, 1, 8, 512, &data), nvme_spec::Status::SUCCESS);
    let buf = two.alloc.alloc_pages(1);
    let s = two.rw_sqe(READ, 1, 8, 8, buf, 4096);
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
}
