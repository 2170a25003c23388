//! Runs a [`Program`] against a controller driven by the mock host and checks the
//! invariants after every action.
//!
//! # What is checked, and when it is sound
//!
//! - Nothing panics: not the controller, not a BAR0 read, not the mock host.
//! - The lifecycle agrees with CSTS: Ready has RDY=1, Disabled has RDY=0,
//!   Fatal has CFS=1, ShutDown reports shutdown processing complete.
//! - No invented completions: every completion the host reaps while CSTS.RDY=1 and
//!   CFS=0 carries a CID the host had outstanding on that queue, the queue's own SQID
//!   and an SQ head inside the ring.
//! - Nothing stranded: after a drain, a Ready controller has completed every
//!   command the host submitted (Asynchronous Event Requests excepted).
//!
//! With I/O workers (the setup chooses 0, 1 or 2), I/O completions arrive from other
//! threads while the program goes on: memory map changes, resets and shutdowns then
//! race commands in flight. Reaps see whatever has arrived; a drain waits (bounded)
//! for the workers before it looks for stranded commands.
//!
//! The last two only hold while the host and the controller agree on what is in the
//! rings. Actions that may break that agreement — raw doorbell values, writes into
//! rings or shadow doorbells, random SQEs, mutated data pointers on commands that
//! write guest memory, CC toggles — *taint* the run, and the two checks are skipped
//! until a Linux-like reset and bring-up makes host and controller agree again.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use block_backend::{FaultBackend, FaultError, FaultOp, FaultRule, NullBackend, RamBackend};
use guest_mem::{GuestMemory, Mapping};
use nvme_ctrl::{ControllerConfig, NamespaceConfig};
use nvme_ctrl::{Lifecycle, PollMode};
use nvme_spec::regs::{doorbell_offset, DoorbellKind, ShutdownStatus};
use nvme_spec::Sqe;
use test_kit::{InitOptions, ManualClock, MockHost, PAGE};
use zerocopy::FromBytes;

use crate::program::{Action, ClockAdvance, InitSpec, Program, Setup, ACTION_NAMES};

mod raw;

/// Guest memory of every run.
pub const MEM_BYTES: u64 = 8 << 20;
/// Data buffers: transfers start in the first 64 KiB and are at most 1 MiB (MDTS).
const DATA_PAGES: u64 = 512;
/// PRP lists, SGL segments and DSM ranges, one page per command, reused in turn.
pub(crate) const LIST_PAGES: u64 = 256;
/// Rings of queues created by fuzzed admin commands (the host never uses them).
const POOL_PAGES: u64 = 64;
/// Bring-ups per run (each allocates fresh queue memory from the mock allocator).
const MAX_INITS: u32 = 4;

/// What the runs did, for the runner's summary.
#[derive(Clone, Debug, Default)]
pub struct Stats {
    pub runs: u64,
    /// Actions executed, by kind ([`ACTION_NAMES`]).
    pub actions: [u64; ACTION_NAMES.len()],
    /// Actions skipped because the state did not allow them (no queue to use...).
    pub skipped: u64,
    /// Completions checked against the host's outstanding commands.
    pub checked_completions: u64,
    /// Of those, completions with an error status.
    pub error_completions: u64,
    /// Drains after which "nothing stranded" was checked.
    pub checked_drains: u64,
    /// Runs whose I/O queues ran on worker threads.
    pub worker_runs: u64,
    pub init_ok: u64,
    pub init_failed: u64,
    /// Runs that ended tainted, and runs that ended with CSTS.CFS set.
    pub tainted_runs: u64,
    pub fatal_runs: u64,
}

