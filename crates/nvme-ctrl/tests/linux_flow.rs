//! The controller driven the way Linux drives it: bring-up, shadow doorbells after the
//! queues exist, I/O at queue depths 1 to 64, data read back identical.

use std::sync::Arc;

use block_backend::RamBackend;
use nvme_ctrl::{ControllerConfig, NamespaceConfig};
use nvme_spec::opcode::nvm as iop;
use nvme_spec::Status;
use test_kit::{InitOptions, MockHost, PAGE};
use test_util::pattern;

fn ram_host(size: u64, lba_format: u8) -> (MockHost, RamBackend) {
    let ram = RamBackend::new(size);
    let cfg = ControllerConfig {
        namespaces: vec![NamespaceConfig::new(Arc::new(ram.clone()), lba_format)],
        ..Default::default()
    };
    (MockHost::new(cfg, 256 << 20), ram)
}

#[test]
fn linux_bring_up_enables_shadow_doorbells() {
    let (mut h, _) = ram_host(64 << 20, 0);
    h.init(InitOptions::default()).unwrap();
    assert!(h.dbbuf.is_some(), "OACS advertises Doorbell Buffer Config, so the host used it");
    let id = h.identify(0x01, 0).unwrap();
    assert_eq!(&id[4..13], b"VNVME0001");
    let oacs = u16::from_le_bytes([id[256], id[257]]);
    assert_ne!(oacs & (1 << 8), 0);
    let ns = h.identify(0x00, 1).unwrap();
    let nsze = u64::from_le_bytes(ns[0..8].try_into().unwrap());
    assert_eq!(nsze, (64 << 20) / 512);
}

#[test]
fn random_data_reads_back_identical_at_every_queue_depth() {
    let (mut h, ram) = ram_host(64 << 20, 0);
    h.init(InitOptions { io_queues: 4, queue_size: 128, ..Default::default() }).unwrap();
    let lba = 512u32;
    for (i, qd) in [1u32, 2, 4, 16, 64].into_iter().enumerate() {
        let qid = (i % 4) as u16 + 1;
        // Submit `qd` writes of varying sizes before letting the device run.
        let mut expect = Vec::new();
        let mut cids = Vec::new();
        for j in 0..qd {
            let nlb = 1 + (j * 7 % 64);
            let slba = (i as u64 * 10_000) + j as u64 * 64;
            let data = pattern(slba * 31 + qd as u64, (nlb * lba) as usize);
            let buf = h.alloc.alloc(data.len() as u64, 4);
            h.mem.write(buf, &data).unwrap();
            let s = h.rw_sqe(iop::WRITE, 1, slba, nlb, (buf, data.len() as u64));
            cids.push(h.submit(qid, s).unwrap());
            expect.push((slba, data));
        }
        let mut done = 0;
        while done < qd {
            h.process();
            for c in h.reap_queue(qid) {
                assert_eq!(c.status(), Status::SUCCESS, "qd {qd} cid {}", c.cid.get());
                done += 1;
            }
        }
        for (slba, data) in &expect {
            let mut back = vec![0u8; data.len()];
            ram.read_at(slba * lba as u64, &mut back).unwrap();
            assert!(back == *data, "backend holds what was written at {slba}");
            let (st, via_read) = h.read_blocks(qid, 1, *slba, data.len() as u32 / lba, lba);
            assert_eq!(st, Status::SUCCESS);
            assert!(via_read == *data, "read returns what was written at {slba}");
        }
    }
}

#[test]
fn large_transfers_use_chained_prp_lists() {
    let (mut h, _) = ram_host(64 << 20, 1);
    h.init(InitOptions::default()).unwrap();
    // 1 MiB (MDTS) starting at an offset inside a page: PRP1 with offset + a PRP list.
    let data = pattern(7, 1 << 20);
    let buf = h.alloc.alloc((1 << 20) + PAGE, PAGE) + 512;
    h.mem.write(buf, &data).unwrap();
    let s = h.rw_sqe(iop::WRITE, 1, 10, 256, (buf, data.len() as u64));
    assert_eq!(h.io_cmd(1, s).status(), Status::SUCCESS);
    let (st, back) = h.read_blocks(2, 1, 10, 256, 4096);
    assert_eq!(st, Status::SUCCESS);
    assert!(back == data);
}

#[test]
fn shadow_doorbells_cut_trapped_writes() {
    let run = |shadow: bool, qd: u32| -> f64 {
        let (mut h, _) = ram_host(16 << 20, 0);
        h.init(InitOptions { io_queues: 1, queue_size: 256, shadow_doorbells: shadow, ..Default::default() })
            .unwrap();
        let buf = h.alloc.alloc_pages(1);
        let before = h.ctrl.stats();
        let total = 2048u32;
        let mut submitted = 0;
        let mut completed = 0;
        while submitted < qd {
            let s = h.rw_sqe(iop::READ, 1, submitted as u64, 1, (buf, 512));
            h.submit(1, s).unwrap();
            submitted += 1;
        }
        while completed < total {
            h.process();
            let got = h.reap_queue(1);
            for c in &got {
                assert!(c.status().is_success());
            }
            completed += got.len() as u32;
            for _ in 0..got.len() {
                if submitted < total {
                    let s = h.rw_sqe(iop::READ, 1, (submitted % 1000) as u64, 1, (buf, 512));
                    h.submit(1, s).unwrap();
                    submitted += 1;
                }
            }
        }
        let d = h.ctrl.stats() - before;
        assert_eq!(d.io_commands, total as u64);
        d.io_doorbell_writes as f64 / total as f64
    };
    for qd in [1, 4, 16, 64] {
        let without = run(false, qd);
        let with = run(true, qd);
        assert!(without >= 1.0, "without shadow doorbells every submission traps (qd {qd}: {without})");
        assert!(with < without, "shadow doorbells trap less (qd {qd}: {with} vs {without})");
        if qd >= 16 {
            assert!(with < 0.1, "qd {qd}: {with} trapped writes per command");
        }
    }
}
