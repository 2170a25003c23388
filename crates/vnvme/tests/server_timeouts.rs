//! A backend that never answers cannot wedge `vnvme serve`: with every read hung
//! (`fault=read/hang`) and a 500 ms command timeout, the userspace driver in this
//! process sees each read complete with Internal Error, writes keep working, and a
//! client that disconnects with a read still hung leaves a server the next client can
//! use. Every wait is bounded.

mod common;

use common::{opts, Server};
use nvme_driver::{CompletionMode, DoorbellMode, IoCommand, IoQueue};
use nvme_spec::Status;
use test_util::pattern;

const NS: &str = "ram:16M:fault=read/hang:timeout=500ms";

fn read(q: &mut IoQueue, slba: u64) -> u16 {
    let buf = q.alloc_buf(4096).expect("buffer");
    q.submit(IoCommand::Read { nsid: 1, slba, nlb: 8, buf }).expect("submit read")
}

fn write(q: &mut IoQueue, slba: u64) -> Status {
    let buf = q.alloc_buf(4096).expect("buffer");
    buf.write_at(0, &pattern(slba, 4096)).unwrap();
    q.submit(IoCommand::Write { nsid: 1, slba, nlb: 8, buf, fua: false }).expect("submit write");
    let mut done = Vec::new();
    while done.is_empty() {
        q.wait_completions(&mut done).expect("completion");
    }
    done[0].status
}

#[test]
fn hung_reads_time_out_with_internal_error_and_writes_go_on() {
    let server = Server::start_with(&["--ns", NS]);
    let mut d = server.driver(DoorbellMode::Trapped, opts(1, true, CompletionMode::Interrupts));
    let q = d.queue(1).unwrap();
    for round in 0..2u64 {
        // The hung read's tag is retired, never reused: the second round's read
        // times out the same way.
        let cid = read(q, round * 8);
        assert!(write(q, 64 + round * 8).is_success(), "writes are served while a read hangs");
        let mut done = Vec::new();
        while done.is_empty() {
            q.wait_completions(&mut done).unwrap_or_else(|e| panic!("{e}\n{}", server.log()));
        }
        assert_eq!(done[0].cid, cid);
        let st = done[0].status;
        assert_eq!(st.code(), Status::INTERNAL_ERROR.code(), "{st:?}");
        assert!(!st.dnr(), "the host may retry a timed-out command");
    }
    let stats = server.stats_after(4);
    assert_eq!(stats["timeouts"].as_u64(), Some(2), "{stats}");
}

#[test]
fn a_client_leaving_with_a_read_hung_does_not_wedge_the_server() {
    let mut server = Server::start_with(&["--ns", NS]);
    {
        let mut d = server.driver(DoorbellMode::Trapped, opts(1, true, CompletionMode::Interrupts));
        let q = d.queue(1).unwrap();
        read(q, 0);
        // Dropped with the read in flight: the server resets the device.
    }
    server.assert_alive();
    let mut d = server.driver(DoorbellMode::Trapped, opts(1, true, CompletionMode::Interrupts));
    assert!(write(d.queue(1).unwrap(), 8).is_success(), "{}", server.log());
    server.assert_alive();
}

/// An erasing Format on a backend that never answers: the server keeps answering its
/// client (register reads, other admin commands, I/O) while the Format waits, and the
/// Format fails with Internal Error at the namespace timeout. Inline and with a
/// worker (the admin queue runs on the server's thread in both).
#[test]
fn an_erasing_format_on_a_hung_backend_does_not_block_the_server() {
    for workers in ["0", "1"] {
        let mut server = Server::start_with(&[
            "--ns",
            "ram:16M:fault=discard/hang:timeout=2s",
            "--workers",
            workers,
            "--client-deadline",
            "1s",
        ]);
        let mut h = common::nvme_host::NvmeOverVfioUser::new(server.client());
        h.bring_up(16, false);
        let mut f = nvme_spec::Sqe::with_opcode(nvme_spec::opcode::admin::FORMAT_NVM);
        f.nsid = zerocopy::little_endian::U32::new(1);
        f.cdw10 = zerocopy::little_endian::U32::new(1 << 9); // SES = user data erase
        let format = h.admin_submit(f);
        // Well past the client deadline, the server still answers at once: a
        // blocked server thread would have got this client evicted.
        for _ in 0..30 {
            h.read32(nvme_spec::regs::offset::CSTS);
            h.write_read_verify(0, 2, 3);
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
        let c = h.admin_wait();
        assert_eq!(c.cid.get(), format);
        assert_eq!(c.status().code(), Status::INTERNAL_ERROR.code(), "{:?}\n{}", c.status(), server.log());
        assert!(!server.log().contains("evicted"), "{}", server.log());
        server.assert_alive();
    }
}
