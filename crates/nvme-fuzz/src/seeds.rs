//! Hand-built corpus seeds: short programs a fuzzer would take long to find, each a
//! Linux-like bring-up followed by one theme. `crates/nvme-fuzz/corpus/` holds their
//! encodings (a test checks the files match; `fuzz-run --write-seeds DIR` rewrites
//! them after a change to the program format).

use crate::program::{
    Action, AdminCmd, Burst, CcOp, ClockAdvance, CreatePair, Doorbell, Drain, InitSpec, IoCmd, MemoryOp,
    Mutation, NsSpec, Process, Program, RawAdmin, RawIo, RawSqe, ReadReg, Reap, RegWrite, RingWrite,
    Scribble, Setup, ShadowWrite,
};

/// Two RAM namespaces (512 B LBAs; 4 KiB LBAs with 8 bytes of type 1 protection
/// information) and a null one; MDTS 256 KiB.
fn setup(io_queues: u8, queue_size: u8, shadow: bool) -> Setup {
    Setup {
        ns_count: 2,
        ns: [
            NsSpec { kind: 0, mib: 3, lba_format: 0 },
            NsSpec { kind: 0, mib: 1, lba_format: 4 | 1 << 3 | 1 << 5 },
            NsSpec { kind: 1, mib: 7, lba_format: 0 },
        ],
        max_io_queues: 7,
        msix_vectors: 8,
        dstrd: 0,
        mdts: 5,
        mqes_z: 1022,
        aerl_z: 3,
        do_init: 1,
        init: InitSpec {
            io_queues: io_queues - 1,
            queue_size: queue_size - 2,
            admin_size: 30,
            flags: 2 | shadow as u8,
        },
    }
}

/// I/O command `op` on `queue` at `slba` (`nlb`: `IoCmd::nlb`), its other fields
/// as `more` has them (`PLAIN`: all zero).
fn io(queue: u8, op: u8, slba: u32, nlb: u16, more: IoCmd) -> Action {
    Action::Io(IoCmd { queue, op, slba, nlb, ..more })
}

const PLAIN: IoCmd = IoCmd {
    queue: 0,
    op: 0,
    nsid: 0,
    slba: 0,
    nlb: 0,
    buf: 0,
    flags: 0,
    mutation: Mutation { kind: 0, value: 0 },
};

fn admin(op: u8, a: u32, b: u32, c: u32) -> Action {
    Action::Admin(AdminCmd { op, a, b, c, mutation: Mutation::default() })
}

const REAP_ALL: Action = Action::Reap(Reap { queue: 255 });
const DRAIN: Action = Action::Drain(Drain { rounds: 3 });

fn process(n: u8) -> Action {
    Action::Process(Process { n })
}

