//! Fault injection: a backend wrapper that fails chosen requests, so the error paths
//! (status mapping, the Error Information log, SMART, the guest's recovery) can be
//! exercised on demand, from unit tests up to a real guest.
//!
//! A rule names the operations it applies to, the error it produces, and optionally a
//! byte range, how many matching requests to let through first and how many to fail.
//! Rules are shared by every queue of the backend, so counts are global. The textual
//! form (what `vnvme serve --ns ...:fault=RULE` takes) is
//!
//! ```text
//! OP/ERROR[/lba=START+COUNT][/after=N][/count=N][/delay=MS]
//! OP/delay=MS[/lba=START+COUNT][/after=N][/count=N]
//! ```
//!
//! - `OP`: `read`, `write`, `flush`, `discard` (Discard and Write Zeroes), or `any`;
//! - `ERROR`: `eio` (a media error), `enospc` (storage full), `short` (a short
//!   transfer), `gone` (storage unreachable), `rofs` (storage turned read-only),
//!   `hang` (the request is accepted and never completes, until the queue is dropped:
//!   a backend that stopped answering);
//! - `delay=MS`: the request completes MS milliseconds late, normally or with the
//!   rule's error (the error may then be left out);
//! - `lba=START+COUNT`: only requests touching these blocks (in units of the
//!   namespace's LBA size, set with [`FaultRule::lba_size`]);
//! - `after=N`: let the first N matching requests succeed;
//! - `count=N`: fail N requests, then stop (default: fail every match).
//!
//! Example: `read/eio/lba=2048+8` makes every read of blocks 2048..2056 fail with an
//! Unrecovered Read Error.
//!
//! Delayed and hung requests cost no thread: the queue keeps them with their due time
//! and hands them on (or completes them) in a later `reap`. While it holds a delayed
//! request the queue asks its owner to poll ([`BackendQueue::needs_polling`]), so a
//! sleeping owner still looks when one falls due; hung requests need no polling.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use guest_mem::GuestMemory;

use crate::{Backend, BackendError, BackendInfo, BackendQueue, Completion, DataBuf, Op, Request};

/// Which operations a rule applies to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FaultOp {
    Read,
    Write,
    Flush,
    /// Discard and Write Zeroes.
    Discard,
    Any,
}

/// The error a rule produces.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FaultError {
    Eio,
    NoSpace,
    Short,
    Gone,
    ReadOnly,
    /// Never complete (until the queue is dropped).
    Hang,
    /// No error: the request runs normally (a rule that only delays).
    None,
}

/// One fault injection rule.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FaultRule {
    pub op: FaultOp,
    pub error: FaultError,
    /// Only requests overlapping `[start, end)` blocks.
    pub lba: Option<(u64, u64)>,
    pub after: u64,
    pub count: Option<u64>,
    /// Bytes per block for `lba` (512 unless set).
    pub lba_size: u64,
    /// Complete matching requests this late.
    pub delay: Option<Duration>,
}

impl FaultRule {
    /// Sets the block size `lba=` is counted in.
    pub fn lba_size(mut self, bytes: u64) -> Self {
        self.lba_size = bytes.max(1);
        self
    }

    fn matches(&self, req: &Request) -> bool {
        let op_ok = matches!(
            (self.op, req.op),
            (FaultOp::Any, _)
                | (FaultOp::Read, Op::Read)
                | (FaultOp::Write, Op::Write { .. } | Op::Copy { .. })
                | (FaultOp::Flush, Op::Flush)
                | (FaultOp::Discard, Op::Discard | Op::WriteZeroes { .. })
        );
        if !op_ok {
            return false;
        }
        match self.lba {
            // Flush has no range; it matches only rules without one.
            Some(_) if req.op == Op::Flush => false,
            Some((start, end)) => {
                let first = req.offset / self.lba_size;
                let last = (req.offset + req.len.max(1) - 1) / self.lba_size;
                first < end && last >= start
            }
            None => true,
        }
    }

    /// The error a fired rule completes the request with (None: the request runs,
    /// or hangs).
    fn error(&self, req: &Request) -> Option<BackendError> {
        Some(match self.error {
            FaultError::Eio => BackendError::Io(std::io::Error::from_raw_os_error(libc::EIO)),
            FaultError::NoSpace => BackendError::NoSpace,
            FaultError::Short => BackendError::Short { done: req.len / 2, len: req.len },
            FaultError::Gone => BackendError::NotReady("fault injection: storage gone".into()),
            FaultError::ReadOnly => BackendError::ReadOnly,
            FaultError::Hang | FaultError::None => return None,
        })
    }
}