impl Stats {
    pub fn merge(&mut self, o: &Stats) {
        self.runs += o.runs;
        for (a, b) in self.actions.iter_mut().zip(o.actions) {
            *a += b;
        }
        self.skipped += o.skipped;
        self.checked_completions += o.checked_completions;
        self.error_completions += o.error_completions;
        self.checked_drains += o.checked_drains;
        self.worker_runs += o.worker_runs;
        self.init_ok += o.init_ok;
        self.init_failed += o.init_failed;
        self.tainted_runs += o.tainted_runs;
        self.fatal_runs += o.fatal_runs;
    }

    /// One line of per-action counts.
    pub fn action_line(&self) -> String {
        let parts: Vec<String> =
            ACTION_NAMES.iter().zip(self.actions).map(|(n, c)| format!("{n}={c}")).collect();
        parts.join(" ")
    }
}

/// Fails the run: an invariant of the controller does not hold.
macro_rules! violated {
    ($($t:tt)*) => { panic!("invariant violated: {}", format!($($t)*)) };
}

/// The controller setup values a [`Setup`] maps to.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Params {
    pub max_io_queues: u16,
    pub mdts_bytes: u64,
    pub dstrd: u8,
    /// I/O queues run on worker threads: their completions arrive asynchronously.
    pub workers: bool,
}

/// The fuzzer's areas of guest memory: data buffers, the pages PRP and SGL lists
/// are built in (handed out in turn, each remembering the command that last used
/// it), and pool pages for the rings of queues fuzzed admin commands create.
#[derive(Debug)]
pub(crate) struct Areas {
    pub data: u64,
    pub lists: u64,
    pub pool: u64,
    list_next: u64,
    /// The command that last used each list page, while it may still be outstanding.
    list_owner: Vec<Option<(u16, u16)>>,
    pool_next: u64,
}

impl Areas {
    fn new(data: u64, lists: u64, pool: u64) -> Self {
        Areas { data, lists, pool, list_next: 0, list_owner: vec![None; LIST_PAGES as usize], pool_next: 0 }
    }

    /// The next list page (its index and address), with the command that last used
    /// it, if one did.
    pub(crate) fn next_list_page(&mut self) -> (usize, u64, Option<(u16, u16)>) {
        let i = self.list_next as usize;
        self.list_next = (self.list_next + 1) % LIST_PAGES;
        (i, self.lists + i as u64 * PAGE, self.list_owner[i].take())
    }

    /// List page `i` now belongs to command `cid` of SQ `qid`.
    pub(crate) fn own(&mut self, i: usize, qid: u16, cid: u16) {
        self.list_owner[i] = Some((qid, cid));
    }

    /// No command owns a list page any more (a reset ended them all).
    pub(crate) fn forget_owners(&mut self) {
        self.list_owner.iter_mut().for_each(|o| *o = None);
    }

    /// The next pool page, for a queue's ring.
    pub(crate) fn next_pool_page(&mut self) -> u64 {
        self.pool_next = (self.pool_next + 1) % POOL_PAGES;
        self.pool + self.pool_next * PAGE
    }
}

/// One run's state: the host, the controller inside it, and what the host believes.
#[derive(Debug)]
pub(crate) struct Fuzzer<'s> {
    pub h: MockHost,
    pub clock: Arc<ManualClock>,
    pub map: Arc<Mapping>,
    pub p: Params,
    /// Where data buffers, list pages and ring pages go in guest memory.
    pub areas: Areas,
    /// Commands submitted and not yet reaped: qid -> CIDs.
    pub outstanding: BTreeMap<u16, BTreeSet<u16>>,
    /// Asynchronous Event Requests among the admin queue's outstanding commands.
    pub aers: BTreeSet<u16>,
    /// The host and controller may disagree about the rings (see the module docs).
    pub tainted: bool,
    pub inits: u32,
    /// The controller's memory map is not the whole of guest memory.
    pub memory_reduced: bool,
    /// The admin host queue survived a reset: the mock host's free CID list may have
    /// lost CIDs (commands the reset ended) or gained some (garbage completions), so
    /// its helpers, which assume a free CID, are not used.
    pub admin_reused: bool,
    pub stats: &'s mut Stats,
    /// The namespace pool's directory of this run (removed at its end).
    _pool_dir: Option<PoolDir>,
}

