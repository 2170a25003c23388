//! What the controller counts per namespace (commands, bytes, errors and latency by
//! kind) and per queue (commands, doorbells, completions, interrupts): the figures
//! `vnvme ctl stats.get` and the Prometheus metrics report.

mod common;

use common::*;
use nvme_spec::opcode::nvm as iop;
use nvme_spec::Status;
use test_kit::{InitOptions, MockHost};

#[test]
fn namespace_and_queue_counters_follow_the_commands() {
    let (cfg, _) = ram_cfg(1);
    let mut h = MockHost::new(cfg, MEM);
    h.init(InitOptions { io_queues: 2, queue_size: 64, shadow_doorbells: false, ..Default::default() })
        .unwrap();
    let data = test_util::pattern(1, 4096);
    for i in 0..5 {
        assert_eq!(h.write_blocks(1, 1, i * 8, 512, &data), Status::SUCCESS);
    }
    for i in 0..3 {
        assert_eq!(h.read_blocks(2, 1, i * 8, 8, 512).0, Status::SUCCESS);
    }
    // Past the end: an error, counted as a read with no bytes.
    assert_eq!(h.read_blocks(2, 1, NS_BYTES / 512, 1, 512).0, Status::LBA_OUT_OF_RANGE.with_dnr());
    let c = h.io_cmd(1, MockHost::lba_sqe(iop::FLUSH, 1, 0, 1));
    assert_eq!(c.status(), Status::SUCCESS);

    let s = h.ctrl.namespace(1).unwrap().stats.snapshot();
    assert_eq!((s.write.commands, s.write.bytes, s.write.errors), (5, 5 * 4096, 0));
    assert_eq!((s.read.commands, s.read.bytes, s.read.errors), (4, 3 * 4096, 1));
    assert_eq!((s.flush.commands, s.other.commands), (1, 0));
    for op in [s.read, s.write, s.flush] {
        assert_eq!(op.latency.iter().sum::<u64>(), op.commands, "every command lands in one bucket");
    }

    let q = h.ctrl.queue_snapshots();
    let qids: Vec<u16> = q.iter().map(|q| q.qid).collect();
    assert_eq!(qids, vec![0, 1, 2]);
    assert_eq!((q[1].commands, q[1].completions), (6, 6), "5 writes and a flush on queue 1");
    assert_eq!((q[2].commands, q[2].completions), (4, 4));
    assert!(q[1].sq_doorbell_writes >= 6 && q[1].cq_doorbell_writes >= 1, "{:?}", q[1]);
    assert!(q[0].commands > 0, "the admin queue counts too");
    assert_eq!(q[1].worker, None, "inline: the controller's own engine");
}