impl std::str::FromStr for FaultRule {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        let mut parts = s.split('/');
        let op = match parts.next().unwrap_or_default() {
            "read" => FaultOp::Read,
            "write" => FaultOp::Write,
            "flush" => FaultOp::Flush,
            "discard" => FaultOp::Discard,
            "any" => FaultOp::Any,
            o => {
                return Err(format!(
                    "fault {s:?}: unknown operation {o:?} (read, write, flush, discard, any)"
                ))
            }
        };
        let mut parts = parts.peekable();
        let error = match parts.peek().copied() {
            Some("eio") => FaultError::Eio,
            Some("enospc") => FaultError::NoSpace,
            Some("short") => FaultError::Short,
            Some("gone") => FaultError::Gone,
            Some("rofs") => FaultError::ReadOnly,
            Some("hang") => FaultError::Hang,
            // A rule that only delays names no error.
            Some(p) if p.starts_with("delay=") => FaultError::None,
            Some(e) => {
                return Err(format!(
                    "fault {s:?}: unknown error {e:?} (eio, enospc, short, gone, rofs, hang, or delay=MS)"
                ))
            }
            None => return Err(format!("fault {s:?}: missing error, e.g. read/eio")),
        };
        if error != FaultError::None {
            parts.next();
        }
        let mut rule = FaultRule { op, error, lba: None, after: 0, count: None, lba_size: 512, delay: None };
        let num = |v: &str| v.parse::<u64>().map_err(|_| format!("fault {s:?}: {v:?} is not a number"));
        for p in parts {
            match p.split_once('=') {
                Some(("delay", v)) if error == FaultError::Hang => {
                    return Err(format!("fault {s:?}: a hung request has no delay ({v} ms)"))
                }
                Some(("delay", v)) => rule.delay = Some(Duration::from_millis(num(v)?)),
                Some(("lba", v)) => {
                    let (a, n) =
                        v.split_once('+').ok_or_else(|| format!("fault {s:?}: lba takes START+COUNT"))?;
                    let (a, n) = (num(a)?, num(n)?);
                    if n == 0 {
                        return Err(format!("fault {s:?}: lba count must be at least 1"));
                    }
                    rule.lba = Some((a, a.saturating_add(n)));
                }
                Some(("after", v)) => rule.after = num(v)?,
                Some(("count", v)) => rule.count = Some(num(v)?),
                _ => return Err(format!("fault {s:?}: unknown part {p:?} (lba=, after=, count=, delay=)")),
            }
        }
        Ok(rule)
    }
}

#[derive(Debug)]
struct RuleState {
    rule: FaultRule,
    /// Matching requests seen so far.
    seen: AtomicU64,
    /// Requests failed so far.
    failed: AtomicU64,
}

impl RuleState {
    /// Counts a matching request; true if this one must fail.
    fn fire(&self) -> bool {
        let n = self.seen.fetch_add(1, Ordering::Relaxed);
        if n < self.rule.after {
            return false;
        }
        match self.rule.count {
            Some(c) => self
                .failed
                .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |f| (f < c).then_some(f + 1))
                .is_ok(),
            None => {
                self.failed.fetch_add(1, Ordering::Relaxed);
                true
            }
        }
    }
}

/// A backend whose requests fail according to [`FaultRule`]s.
#[derive(Debug, Clone)]
pub struct FaultBackend {
    inner: Arc<dyn Backend>,
    rules: Arc<[RuleState]>,
}

impl FaultBackend {
    pub fn new(inner: Arc<dyn Backend>, rules: Vec<FaultRule>) -> Self {
        let rules = rules
            .into_iter()
            .map(|rule| RuleState { rule, seen: AtomicU64::new(0), failed: AtomicU64::new(0) })
            .collect();
        FaultBackend { inner, rules }
    }

    /// Requests failed so far, across all rules.
    pub fn injected(&self) -> u64 {
        self.rules.iter().map(|r| r.failed.load(Ordering::Relaxed)).sum()
    }
}