/// A namespace pool's directory for one run, removed when the run ends.
#[derive(Debug)]
struct PoolDir(std::path::PathBuf);

impl PoolDir {
    /// A fresh pool of 16 MiB, opened as controller `cntlid` with the NSIDs up
    /// to `fixed` its own.
    fn new(cntlid: u16, fixed: u32) -> (PoolDir, Arc<nvme_ctrl::pool::NamespacePool>) {
        use std::sync::atomic::{AtomicU64, Ordering};
        static RUN: AtomicU64 = AtomicU64::new(0);
        let n = RUN.fetch_add(1, Ordering::Relaxed);
        let dir = std::env::temp_dir().join(format!("vnvme-fuzz-pool-{}-{n}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let fixed: Vec<u32> = (1..=fixed).collect();
        let locks = nvme_ctrl::pool::LockPolicy { group: Some("fuzz".into()), ..Default::default() };
        let pool = nvme_ctrl::pool::NamespacePool::open(&dir, Some(16 << 20), cntlid, &fixed, &locks)
            .expect("a namespace pool in the temporary directory");
        (PoolDir(dir), Arc::new(pool))
    }
}

impl Drop for PoolDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Runs one program, adding what it did to `stats`. Panics when an invariant fails.
pub fn run_program(prog: &Program, stats: &mut Stats) {
    let mut f = Fuzzer::new(&prog.setup, stats);
    f.stats.runs += 1;
    if prog.setup.do_init & 1 != 0 {
        f.init(prog.setup.init);
    }
    f.check_state();
    let trace = trace_enabled();
    for (i, a) in prog.actions.iter().enumerate() {
        f.stats.actions[a.kind()] += 1;
        let t = std::time::Instant::now();
        f.step(a);
        if trace {
            eprintln!("[{i}] {a:?} ({:?})\n    {}", t.elapsed(), f.describe());
        }
        f.check_state();
    }
    if f.tainted {
        f.stats.tainted_runs += 1;
    }
    if f.h.csts().cfs() {
        f.stats.fatal_runs += 1;
    }
}

/// `NVME_FUZZ_TRACE=1` prints every action and the host's view after it.
fn trace_enabled() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| std::env::var_os("NVME_FUZZ_TRACE").is_some_and(|v| v != "0"))
}

impl<'s> Fuzzer<'s> {
    /// The host's view, for tracing: lifecycle, CSTS, and per queue the host's SQ
    /// tail and CQ head, the shadow and EventIdx slots, and outstanding CIDs.
    fn describe(&self) -> String {
        let mut s =
            format!("{:?} csts={:#x} tainted={} ", self.h.ctrl.lifecycle(), self.h.csts().0, self.tainted);
        for qid in self.host_qids() {
            let q = self.host_queue(qid).expect("listed");
            let slots = self.h.dbbuf.map(|b| {
                let rd = |base: u64, k| {
                    self.h.mem.load_u32(base + doorbell_offset(qid, k, self.p.dstrd)).unwrap_or(!0)
                };
                format!(
                    " shadow={}/{} ei={}/{}",
                    rd(b.shadow, DoorbellKind::SqTail),
                    rd(b.shadow, DoorbellKind::CqHead),
                    rd(b.eventidx, DoorbellKind::SqTail),
                    rd(b.eventidx, DoorbellKind::CqHead)
                )
            });
            let out: Vec<u16> =
                self.outstanding.get(&qid).map(|c| c.iter().copied().collect()).unwrap_or_default();
            s += &format!(
                "\n    q{qid}: size={} sq_tail={} cq_head={} phase={}{} outstanding={out:?}",
                q.size(),
                q.sq.tail,
                q.cq.head,
                q.cq.phase as u8,
                slots.unwrap_or_default()
            );
        }
        s
    }

