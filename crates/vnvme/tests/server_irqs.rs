//! `vnvme serve` across two processes over a real socket: DEVICE_SET_IRQS (MSI-X
//! eventfds, validation) and DEVICE_RESET.
//!
//! Every test starts its own server process and checks at the end that it is still
//! alive and serving.

mod common;

use std::time::Duration;

use common::nvme_host::NvmeOverVfioUser;
use common::protocol::*;
use common::*;
use vfio_user::client::Client;
use vfio_user::proto::*;
use zerocopy::little_endian::U32;
use zerocopy::IntoBytes;

// ---- interrupts

fn set_irqs(flags: u32, index: u32, start: u32, count: u32) -> SetIrqs {
    SetIrqs {
        argsz: U32::new(20),
        flags: U32::new(flags),
        index: U32::new(index),
        start: U32::new(start),
        count: U32::new(count),
    }
}

#[test]
fn set_irqs_refuses_bad_flags_indices_ranges_and_stray_fds() {
    let mut server = Server::start();
    let mut c = server.client();
    let e1 = TestEventFd::new();
    let e2 = TestEventFd::new();
    let trig = IRQ_SET_ACTION_TRIGGER;
    let cases: Vec<(&str, SetIrqs, Vec<i32>)> = vec![
        ("no data type", set_irqs(trig, IRQ_INDEX_MSIX, 0, 1), vec![]),
        ("no action", set_irqs(IRQ_SET_DATA_NONE, IRQ_INDEX_MSIX, 0, 1), vec![]),
        (
            "two data types",
            set_irqs(IRQ_SET_DATA_NONE | IRQ_SET_DATA_EVENTFD | trig, IRQ_INDEX_MSIX, 0, 1),
            vec![],
        ),
        (
            "two actions",
            set_irqs(IRQ_SET_DATA_NONE | trig | IRQ_SET_ACTION_MASK, IRQ_INDEX_MSIX, 0, 1),
            vec![],
        ),
        ("unknown flag bit", set_irqs(IRQ_SET_DATA_NONE | trig | 0x40, IRQ_INDEX_MSIX, 0, 1), vec![]),
        ("index 9", set_irqs(IRQ_SET_DATA_EVENTFD | trig, 9, 0, 1), vec![e1.raw()]),
        ("index u32::MAX", set_irqs(IRQ_SET_DATA_NONE | trig, u32::MAX, 0, 1), vec![]),
        (
            "start + count beyond the vectors",
            set_irqs(IRQ_SET_DATA_EVENTFD | trig, IRQ_INDEX_MSIX, 64, 2),
            vec![e1.raw(), e2.raw()],
        ),
        ("start beyond the vectors", set_irqs(IRQ_SET_DATA_NONE | trig, IRQ_INDEX_MSIX, 65, 1), vec![]),
        ("start + count overflows", set_irqs(IRQ_SET_DATA_NONE | trig, IRQ_INDEX_MSIX, u32::MAX, 2), vec![]),
        (
            "INTx has one vector",
            set_irqs(IRQ_SET_DATA_EVENTFD | trig, IRQ_INDEX_INTX, 0, 2),
            vec![e1.raw(), e2.raw()],
        ),
        ("MSI has no vectors", set_irqs(IRQ_SET_DATA_EVENTFD | trig, IRQ_INDEX_MSI, 0, 1), vec![e1.raw()]),
        ("fds with DATA_NONE", set_irqs(IRQ_SET_DATA_NONE | trig, IRQ_INDEX_MSIX, 0, 1), vec![e1.raw()]),
        ("fds with DATA_BOOL", set_irqs(IRQ_SET_DATA_BOOL | trig, IRQ_INDEX_MSIX, 0, 1), vec![e1.raw()]),
        (
            "fd count differs from count",
            set_irqs(IRQ_SET_DATA_EVENTFD | trig, IRQ_INDEX_MSIX, 0, 2),
            vec![e1.raw()],
        ),
    ];
    let mut id = 0x7000;
    for (what, s, fds) in &cases {
        id += 1;
        let payload: Vec<u8> = if s.flags.get() & IRQ_SET_DATA_BOOL != 0 {
            [s.as_bytes(), &[1u8]].concat()
        } else {
            s.as_bytes().to_vec()
        };
        let m = request(c.connection(), id, SET_IRQS, &[&payload], fds);
        assert!(is_error(&m) && m.header.error.get() != 0, "SET_IRQS with {what} was accepted");
    }
    id += 1;
    expect_error(c.connection(), id, SET_IRQS, &[&[0u8; 12]], &[]);
    // The refusals installed nothing: a software trigger of vector 0 reaches no fd.
    id += 1;
    let m = request(
        c.connection(),
        id,
        SET_IRQS,
        &[set_irqs(IRQ_SET_DATA_NONE | trig, IRQ_INDEX_MSIX, 0, 1).as_bytes()],
        &[],
    );
    assert!(!is_error(&m));
    assert_eq!(e1.take() + e2.take(), 0);
    // A valid request still works on the same connection.
    c.set_irq_eventfds(IRQ_INDEX_MSIX, 64, &[e1.fd()]).unwrap();
    server.assert_alive();
}