impl Backend for FaultBackend {
    fn info(&self) -> BackendInfo {
        let mut i = self.inner.info();
        i.kind = format!("{} with {} fault rule(s)", i.kind, self.rules.len());
        i
    }
    fn resize(&self, bytes: u64) -> std::io::Result<()> {
        self.inner.resize(bytes)
    }
    fn data_end(&self, from: u64) -> std::io::Result<Option<u64>> {
        self.inner.data_end(from)
    }
    fn handover_fd(&self) -> Option<std::io::Result<std::os::fd::OwnedFd>> {
        self.inner.handover_fd()
    }
    fn storage(&self) -> Option<crate::StorageReport> {
        self.inner.storage()
    }
    fn stats_line(&self) -> Option<String> {
        let own = format!("{} request(s) failed by fault injection", self.injected());
        Some(match self.inner.stats_line() {
            Some(inner) => format!("{own}; {inner}"),
            None => own,
        })
    }
    fn open_queue(&self) -> std::io::Result<Box<dyn BackendQueue>> {
        Ok(Box::new(FaultQueue {
            inner: self.inner.open_queue()?,
            rules: self.rules.clone(),
            failed: Vec::new(),
            delayed: Vec::new(),
            hung: Vec::new(),
        }))
    }
}

#[derive(Debug)]
struct FaultQueue {
    inner: Box<dyn BackendQueue>,
    rules: Arc<[RuleState]>,
    /// Injected failures waiting for the next reap.
    failed: Vec<Completion>,
    /// Requests held back by a `delay=` rule, with their due time.
    delayed: Vec<(Instant, Delayed)>,
    /// Requests that never complete: kept (their buffers and guest memory with them)
    /// until the queue is dropped, as a stuck device that might still DMA would.
    hung: Vec<(GuestMemory, Request)>,
}

/// What a delayed request does when it falls due.
#[derive(Debug)]
enum Delayed {
    /// Go to the inner backend (a delay without an error).
    Submit(GuestMemory, Request),
    /// Complete with an injected failure.
    Fail(Completion),
}

impl FaultQueue {
    /// Moves delayed requests whose time has come on: failures to `failed`, the rest
    /// to the inner backend.
    fn release_due(&mut self) {
        if self.delayed.is_empty() {
            return;
        }
        let now = Instant::now();
        let mut submitted = false;
        let mut i = 0;
        while i < self.delayed.len() {
            if self.delayed[i].0 > now {
                i += 1;
                continue;
            }
            match self.delayed.swap_remove(i).1 {
                Delayed::Submit(mem, req) => {
                    self.inner.submit(&mem, req);
                    submitted = true;
                }
                Delayed::Fail(c) => self.failed.push(c),
            }
        }
        if submitted {
            self.inner.commit();
        }
    }
}