    fn new(s: &Setup, stats: &'s mut Stats) -> Self {
        let namespaces: Vec<NamespaceConfig> = (0..1 + s.ns_count as usize % 3)
            .map(|i| {
                let n = s.ns[i];
                let size = (1 + n.mib as u64 % 8) << 20;
                let mut backend: Arc<dyn block_backend::Backend> = if n.kind & 1 == 0 {
                    Arc::new(RamBackend::new(size))
                } else {
                    Arc::new(NullBackend::new(size))
                };
                if let Some(rule) = fault_rule(n.kind) {
                    backend = Arc::new(FaultBackend::new(backend, vec![rule]));
                }
                let zoned = (n.mib & 0x10 != 0).then(|| {
                    let max_open = (n.mib >> 6) as u32;
                    nvme_ctrl::zoned::ZonedConfig {
                        zone_size: 256 << 10,
                        zone_capacity: if n.mib & 0x20 != 0 { 192 << 10 } else { 256 << 10 },
                        max_open,
                        max_active: if max_open > 0 { max_open + 1 } else { 0 },
                        state_file: None,
                    }
                });
                let (lba_format, metadata) = match n.lba_format {
                    f if f & 4 != 0 && zoned.is_none() => {
                        let ty = (f >> 5) & 3;
                        let dps = if ty == 0 { 0 } else { ty | (f >> 7) << 3 };
                        let store = nvme_ctrl::MetaFile::memory().expect("a memfd for metadata");
                        let extended = f & 2 != 0;
                        (
                            2 + (((f >> 3) % 4) | ((f & 1) << 2)) % 6,
                            Some(nvme_ctrl::MetadataConfig { store, dps, extended }),
                        )
                    }
                    f => (f % 2, None),
                };
                // Namespaces spread over ANA groups 1 to 3 (reported with a subsystem).
                let ana_group = Some(1 + n.mib as u32 % 3);
                // Reservations (a state file of its own, in memory) on some.
                let reservations = (n.kind & 0x40 != 0).then(|| {
                    let fd = rustix::fs::memfd_create("vnvme-fuzz-resv", rustix::fs::MemfdFlags::CLOEXEC)
                        .expect("a memfd for the reservation state");
                    let f = std::fs::File::from(fd);
                    nvme_ctrl::reservation::initialize(&f).expect("a new reservation state");
                    Arc::new(f)
                });
                NamespaceConfig {
                    zoned,
                    metadata,
                    ana_group,
                    reservations,
                    ..NamespaceConfig::new(backend, lba_format)
                }
            })
            .collect();
        let mdts = 1 + s.mdts % 8;
        // A namespace pool (Namespace Management and Attachment) for half the
        // subsystem controllers.
        let subsystem =
            (s.aerl_z & 0x80 != 0).then_some(nvme_ctrl::SubsystemConfig { cntlid: s.aerl_z as u16 });
        let (pool_dir, pool) = match subsystem {
            Some(sub) if s.aerl_z & 0x40 != 0 => {
                let (d, p) = PoolDir::new(sub.cntlid, namespaces.len() as u32);
                (Some(d), Some(p))
            }
            _ => (None, None),
        };
        let cfg = ControllerConfig {
            max_io_queues: 1 + s.max_io_queues as u16 % 16,
            msix_vectors: 1 + s.msix_vectors as u16 % 17,
            dstrd: s.dstrd % 4,
            mdts,
            mqes_z: 1 + s.mqes_z % 1023,
            aerl_z: s.aerl_z % 8,
            namespaces,
            fdp: (s.dstrd & 0x10 != 0)
                .then(|| nvme_ctrl::FdpConfig { ruhs: 1 + (s.dstrd >> 5) as u16, ru_size: 64 << 10 }),
            // A controller of a subsystem (CNTLID, ANA) in half the runs.
            subsystem,
            max_namespaces: if pool.is_some() { 8 } else { 0 },
            pool,
            ..Default::default()
        };
        let p = Params {
            max_io_queues: cfg.max_io_queues,
            mdts_bytes: (1u64 << mdts) * PAGE,
            dstrd: cfg.dstrd,
            workers: s.workers() > 0,
        };
        let clock = Arc::new(ManualClock::default());
        let mut h = MockHost::with_clock(cfg, MEM_BYTES, clock.clone());
        // Our own mapping, so the memory map can later be cut into pieces of it.
        let map = Arc::new(Mapping::anonymous(MEM_BYTES).expect("mmap guest memory"));
        let mem = GuestMemory::empty().with_region(0, MEM_BYTES, map.clone(), 0).expect("guest memory map");
        h.mem = mem.clone();
        h.ctrl.set_memory(mem);
        let workers = s.workers();
        if workers > 0 {
            h.ctrl.spawn_workers(workers, PollMode::Off).expect("spawn I/O workers");
            stats.worker_runs += 1;
        }
        let data = h.alloc.alloc_pages(DATA_PAGES);
        let lists = h.alloc.alloc_pages(LIST_PAGES);
        let pool = h.alloc.alloc_pages(POOL_PAGES);
        Fuzzer {
            h,
            clock,
            map,
            p,
            areas: Areas::new(data, lists, pool),
            outstanding: BTreeMap::new(),
            aers: BTreeSet::new(),
            tainted: false,
            inits: 0,
            memory_reduced: false,
            admin_reused: false,
            stats,
            _pool_dir: pool_dir,
        }
    }