#[test]
fn msix_eventfd_is_signalled_by_a_software_trigger_and_not_after_deassign() {
    let mut server = Server::start();
    let mut c = server.client();
    let v3 = TestEventFd::new();
    let v4 = TestEventFd::new();
    c.set_irq_eventfds(IRQ_INDEX_MSIX, 3, &[v3.fd(), v4.fd()]).unwrap();
    let trigger = |c: &mut Client, id: u16, start: u32, count: u32| {
        let s = set_irqs(IRQ_SET_DATA_NONE | IRQ_SET_ACTION_TRIGGER, IRQ_INDEX_MSIX, start, count);
        let m = request(c.connection(), id, SET_IRQS, &[s.as_bytes()], &[]);
        assert!(!is_error(&m), "software trigger refused: errno {}", m.header.error.get());
    };
    trigger(&mut c, 0x7100, 3, 1);
    assert_eq!(v3.wait(TIMEOUT), 1, "vector 3 fired once");
    assert_eq!(v4.take(), 0, "vector 4 was not triggered");
    trigger(&mut c, 0x7101, 3, 2);
    assert_eq!(v3.wait(TIMEOUT), 1);
    assert_eq!(v4.wait(TIMEOUT), 1);
    // De-assign vector 3 (DATA_EVENTFD without fds), then trigger it: nothing arrives.
    let s = set_irqs(IRQ_SET_DATA_EVENTFD | IRQ_SET_ACTION_TRIGGER, IRQ_INDEX_MSIX, 3, 1);
    let m = request(c.connection(), 0x7102, SET_IRQS, &[s.as_bytes()], &[]);
    assert!(!is_error(&m));
    trigger(&mut c, 0x7103, 3, 2);
    assert_eq!(v4.wait(TIMEOUT), 1);
    assert_eq!(v3.take(), 0, "a de-assigned vector must not fire its old eventfd");
    // Disable the whole index (count 0, DATA_NONE): vector 4 goes quiet too.
    let m = request(
        c.connection(),
        0x7104,
        SET_IRQS,
        &[set_irqs(IRQ_SET_DATA_NONE | IRQ_SET_ACTION_TRIGGER, IRQ_INDEX_MSIX, 0, 0).as_bytes()],
        &[],
    );
    assert!(!is_error(&m));
    trigger(&mut c, 0x7105, 4, 1);
    std::thread::sleep(Duration::from_millis(50));
    assert_eq!(v4.take(), 0);
    server.assert_alive();
}

// ---- reset

#[test]
fn device_reset_returns_the_controller_to_its_power_on_state() {
    let mut server = Server::start();
    let mut h = NvmeOverVfioUser::new(server.client());
    h.bring_up(16, false);
    h.write_read_verify(0, 4, 1);
    assert_eq!(h.read32(nvme_spec::regs::offset::CSTS) & 1, 1);
    h.client.reset().unwrap();
    use nvme_spec::regs::offset;
    assert_eq!(h.read32(offset::CSTS), 0, "CSTS after DEVICE_RESET");
    assert_eq!(h.read32(offset::CC), 0, "CC after DEVICE_RESET");
    assert_eq!(h.read32(offset::AQA), 0, "AQA after DEVICE_RESET");
    assert_eq!(h.read64(offset::ASQ), 0, "ASQ after DEVICE_RESET");
    // The DMA map survives a device reset: bring-up works again without re-mapping,
    // and the data written before the reset is still there (the namespace persists).
    h.bring_up(16, false);
    h.write_read_verify(64, 4, 2);
    server.assert_alive();
}
