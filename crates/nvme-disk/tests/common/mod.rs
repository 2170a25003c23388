//! The downstream the `nvme://` backend's tests run against: a vnvme controller
//! served over vfio-user from a thread of this process (the same `vfio-user-server`
//! code `vnvme serve` runs), with a namespace whose I/O can be held back, and the
//! front-side helpers (requests, running them, reading back, counters).

#![allow(dead_code)]

use std::os::fd::BorrowedFd;
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use block_backend::{
    Backend, BackendError, BackendInfo, BackendQueue, Completion, DataBuf, Op, RamBackend, Request, Segment,
    SyncExec, SyncQueue,
};
use guest_mem::GuestMemory;
use nvme_ctrl::{Controller, ControllerConfig, NamespaceConfig, PollMode};
use nvme_disk::NvmeBackendStats;
use rustix::event::{poll, PollFd, PollFlags, Timespec};
use vfio_user_server::{server, Device, DeviceOptions, DoorbellMode, EventFdInterrupts};

pub const TIMEOUT: Duration = Duration::from_secs(20);
pub const MIB: u64 = 1 << 20;

// ---- a downstream namespace whose requests can be held back

/// A RAM namespace whose I/O waits while the gate is closed, and whose reported
/// capabilities can be adjusted.
#[derive(Clone, Debug)]
pub struct TestNs {
    pub ram: RamBackend,
    pub gate: Arc<(Mutex<bool>, Condvar)>,
    pub volatile_cache: bool,
    pub write_zeroes_max: u64,
    pub discard_max: u64,
}

impl TestNs {
    pub fn new(size: u64) -> Self {
        TestNs {
            ram: RamBackend::new(size),
            gate: Arc::new((Mutex::new(true), Condvar::new())),
            volatile_cache: false,
            write_zeroes_max: 0,
            discard_max: 0,
        }
    }

    pub fn set_gate(&self, open: bool) {
        *self.gate.0.lock().unwrap() = open;
        self.gate.1.notify_all();
    }
}

impl Backend for TestNs {
    fn info(&self) -> BackendInfo {
        BackendInfo {
            kind: "test".into(),
            volatile_cache: self.volatile_cache,
            write_zeroes_max: self.write_zeroes_max,
            discard_max: self.discard_max,
            ..self.ram.info()
        }
    }
    fn open_queue(&self) -> std::io::Result<Box<dyn BackendQueue>> {
        Ok(Box::new(SyncQueue::new(self.clone())))
    }
}

impl SyncExec for TestNs {
    fn exec(&mut self, mem: &GuestMemory, req: &mut Request) -> Result<(), BackendError> {
        let (open, cv) = &*self.gate;
        let mut g = open.lock().unwrap();
        while !*g {
            g = cv.wait(g).unwrap();
        }
        drop(g);
        self.ram.exec(mem, req)
    }
}

// ---- the downstream server: a vfio-user server thread with one client

pub struct Downstream {
    pub socket: PathBuf,
    /// The server's end of the connection, once a client is in (to cut it).
    pub conn: mpsc::Receiver<UnixStream>,
    /// Tells the server thread to stop accepting clients.
    pub stop: Arc<std::sync::atomic::AtomicBool>,
    pub thread: Option<JoinHandle<()>>,
}

pub struct Setup {
    pub ns: TestNs,
    pub lba_format: u8,
    /// MDTS as a power of two of 4 KiB pages.
    pub mdts: u8,
    pub doorbells: DoorbellMode,
}

impl Default for Setup {
    fn default() -> Self {
        Setup { ns: TestNs::new(16 * MIB), lba_format: 0, mdts: 8, doorbells: DoorbellMode::Trapped }
    }
}

impl Downstream {
    pub fn start(s: &Setup) -> Downstream {
        Self::serve(Arc::new(s.ns.clone()), s)
    }

    /// Serves a controller with `backend` as namespace 1 (`s.ns` is not used).
    pub fn serve(backend: Arc<dyn Backend>, s: &Setup) -> Downstream {
        static SEQ: AtomicU32 = AtomicU32::new(0);
        let socket = std::env::temp_dir().join(format!(
            "nvme-backend-{}-{}.sock",
            std::process::id(),
            SEQ.fetch_add(1, Ordering::Relaxed)
        ));
        let cfg = ControllerConfig {
            namespaces: vec![NamespaceConfig::new(backend, s.lba_format)],
            mdts: s.mdts,
            max_io_queues: 8,
            msix_vectors: 9,
            ..Default::default()
        };
        let irqs = Arc::new(EventFdInterrupts::new(cfg.msix_vectors));
        let mut ctrl = Controller::new(cfg, GuestMemory::empty(), irqs.clone()).unwrap();
        let poll = if s.doorbells == DoorbellMode::Mapped { PollMode::Always } else { PollMode::Off };
        ctrl.spawn_workers(1, poll).unwrap();
        let opts = DeviceOptions { doorbells: s.doorbells, ..Default::default() };
        let mut dev = Device::new(ctrl, irqs, opts).unwrap();
        let (listener, _socket_file) = server::bind(&socket).unwrap();
        let (tx, conn) = mpsc::channel();
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let stopping = stop.clone();
        // One client at a time, as `vnvme serve` does (a backend that probes for
        // eventfd doorbells connects twice).
        let thread = std::thread::spawn(move || {
            while let Ok((stream, _)) = listener.accept() {
                if stopping.load(Ordering::SeqCst) {
                    return;
                }
                let _ = tx.send(stream.try_clone().unwrap());
                let _ = server::serve_client(stream, &mut dev);
                dev.disconnect();
            }
        });
        Downstream { socket, conn, stop, thread: Some(thread) }
    }