    fn step(&mut self, a: &Action) {
        match *a {
            Action::AdminRaw(r) => {
                self.tainted = true;
                let sqe = Sqe::read_from_bytes(&r.sqe.0).expect("64 bytes");
                if self.submit(0, sqe).is_none() {
                    self.stats.skipped += 1;
                }
            }
            Action::IoRaw(r) => {
                self.tainted = true;
                let sqe = Sqe::read_from_bytes(&r.sqe.0).expect("64 bytes");
                match self.io_queue(r.queue) {
                    Some(q) if self.submit(q, sqe).is_some() => {}
                    _ => self.stats.skipped += 1,
                }
            }
            Action::Io(c) => self.io_cmd(&c),
            Action::Admin(c) => self.admin_cmd(&c),
            Action::Reg(r) => self.reg_write(r),
            Action::Cc(c) => self.cc_op(c),
            Action::Doorbell(d) => self.doorbell(d),
            Action::Shadow(s) => self.shadow_write(s),
            Action::Ring(r) => self.ring_write(r),
            Action::Scribble(s) => self.scribble(s),
            Action::Memory(m) => self.memory_op(m),
            Action::Reap(r) => {
                let qids = self.host_qids();
                match (r.queue as usize).checked_rem(qids.len() + 1) {
                    Some(i) if i < qids.len() => self.reap(qids[i]),
                    _ => self.reap_all(),
                };
            }
            Action::Process(p) => self.process(p),
            Action::Clock(ClockAdvance { us }) => self.clock.advance_us(us as u64 % 5000),
            Action::Init(spec) => self.init(spec),
            Action::ReadReg(r) => self.read_reg(r),
            Action::Burst(b) => self.burst(&b),
            Action::CreatePair(c) => self.create_pair(c.qid, c.size, c.ien),
            Action::Drain(d) => self.drain(d.rounds),
            Action::Ana(a) => {
                let state = nvme_spec::ana::AnaState::ALL[a.state as usize % 5];
                let group = match a.group % 34 {
                    0 => None,
                    g => Some(g as u32),
                };
                // Refused without a subsystem, or for group 33: either way the
                // controller goes on as it was.
                let _ = self.h.ctrl.set_ana_state(group, state);
            }
        }
    }

    // ---- what the host believes