impl BackendQueue for FaultQueue {
    fn submit(&mut self, mem: &GuestMemory, req: Request) {
        // Every matching rule counts the request; the first that fires decides.
        let mut fired: Option<&FaultRule> = None;
        for r in self.rules.iter() {
            if r.rule.matches(&req) && r.fire() && fired.is_none() {
                fired = Some(&r.rule);
            }
        }
        let Some(rule) = fired else { return self.inner.submit(mem, req) };
        if rule.error == FaultError::Hang {
            self.hung.push((mem.clone(), req));
            return;
        }
        let what = match rule.error(&req) {
            Some(e) => Delayed::Fail(Completion { tag: req.tag, result: Err(e), data: req.data }),
            None => Delayed::Submit(mem.clone(), req),
        };
        match (rule.delay, what) {
            (Some(d), what) => self.delayed.push((Instant::now() + d, what)),
            (None, Delayed::Fail(c)) => self.failed.push(c),
            (None, Delayed::Submit(mem, req)) => self.inner.submit(&mem, req),
        }
    }
    fn commit(&mut self) {
        self.inner.commit();
    }
    fn reap(&mut self, out: &mut Vec<Completion>) -> usize {
        self.release_due();
        let n = self.failed.len();
        out.append(&mut self.failed);
        n + if self.inner.in_flight() > 0 { self.inner.reap(out) } else { 0 }
    }
    fn in_flight(&self) -> usize {
        self.inner.in_flight() + self.failed.len() + self.delayed.len() + self.hung.len()
    }
    fn needs_polling(&self) -> bool {
        // Hung requests never finish: nothing to poll for.
        !self.delayed.is_empty() || !self.failed.is_empty() || self.inner.needs_polling()
    }
    fn notifier(&self) -> Option<std::os::fd::BorrowedFd<'_>> {
        self.inner.notifier()
    }
    fn memory_changed(&mut self, mem: &GuestMemory) {
        self.inner.memory_changed(mem);
    }
    fn revoke(&mut self, tag: u64) -> Option<bool> {
        // Held back here: it never reaches the inner queue; it completes when due,
        // failed, without its data.
        for (_, d) in &mut self.delayed {
            if let Delayed::Submit(_, r) = d {
                if r.tag == tag {
                    *d = Delayed::Fail(Completion {
                        tag,
                        result: Err(BackendError::NotReady("given up on before it ran".into())),
                        data: DataBuf::None,
                    });
                    return Some(true);
                }
            }
        }
        if self.delayed.iter().any(|(_, d)| matches!(d, Delayed::Fail(c) if c.tag == tag))
            || self.failed.iter().any(|c| c.tag == tag)
        {
            return Some(true);
        }
        // Hung: it never touches memory again (it never completes either).
        if self.hung.iter().any(|(_, r)| r.tag == tag) {
            return Some(true);
        }
        self.inner.revoke(tag)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{DataBuf, RamBackend};

    fn req(tag: u64, op: Op, offset: u64, len: u64) -> Request {
        let data = match op {
            Op::Read | Op::Write { .. } => DataBuf::Host(vec![0; len as usize]),
            _ => DataBuf::None,
        };
        Request { tag, op, offset, len, data }
    }

    fn run(be: &FaultBackend, reqs: Vec<Request>) -> Vec<(u64, bool)> {
        let mem = GuestMemory::empty();
        let mut q = be.open_queue().unwrap();
        for r in reqs {
            q.submit(&mem, r);
        }
        q.commit();
        let mut out = Vec::new();
        q.reap(&mut out);
        assert_eq!(q.in_flight(), 0);
        let mut v: Vec<_> = out.iter().map(|c| (c.tag, c.result.is_ok())).collect();
        v.sort();
        v
    }

    #[test]
    fn parses_rules_and_names_what_is_wrong() {
        let r: FaultRule = "read/eio/lba=2048+8/after=1/count=2".parse().unwrap();
        assert_eq!(
            (r.op, r.error, r.lba, r.after, r.count),
            (FaultOp::Read, FaultError::Eio, Some((2048, 2056)), 1, Some(2))
        );
        let r: FaultRule = "write/delay=20/count=1".parse().unwrap();
        assert_eq!((r.error, r.delay, r.count), (FaultError::None, Some(Duration::from_millis(20)), Some(1)));
        let r: FaultRule = "read/eio/delay=5".parse().unwrap();
        assert_eq!((r.error, r.delay), (FaultError::Eio, Some(Duration::from_millis(5))));
        assert_eq!("read/hang".parse::<FaultRule>().unwrap().error, FaultError::Hang);
        let r: FaultRule = "any/gone".parse().unwrap();
        assert_eq!((r.op, r.error, r.lba, r.count), (FaultOp::Any, FaultError::Gone, None, None));
        for (bad, says) in [
            ("reed/eio", "unknown operation"),
            ("read", "missing error"),
            ("read/boom", "unknown error"),
            ("read/eio/lba=5", "START+COUNT"),
            ("read/eio/lba=5+0", "at least 1"),
            ("read/eio/after=x", "not a number"),
            ("read/eio/when=3", "unknown part"),
            ("read/hang/delay=5", "no delay"),
            ("read/delay=x", "not a number"),
        ] {
            let e = bad.parse::<FaultRule>().unwrap_err();
            assert!(e.contains(says), "{bad}: {e}");
        }
    }

    #[test]
    fn fails_only_matching_requests_within_range_and_counts() {
        let ram: Arc<dyn Backend> = Arc::new(RamBackend::new(1 << 20));
        let rule: FaultRule = "read/eio/lba=8+2/after=1/count=2".parse().unwrap();
        let be = FaultBackend::new(ram, vec![rule]);
        let got = run(
            &be,
            vec![
                req(1, Op::Read, 8 * 512, 512), // first match: let through (after=1)
                req(2, Op::Write { fua: false }, 8 * 512, 512), // not a read
                req(3, Op::Read, 0, 4096),      // blocks 0..8: outside
                req(4, Op::Read, 9 * 512, 512), // fails
                req(5, Op::Read, 7 * 512, 1024), // overlaps block 8: fails
                req(6, Op::Read, 8 * 512, 512), // count exhausted: passes
            ],
        );
        assert_eq!(got, vec![(1, true), (2, true), (3, true), (4, false), (5, false), (6, true)]);
        assert_eq!(be.injected(), 2);
    }

    #[test]
    fn errors_are_the_classes_the_controller_maps() {
        let ram: Arc<dyn Backend> = Arc::new(RamBackend::new(1 << 20));
        let mem = GuestMemory::empty();
        for (spec, check) in [
            (
                "write/enospc",
                (|e: &BackendError| matches!(e, BackendError::NoSpace)) as fn(&BackendError) -> bool,
            ),
            ("write/rofs", |e| matches!(e, BackendError::ReadOnly)),
            ("write/short", |e| matches!(e, BackendError::Short { done: 256, len: 512 })),
            ("write/gone", |e| matches!(e, BackendError::NotReady(_))),
            ("write/eio", |e| matches!(e, BackendError::Io(io) if io.raw_os_error() == Some(libc::EIO))),
        ] {
            let be = FaultBackend::new(ram.clone(), vec![spec.parse().unwrap()]);
            let mut q = be.open_queue().unwrap();
            q.submit(&mem, req(1, Op::Write { fua: false }, 0, 512));
            let mut out = Vec::new();
            q.reap(&mut out);
            assert!(check(out[0].result.as_ref().unwrap_err()), "{spec}: {:?}", out[0].result);
        }
        // Flush matches rules without a range only.
        let be = FaultBackend::new(ram.clone(), vec!["any/eio/lba=0+1".parse().unwrap()]);
        assert_eq!(run(&be, vec![req(1, Op::Flush, 0, 0)]), vec![(1, true)]);
        let be = FaultBackend::new(ram, vec!["flush/eio".parse().unwrap()]);
        assert_eq!(run(&be, vec![req(1, Op::Flush, 0, 0)]), vec![(1, false)]);
    }

    #[test]
    fn a_hung_request_stays_in_flight_and_others_pass_it() {
        let ram: Arc<dyn Backend> = Arc::new(RamBackend::new(1 << 20));
        let be = FaultBackend::new(ram, vec!["read/hang/lba=0+1".parse().unwrap()]);
        let mem = GuestMemory::empty();
        let mut q = be.open_queue().unwrap();
        q.submit(&mem, req(1, Op::Read, 0, 512));
        q.submit(&mem, req(2, Op::Read, 512, 512));
        let mut out = Vec::new();
        q.reap(&mut out);
        assert_eq!(out.iter().map(|c| c.tag).collect::<Vec<_>>(), vec![2]);
        assert_eq!(q.in_flight(), 1, "the hung read is still in flight");
        assert!(!q.needs_polling(), "a hung request is not worth polling for");
        out.clear();
        assert_eq!(q.reap(&mut out), 0);
        drop(q); // releases the hung request and its buffer
    }

    #[test]
    fn delayed_requests_complete_after_the_delay_and_ask_for_polling() {
        let ram: Arc<dyn Backend> = Arc::new(RamBackend::new(1 << 20));
        let rules = vec!["write/delay=30".parse().unwrap(), "read/eio/delay=30".parse().unwrap()];
        let be = FaultBackend::new(ram, rules);
        let mem = GuestMemory::empty();
        let mut q = be.open_queue().unwrap();
        let start = Instant::now();
        q.submit(&mem, req(1, Op::Write { fua: false }, 0, 512));
        q.submit(&mem, req(2, Op::Read, 0, 512));
        q.submit(&mem, req(3, Op::Flush, 0, 0));
        q.commit();
        let mut out = Vec::new();
        q.reap(&mut out);
        assert_eq!(out.iter().map(|c| c.tag).collect::<Vec<_>>(), vec![3], "only the flush is undelayed");
        assert!(q.needs_polling(), "delayed requests need polling");
        while q.in_flight() > 0 {
            assert!(start.elapsed() < Duration::from_secs(10), "delayed requests never completed");
            std::thread::sleep(Duration::from_millis(1));
            q.reap(&mut out);
        }
        assert!(start.elapsed() >= Duration::from_millis(30));
        let mut got: Vec<_> = out.iter().map(|c| (c.tag, c.result.is_ok())).collect();
        got.sort();
        assert_eq!(got, vec![(1, true), (2, false), (3, true)]);
        assert!(!q.needs_polling());
    }
}
