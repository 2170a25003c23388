//! A controller built without Doorbell Buffer Config: the baseline that shows what
//! shadow doorbells save.

use std::sync::Arc;

use block_backend::NullBackend;
use nvme_ctrl::{ControllerConfig, NamespaceConfig};
use nvme_spec::admin::DoorbellBufferConfigCmd;
use nvme_spec::Status;
use test_kit::{InitOptions, MockHost};

#[test]
fn spec_5_2_5_without_dbbuf_oacs_bit_8_is_clear_and_the_command_is_invalid() {
    let cfg = ControllerConfig {
        namespaces: vec![NamespaceConfig::new(Arc::new(NullBackend::new(1 << 20)), 0)],
        shadow_doorbells: false,
        ..Default::default()
    };
    let mut h = MockHost::new(cfg, 16 << 20);
    h.init(InitOptions { io_queues: 1, ..Default::default() }).unwrap();
    let id = h.identify(0x01, 0).unwrap();
    let oacs = u16::from_le_bytes([id[256], id[257]]);
    assert_eq!(oacs & (1 << 8), 0, "OACS must not advertise Doorbell Buffer Config");
    assert!(h.dbbuf.is_none(), "a Linux-like host does not send it");
    let page = h.alloc.alloc_pages(2);
    let c = DoorbellBufferConfigCmd { shadow_doorbell: page, eventidx: page + 4096 };
    let cqe = h.admin_cmd(c.to_sqe()).unwrap();
    assert_eq!(cqe.status().code(), Status::INVALID_OPCODE);
    // Every doorbell traps: one SQ tail write per command at QD 1.
    let before = h.ctrl.stats();
    let buf = h.alloc.alloc_pages(1);
    for lba in 0..10 {
        let s = h.rw_sqe(0x02, 1, lba, 1, (buf, 512));
        assert!(h.io_cmd(1, s).status().is_success());
    }
    let d = h.ctrl.stats() - before;
    assert_eq!(d.io_doorbell_writes, 20, "SQ tail and CQ head per command");
}