    /// Host queues that exist: 0 (admin, once enabled) and the I/O queues.
    pub fn host_qids(&self) -> Vec<u16> {
        let mut v: Vec<u16> = self.h.admin.iter().map(|_| 0).collect();
        v.extend(self.h.io.iter().filter(|q| q.qid != 0).map(|q| q.qid));
        v
    }

    pub fn io_queue(&self, sel: u8) -> Option<u16> {
        let qs: Vec<u16> = self.h.io.iter().filter(|q| q.qid != 0).map(|q| q.qid).collect();
        (!qs.is_empty()).then(|| qs[sel as usize % qs.len()])
    }

    fn host_queue(&self, qid: u16) -> Option<&test_kit::HostQueue> {
        if qid == 0 {
            self.h.admin.as_ref()
        } else {
            self.h.io.iter().find(|q| q.qid == qid)
        }
    }

    /// Submits through the mock host (which assigns the CID and rings the Linux way).
    /// At most size - 1 tracked commands are outstanding per queue, whatever the
    /// mock host's CID list says, so the host never overruns its own ring.
    pub fn submit(&mut self, qid: u16, sqe: Sqe) -> Option<u16> {
        let size = self.host_queue(qid)?.size() as usize;
        if self.outstanding.get(&qid).map_or(0, |s| s.len()) + 1 >= size {
            return None;
        }
        let cid = self.h.submit(qid, sqe)?;
        self.outstanding.entry(qid).or_default().insert(cid);
        Some(cid)
    }

    /// Forgets every outstanding command: a reset ended them without completions.
    fn forget_all(&mut self) {
        self.outstanding.clear();
        self.aers.clear();
        self.areas.forget_owners();
    }

    /// Reaps host queue `qid`, checking each completion. Returns how many.
    pub fn reap(&mut self, qid: u16) -> usize {
        let Some(size) = self.host_queue(qid).map(|q| q.size()) else { return 0 };
        let cqes = self.h.reap_queue(qid);
        let n = cqes.len();
        if n == 0 {
            return 0;
        }
        let csts = self.h.csts();
        let check = !self.tainted && csts.rdy() && !csts.cfs();
        for c in cqes {
            let cid = c.cid.get();
            let known = self.outstanding.get_mut(&qid).is_some_and(|s| s.remove(&cid));
            if qid == 0 {
                self.aers.remove(&cid);
            }
            if check {
                self.stats.checked_completions += 1;
                if !c.status().is_success() {
                    self.stats.error_completions += 1;
                }
                if !known {
                    violated!("queue {qid} completed cid {cid}, which was not outstanding: {c:?}");
                }
                if c.sqid.get() != qid {
                    violated!("completion on CQ {qid} names SQ {}: {c:?}", c.sqid.get());
                }
                if c.sqhd.get() as u32 >= size {
                    violated!("SQ head {} outside a {size}-entry queue: {c:?}", c.sqhd.get());
                }
            }
        }
        n
    }

    pub fn reap_all(&mut self) -> usize {
        self.host_qids().into_iter().map(|q| self.reap(q)).sum()
    }

    /// Calls `process` a bounded number of times; true if it ever made progress.
    pub fn run_device(&mut self, calls: u32) -> bool {
        let mut any = false;
        for _ in 0..calls {
            if !self.h.ctrl.process() {
                break;
            }
            any = true;
        }
        any
    }

    // ---- invariants

    /// CSTS is readable and agrees with the lifecycle.
    fn check_state(&self) {
        let csts = self.h.csts();
        match self.h.ctrl.lifecycle() {
            // CSTS.CFS shows an engine fault at once; the lifecycle follows at the
            // next `process`, so Ready may briefly read CFS = 1.
            Lifecycle::Ready if !csts.rdy() => violated!("Ready but CSTS = {:#x}", csts.0),
            Lifecycle::Disabled if csts.rdy() => violated!("Disabled but CSTS.RDY = 1 ({:#x})", csts.0),
            Lifecycle::Fatal if !csts.cfs() => violated!("Fatal but CSTS.CFS = 0 ({:#x})", csts.0),
            Lifecycle::ShutDown if csts.shst() != ShutdownStatus::Complete => {
                violated!("ShutDown but CSTS.SHST = {:?}", csts.shst())
            }
            _ => {}
        }
        let _ = self.h.ctrl.next_deadline();
    }