/// The seeds, by file name.
pub fn seeds() -> Vec<(&'static str, Program)> {
    vec![
        (
            // Reads and writes with every data pointer form, through shadow doorbells.
            "seed-rw-shadow",
            Program {
                setup: setup(2, 16, true),
                actions: vec![
                    io(0, 1, 100, 7, PLAIN),                                 // write, PRP, 8 blocks
                    io(1, 0, 100, 7, IoCmd { buf: 128, flags: 1, ..PLAIN }), // read, one SGL data block
                    io(0, 2, 100, 7, IoCmd { flags: 2 | 16, ..PLAIN }),      // compare, SGL last segment of 3
                    io(1, 0, 3, 40, IoCmd { nsid: 1, buf: 1000, flags: 3, ..PLAIN }), // read 4 KiB LBAs, SGL segment chain
                    io(0, 1, 9, 62, IoCmd { nsid: 1, buf: 77, flags: 8 | 3 << 4, ..PLAIN }), // write, PRP list chaining at page end
                    process(1),
                    REAP_ALL,
                    io(1, 3, 0, 31, PLAIN),                                // verify
                    io(0, 4, 5, 3, IoCmd { flags: 8, ..PLAIN }),           // write zeroes, deallocate
                    io(1, 6, 0x0102_0304, 3, IoCmd { flags: 4, ..PLAIN }), // DSM deallocate
                    io(0, 7, 0, 0, PLAIN),                                 // flush all namespaces
                    DRAIN,
                ],
            },
        ),
        (
            // The same without shadow doorbells: every update is a trapped write.
            "seed-rw-mmio-burst",
            Program {
                setup: setup(3, 8, false),
                actions: vec![
                    Action::Burst(Burst { queue: 0, n: 6, op: 1, seed: 7 }),
                    Action::Burst(Burst { queue: 2, n: 6, op: 0, seed: 9 }),
                    process(0),
                    Action::Reap(Reap { queue: 1 }),
                    Action::Burst(Burst { queue: 1, n: 6, op: 2, seed: 11 }),
                    DRAIN,
                ],
            },
        ),
        (
            // Doorbells: repeated rings of current values, then bad queue ids and values.
            "seed-doorbells",
            Program {
                setup: setup(2, 8, true),
                actions: vec![
                    admin(8, 0, 0, 0), // an Asynchronous Event Request to receive errors
                    io(0, 1, 0, 1, PLAIN),
                    Action::Doorbell(Doorbell { qid: 1, kind: 0x10, value: 0 }),
                    Action::Doorbell(Doorbell { qid: 2, kind: 0x11, value: 0 }),
                    process(2),
                    REAP_ALL,
                    DRAIN,
                    Action::Doorbell(Doorbell { qid: 1, kind: 0, value: 200 }),
                    Action::Doorbell(Doorbell { qid: 9, kind: 1, value: 1 }),
                    Action::Doorbell(Doorbell { qid: 0xffff, kind: 2, value: 3 }),
                    Action::Doorbell(Doorbell { qid: 1, kind: 4, value: 1 }),
                    Action::Shadow(ShadowWrite { qid: 1, which: 0, value: 5 }),
                    Action::Shadow(ShadowWrite { qid: 1, which: 3, value: 2 }),
                    process(3),
                    REAP_ALL,
                    admin(1, 0, 15, 0), // Error Information log
                    DRAIN,
                ],
            },
        ),
        (
            // Admin commands: identify, logs, features, queue management, format.
            "seed-admin",
            Program {
                setup: setup(1, 4, false),
                actions: vec![
                    admin(10, 0, 0, 0), // Doorbell Buffer Config before any I/O, as Linux
                    admin(0, 1, 0, 0),
                    admin(0, 0, 0, 0),
                    admin(0, 2, 0, 0),
                    admin(0, 3, 0, 0),
                    admin(1, 1, 1023, 0),
                    admin(1, 2, 127, 0),
                    admin(1, 4, 1023, 0),
                    admin(2, 10, 0, 0),
                    admin(3, 6, 0, 0x0003_0003),
                    admin(3, 10, 0, 1),
                    admin(4, 4, 31, 0x0002_0002),
                    admin(5, 4, 31, 4),
                    admin(6, 4, 0, 0),
                    admin(7, 4, 0, 0),
                    admin(9, 0x0001_0001, 0, 0),
                    admin(12, 1, 1, 0),
                    DRAIN,
                    io(0, 1, 0, 3, IoCmd { nsid: 1, ..PLAIN }),
                    Action::CreatePair(CreatePair { qid: 4, size: 10, ien: 1 }),
                    DRAIN,
                ],
            },
        ),
        (
            // Shutdown, a Linux-like reset and re-enable, bring-up again, abrupt shutdown.
            "seed-reset-shutdown",
            Program {
                setup: setup(2, 10, true),
                actions: vec![
                    io(0, 1, 1, 3, PLAIN),
                    Action::Cc(CcOp { op: 2, value: 0 }),
                    Action::ReadReg(ReadReg { off: 0x1c, size: 0 }),
                    REAP_ALL,
                    Action::Cc(CcOp { op: 7, value: 0 }),
                    Action::Cc(CcOp { op: 5, value: 0 }),
                    Action::Init(InitSpec { io_queues: 1, queue_size: 20, admin_size: 10, flags: 1 }),
                    io(1, 0, 1, 3, PLAIN),
                    Action::Clock(ClockAdvance { us: 300 }),
                    Action::Cc(CcOp { op: 3, value: 0 }),
                    DRAIN,
                    Action::Reg(RegWrite { reg: 0, size: 0, value: 0 }),
                    Action::Cc(CcOp { op: 6, value: 14 }),
                    DRAIN,
                ],
            },
        ),
        (
            // Doorbell Buffer Config after I/O went through MMIO doorbells (Linux sends
            // it before any I/O): the zeroed shadow tail must not be adopted, or the
            // controller re-executes stale SQ entries (it once did).
            "seed-late-dbbuf",
            Program {
                setup: setup(2, 8, false),
                actions: vec![
                    Action::Burst(Burst { queue: 0, n: 4, op: 1, seed: 5 }),
                    Action::Burst(Burst { queue: 1, n: 6, op: 0, seed: 6 }),
                    DRAIN,
                    admin(10, 0, 0, 0),
                    Action::Burst(Burst { queue: 0, n: 5, op: 1, seed: 7 }),
                    Action::Burst(Burst { queue: 1, n: 3, op: 0, seed: 8 }),
                    DRAIN,
                ],
            },
        ),
        (
            // DMA unmap and remap while I/O runs.
            "seed-memory-map",
            Program {
                setup: setup(1, 8, true),
                actions: vec![
                    Action::Memory(MemoryOp { op: 1, a: 65, b: 200 }),
                    io(0, 1, 0, 3, PLAIN),
                    io(0, 0, 0, 3, PLAIN),
                    DRAIN,
                    Action::Memory(MemoryOp { op: 3, a: 100, b: 0 }),
                    io(0, 0, 0, 3, PLAIN),
                    DRAIN,
                    Action::Memory(MemoryOp { op: 2, a: 900, b: 0 }),
                    io(0, 0, 0, 3, PLAIN),
                    process(1),
                    Action::Memory(MemoryOp { op: 4, a: 0, b: 0 }),
                    DRAIN,
                ],
            },
        ),
        (
            // Random SQEs, ring and memory scribbles: nothing may panic.
            "seed-chaos",
            Program {
                setup: setup(2, 6, true),
                actions: vec![
                    Action::AdminRaw(RawAdmin { sqe: RawSqe([0xa5; 64]) }),
                    Action::IoRaw(RawIo { queue: 0, sqe: RawSqe([0x01; 64]) }),
                    Action::Ring(RingWrite { queue: 1, which: 0, index: 3, bytes: [0xff; 16] }),
                    Action::Ring(RingWrite { queue: 1, which: 1, index: 0, bytes: [0x01; 16] }),
                    Action::Scribble(Scribble { addr: 0x0000_0000_0350_0004, len: 40, seed: 3 }),
                    process(4),
                    REAP_ALL,
                    Action::Io(IoCmd {
                        queue: 1,
                        op: 0,
                        nsid: 0,
                        slba: 0,
                        nlb: 15,
                        buf: 0,
                        flags: 0,
                        mutation: Mutation { kind: 12, value: 0x0000_0000_0000_0004 },
                    }),
                    DRAIN,
                ],
            },
        ),
    ]
}