    pub fn uri(&self, opts: &str) -> String {
        format!("nvme://{}?{opts}", self.socket.display())
    }

    /// Cuts the connection from the server's side, as a server that exits would.
    pub fn kill(&self) {
        let mut s = self.conn.recv_timeout(TIMEOUT).expect("a client connected");
        // The newest client is the one in use.
        while let Ok(newer) = self.conn.try_recv() {
            s = newer;
        }
        s.shutdown(std::net::Shutdown::Both).unwrap();
    }
}

impl Drop for Downstream {
    fn drop(&mut self) {
        if let Some(t) = self.thread.take() {
            self.stop.store(true, Ordering::SeqCst);
            while let Ok(s) = self.conn.try_recv() {
                let _ = s.shutdown(std::net::Shutdown::Both);
            }
            // A client that never connected leaves the thread in accept(): wake it.
            let _ = UnixStream::connect(&self.socket);
            let _ = t.join();
        }
        let _ = std::fs::remove_file(&self.socket);
    }
}

// ---- front-side helpers

/// Guest memory backed by sealed memfds (what QEMU hands a vfio-user device), one per
/// range.
pub use test_kit::memfd_memory;

pub fn pattern(seed: u64, len: usize) -> Vec<u8> {
    (0..len).map(|i| ((i as u64).wrapping_mul(131).wrapping_add(seed * 7919) >> 3) as u8).collect()
}

pub fn guest(segs: &[(u64, u64)]) -> DataBuf {
    DataBuf::Guest(segs.iter().map(|&(gpa, len)| Segment::Guest { gpa, len }).collect())
}

pub fn req(tag: u64, op: Op, offset: u64, len: u64, data: DataBuf) -> Request {
    Request { tag, op, offset, len, data }
}

pub fn wait_readable(fd: BorrowedFd<'_>, ms: i64) -> bool {
    let mut p = [PollFd::new(&fd, PollFlags::IN)];
    let t = Timespec { tv_sec: ms / 1000, tv_nsec: (ms % 1000) * 1_000_000 };
    poll(&mut p, Some(&t)).unwrap() > 0
}

/// Submits `reqs`, commits, and reaps until all completed, sleeping on the notifier
/// like a front worker would (or polling when there is none). Sorted by tag.
pub fn run(q: &mut dyn BackendQueue, mem: &GuestMemory, reqs: Vec<Request>) -> Vec<Completion> {
    let n = reqs.len();
    for r in reqs {
        q.submit(mem, r);
    }
    q.commit();
    let mut out = Vec::new();
    let deadline = Instant::now() + TIMEOUT;
    while out.len() < n {
        if q.reap(&mut out) == 0 {
            match q.notifier() {
                Some(fd) => {
                    wait_readable(fd, 100);
                }
                None => std::thread::yield_now(),
            }
        }
        assert!(Instant::now() < deadline, "{} of {n} requests completed", out.len());
    }
    assert_eq!(q.in_flight(), 0);
    out.sort_by_key(|c| c.tag);
    out
}

pub fn ok(c: &[Completion]) {
    for c in c {
        assert!(c.result.is_ok(), "request {}: {:?}", c.tag, c.result);
    }
}

/// Reads `len` bytes at `offset` into a host buffer (always bounced).
pub fn read_host(q: &mut dyn BackendQueue, offset: u64, len: u64) -> Vec<u8> {
    let mem = GuestMemory::empty();
    let mut c = run(q, &mem, vec![req(0, Op::Read, offset, len, DataBuf::Host(vec![0; len as usize]))]);
    let c = c.pop().unwrap();
    c.result.unwrap();
    match c.data {
        DataBuf::Host(v) => v,
        d => panic!("host buffer expected back, got {d:?}"),
    }
}

pub fn write_host(q: &mut dyn BackendQueue, offset: u64, data: Vec<u8>) {
    let len = data.len() as u64;
    ok(&run(
        q,
        &GuestMemory::empty(),
        vec![req(0, Op::Write { fua: false }, offset, len, DataBuf::Host(data))],
    ));
}

pub fn delta(a: NvmeBackendStats, b: NvmeBackendStats) -> NvmeBackendStats {
    NvmeBackendStats {
        requests: b.requests - a.requests,
        commands: b.commands - a.commands,
        split_requests: b.split_requests - a.split_requests,
        zero_copy_bytes: b.zero_copy_bytes - a.zero_copy_bytes,
        zero_copy_commands: b.zero_copy_commands - a.zero_copy_commands,
        bounce_bytes: b.bounce_bytes - a.bounce_bytes,
        bounce_commands: b.bounce_commands - a.bounce_commands,
        errors: b.errors - a.errors,
        not_ready: b.not_ready - a.not_ready,
        regions_mapped: b.regions_mapped - a.regions_mapped,
        regions_unmapped: b.regions_unmapped - a.regions_unmapped,
        map_failures: b.map_failures - a.map_failures,
        backlogged: b.backlogged - a.backlogged,
    }
}