    /// Lets the device run and the host reap until quiet; then, if host and
    /// controller agree and the controller is Ready, nothing may be left outstanding.
    fn drain(&mut self, rounds: u8) {
        for _ in 0..3 + rounds % 8 {
            // `process` may post completions (from a CQ overflow) and still report
            // no progress, so a quiet round is one that also reaped nothing.
            let progress = self.run_device(16);
            if self.reap_all() == 0 && !progress {
                break;
            }
        }
        let checkable = |f: &Self| {
            let csts = f.h.csts();
            !f.tainted && csts.rdy() && !csts.cfs() && f.h.ctrl.lifecycle() == Lifecycle::Ready
        };
        if self.p.workers && checkable(self) {
            self.wait_for_workers();
        }
        if !checkable(self) {
            return;
        }
        self.stats.checked_drains += 1;
        for (qid, cids) in &self.outstanding {
            let stuck: Vec<u16> =
                cids.iter().copied().filter(|c| *qid != 0 || !self.aers.contains(c)).collect();
            if !stuck.is_empty() {
                violated!(
                    "commands never completed on queue {qid}: cids {stuck:?} (memory map reduced: {})",
                    self.memory_reduced
                );
            }
        }
    }

    /// Reaps until no tracked I/O command is outstanding, a worker has failed the
    /// controller (CSTS.CFS: the rest never completes), or a bound (generous: the
    /// workers share the machine with everything else) has passed; the drain's check
    /// then judges what is left.
    fn wait_for_workers(&mut self) {
        const BOUND: std::time::Duration = std::time::Duration::from_secs(2);
        let start = std::time::Instant::now();
        while self.outstanding.iter().any(|(q, c)| *q != 0 && !c.is_empty())
            && !self.h.csts().cfs()
            && start.elapsed() < BOUND
        {
            self.run_device(4);
            if self.reap_all() == 0 {
                std::thread::sleep(std::time::Duration::from_micros(50));
            }
        }
    }

    /// Drains the admin queue so a mock host helper (which reaps every admin
    /// completion itself) cannot swallow one we track. False if that failed.
    fn quiesce_admin(&mut self) -> bool {
        if self.tainted
            || self.admin_reused
            || self.h.admin.is_none()
            || self.h.ctrl.lifecycle() != Lifecycle::Ready
        {
            return false;
        }
        for _ in 0..4 {
            self.run_device(16);
            self.reap(0);
        }
        let out = self.outstanding.get(&0);
        let busy = out.is_some_and(|s| s.iter().any(|c| !self.aers.contains(c)));
        let free = self.h.admin.as_ref().is_some_and(|q| out.map_or(0, |s| s.len()) as u32 + 3 < q.size());
        !busy && free
    }

    // ---- bring-up

    /// Zeroes the guest memory the mock host's allocator hands out next, as a real
    /// host's DMA allocations are zeroed (earlier scribbles or wild DMA may have
    /// written there). One bring-up allocates well under 64 KiB.
    fn zero_next_allocations(&mut self) {
        let next = self.h.alloc.alloc(0, 1);
        let len = (64 << 10).min(MEM_BYTES - next);
        self.h.mem.fill(next, len, 0).expect("allocator memory is guest memory");
    }

    fn init(&mut self, s: InitSpec) {
        if self.inits >= MAX_INITS {
            self.stats.skipped += 1;
            return;
        }
        self.inits += 1;
        let opts = InitOptions {
            io_queues: 1 + s.io_queues as u16 % 4,
            queue_size: 2 + s.queue_size as u32 % 63,
            admin_queue_size: 2 + s.admin_size as u32 % 63,
            shadow_doorbells: s.flags & 1 != 0,
            interrupts: s.flags & 2 != 0,
        };
        self.forget_all();
        self.zero_next_allocations();
        // Bring-up starts with CC.EN = 0, so every queue before it is gone.
        match self.h.init(opts) {
            Ok(()) => {
                self.stats.init_ok += 1;
                self.tainted = false;
                self.admin_reused = false;
                self.name_host(s.flags);
            }
            Err(_) => {
                self.stats.init_failed += 1;
                self.tainted = true;
            }
        }
    }

    /// Gives the host a Host Identifier (one of two, 64- or 128-bit) when a
    /// namespace has reservations, so its reservation commands get past Command
    /// Sequence Error; now and then it stays nameless.
    fn name_host(&mut self, flags: u8) {
        if flags & 0x80 != 0 || !self.h.ctrl.namespaces().any(|n| n.reservations().is_some()) {
            return;
        }
        let extended = flags & 0x40 != 0;
        let (_, page) = self.list_page();
        self.write_mem(page, &[0xa0 | (flags >> 4 & 1); 16]);
        let mut c =
            nvme_spec::admin::SetFeaturesCmd { fid: 0x81, cdw11: extended as u32, ..Default::default() }
                .to_sqe();
        c.set_prps(page, 0);
        let _ = self.h.admin_cmd(c);
    }

    /// Creates an I/O queue pair with the mock host's Linux-like helper.
    fn create_pair(&mut self, qid: u8, size: u8, ien: u8) {
        if self.inits >= MAX_INITS * 4 || !self.quiesce_admin() {
            self.stats.skipped += 1;
            return;
        }
        self.inits += 1;
        let qid = 1 + qid as u16 % self.p.max_io_queues;
        if self.h.io.iter().any(|q| q.qid == qid) {
            self.stats.skipped += 1;
            return;
        }
        self.zero_next_allocations();
        let _ = self.h.create_queue_pair(qid, 2 + size as u32 % 63, ien & 1 != 0);
    }

    /// Sends Doorbell Buffer Config with fresh (zeroed) pages, as Linux does, though
    /// possibly after I/O queues were used (which Linux does not do, but a host may;
    /// the controller once adopted the zeroed shadow tails and re-executed stale SQ
    /// entries: `corpus/seed-late-dbbuf`), or replacing buffers already in use (the
    /// controller once lost the CQ head doing that: `corpus/regress-dbbuf-reconfig-*`).
    pub fn fresh_dbbuf(&mut self) {
        if self.inits >= MAX_INITS * 4 || !self.quiesce_admin() {
            self.stats.skipped += 1;
            return;
        }
        self.inits += 1;
        self.zero_next_allocations();
        let _ = self.h.doorbell_buffer_config();
    }
}

/// The failure a namespace's backend injects, from its `kind` byte (see
/// `program::NsSpec`), so the error paths (statuses, the Error Information log,
/// SMART warnings and events) run under the fuzzer too.
fn fault_rule(kind: u8) -> Option<FaultRule> {
    let e = (kind >> 1) & 7;
    if e < 3 {
        return None;
    }
    let error =
        [FaultError::Eio, FaultError::NoSpace, FaultError::Short, FaultError::Gone, FaultError::ReadOnly]
            [(e - 3) as usize];
    let op = [FaultOp::Read, FaultOp::Write, FaultOp::Flush, FaultOp::Discard, FaultOp::Any]
        [((kind >> 4) & 7) as usize % 5];
    let lba = (kind & 0x80 != 0).then_some((0, 64));
    Some(FaultRule { op, error, lba, after: 0, count: None, lba_size: 512, delay: None })
}
