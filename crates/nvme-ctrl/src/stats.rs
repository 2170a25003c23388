//! Counters the controller keeps: what the benchmarks and the guest tests read to
//! show shadow doorbells at work.

use serde::{Deserialize, Serialize};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

/// Live counters, shared with whoever wants to read them (Relaxed: they are statistics).
///
/// Each engine counts in a shard of its own (a load and a store: no locked
/// read-modify-write, about 20 cycles each, on a path that runs millions of commands
/// a second); the base holds what a restore set. A snapshot adds the shards to it.
#[derive(Debug, Default)]
pub struct Stats {
    /// By [`Count`]: what a restore set, less what the shards held then.
    base: [AtomicU64; Count::N],
    /// The engines' shards.
    shards: Shards<[AtomicU64; Count::N]>,
}

/// Declares the counters once: each line gives a counter's snapshot field (the key
/// in the stats file, the control socket's JSON and a saved state), its [`Count`],
/// its Prometheus name, its label in `vnvme ctl stats.get` and how that shows it;
/// its doc comment is the metric's help. The macro makes [`Count`],
/// [`StatsSnapshot`], [`StatsSaved`], the snapshot, the restore, the difference,
/// the look-up by name and [`StatsSnapshot::COUNTERS`] from it, so a new counter is
/// a line here plus where it is counted.
macro_rules! counters {
    ($($(#[doc = $doc:literal])* $([$serde:meta])?
       $field:ident => $count:ident, $metric:literal, $label:literal, $shown:ident;)*) => {
        /// The counters of [`Stats`].
        #[derive(Clone, Copy, Debug)]
        pub(crate) enum Count {
            $($(#[doc = $doc])* $count,)*
        }

        impl Count {
            const N: usize = [$(stringify!($count)),*].len();
        }

        /// A plain copy of [`Stats`] at one moment (serialised with the counters'
        /// names as keys: the stats file and the control socket show it so).
        #[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
        pub struct StatsSnapshot {
            $($(#[doc = $doc])* $(#[$serde])? pub $field: u64,)*
        }

        /// The counters' part of a saved controller state.
        #[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
        pub struct StatsSaved {
            $($(#[$serde])? pub $field: u64,)*
        }

        impl StatsSnapshot {
            /// Every counter's name, as the stats file and the control socket key it.
            pub const NAMES: [&'static str; Count::N] = [$(stringify!($field)),*];

            /// Every counter as operators see it, in the order of [`StatsSnapshot::values`].
            pub const COUNTERS: [Counter; Count::N] = [$(Counter {
                key: stringify!($field),
                metric: $metric,
                help: concat!($($doc),*),
                label: $label,
                shown: Shown::$shown,
            }),*];

            /// The counters' values, in the order of [`StatsSnapshot::COUNTERS`].
            pub fn values(&self) -> [u64; Count::N] {
                [$(self.$field),*]
            }

            /// The counter called `name`, if there is one.
            pub fn get(&self, name: &str) -> Option<u64> {
                match name {
                    $(stringify!($field) => Some(self.$field),)*
                    _ => None,
                }
            }

            fn from_values(v: &[u64; Count::N]) -> StatsSnapshot {
                StatsSnapshot { $($field: v[Count::$count as usize],)* }
            }
        }

        impl Stats {
            /// Sets every counter to a saved value (a restored controller).
            pub(crate) fn restore(&self, s: &StatsSaved) {
                // The shards keep what they counted (their owners write them): the
                // base takes the rest, so that a snapshot shows the saved values.
                let e = self.sharded();
                $(self.base[Count::$count as usize]
                    .store(s.$field.wrapping_sub(e[Count::$count as usize]), Ordering::Relaxed);)*
            }
        }

        impl std::ops::Sub for StatsSnapshot {
            type Output = StatsSnapshot;
            fn sub(self, o: StatsSnapshot) -> StatsSnapshot {
                StatsSnapshot { $($field: self.$field - o.$field,)* }
            }
        }

        impl From<StatsSnapshot> for StatsSaved {
            fn from(s: StatsSnapshot) -> Self {
                StatsSaved { $($field: s.$field,)* }
            }
        }
    };
}

/// One controller counter as operators see it (a row of [`counters!`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Counter {
    /// Its key in the stats file, the control socket's JSON and a saved state.
    pub key: &'static str,
    /// Its Prometheus name, without the `vnvme_` prefix and the `_total` suffix.
    pub metric: &'static str,
    /// The metric's help: the counter's doc comment (each line begins with a space).
    pub help: &'static str,
    /// Its label in `vnvme ctl stats.get`.
    pub label: &'static str,
    pub shown: Shown,
}

/// How `vnvme ctl stats.get` shows a counter.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Shown {
    /// The count alone.
    Count,
    /// The count and how many there were per I/O command.
    PerIo,
    /// A number of bytes, in the unit that reads best.
    Bytes,
}

counters! {
    /// I/O commands completed, over all namespaces and queues.
    io_commands => IoCommands, "io_commands", "I/O commands", Count;
    /// Read commands completed, over all namespaces.
    read_commands => ReadCommands, "read_commands", "read commands", Count;
    /// Write commands completed, over all namespaces.
    write_commands => WriteCommands, "write_commands", "write commands", Count;
    /// Admin commands completed (Identify, queue creation and deletion, Get Log Page,
    /// features, ...).
    admin_commands => AdminCommands, "admin_commands", "admin commands", Count;
    /// Data bytes Read commands moved to the guest, over all namespaces.
    bytes_read => BytesRead, "read_bytes", "data read", Bytes;
    /// Data bytes Write commands moved from the guest, over all namespaces.
    bytes_written => BytesWritten, "written_bytes", "data written", Bytes;
    /// Commands, admin and I/O, completed with an error status.
    errors => Errors, "command_errors", "command errors", Count;
    /// Requests to the storage backends that failed, for any reason.
    backend_errors => BackendErrors, "backend_errors", "backend errors", Count;
    /// Commands failed with a media error: the backend could not read or write the
    /// data.
    media_errors => MediaErrors, "media_errors", "media errors", Count;
    /// Commands completed with an error because their backend did not answer in time
    /// (the namespace's timeout, or the bound on deleting a queue).
    timeouts => Timeouts, "command_timeouts", "command timeouts", Count;
    /// Doorbell register writes that trapped to the controller (a VM exit each), all
    /// queues. With shadow doorbells most updates do not trap.
    doorbell_writes => DoorbellWrites, "doorbell_writes", "doorbell writes", Count;
    /// Trapped doorbell writes to I/O queues only; divided by vnvme_io_commands_total,
    /// the traps each I/O costs.
    io_doorbell_writes => IoDoorbellWrites, "io_doorbell_writes", "I/O doorbell writes", PerIo;
    /// Of the trapped I/O doorbell writes, those to completion queue heads. With
    /// shadow doorbells the controller keeps CQ EventIdx one entry behind the head, so
    /// a host following the EventIdx rule writes these about once per queue wrap.
    io_cq_doorbell_writes => IoCqDoorbellWrites, "io_cq_doorbell_writes", "  of them CQ heads", PerIo;
    /// Reads of the shadow doorbell buffer (Doorbell Buffer Config), which tell the
    /// controller new queue tails and heads without a trap.
    shadow_reads => ShadowReads, "shadow_doorbell_reads", "shadow doorbell reads", PerIo;
    /// Times the controller, about to stop polling a queue, found new work the host
    /// posted meanwhile (the EventIdx re-check caught it; no I/O waits for a trap).
    eventidx_races => EventidxRaces, "eventidx_races", "EventIdx races", Count;
    /// Times a polling controller, having found work, paused about 250 ns before
    /// reading the doorbells in memory again, so a host ringing once per command
    /// writes a few more meanwhile.
    [serde(default)]
    doorbell_pauses => DoorbellPauses, "doorbell_pauses", "doorbell pauses", PerIo;
    /// Interrupts signalled to the guest, all queues.
    interrupts => Interrupts, "interrupts", "interrupts", PerIo;
}

/// Counters one owner at a time writes: shards of a set of counters anyone may read.
/// A dropped owner's shard goes back to the set for the next owner (its counts stay,
/// and the next owner adds to them), so the set is as large as the most owners
/// there were at once.
#[derive(Debug, Default)]
pub(crate) struct Shards<T> {
    list: Mutex<Vec<Arc<Shard<T>>>>,
}

#[derive(Debug, Default)]
#[repr(align(64))]
struct Shard<T> {
    /// An owner holds it.
    taken: AtomicBool,
    counts: T,
}

/// One owner's shard, given back when dropped.
#[derive(Debug)]
pub(crate) struct Owned<T>(Arc<Shard<T>>);

impl<T: Default> Shards<T> {
    /// A shard no one else holds: a free one, or a new one.
    pub(crate) fn take(&self) -> Owned<T> {
        let mut list = self.list.lock().unwrap_or_else(|p| p.into_inner());
        // Acquire: the last owner's counts are seen before this owner adds to them.
        let free = list
            .iter()
            .find(|s| s.taken.compare_exchange(false, true, Ordering::Acquire, Ordering::Relaxed).is_ok());
        let shard = match free {
            Some(s) => s.clone(),
            None => {
                let s = Arc::new(Shard { taken: AtomicBool::new(true), counts: T::default() });
                list.push(s.clone());
                s
            }
        };
        Owned(shard)
    }
}

impl<T> Shards<T> {
    /// Runs `f` on every shard's counters, held or not.
    pub(crate) fn each(&self, mut f: impl FnMut(&T)) {
        let list = self.list.lock().unwrap_or_else(|p| p.into_inner());
        list.iter().for_each(|s| f(&s.counts));
    }
}

impl<T> Owned<T> {
    pub(crate) fn counts(&self) -> &T {
        &self.0.counts
    }
}

impl<T> Drop for Owned<T> {
    fn drop(&mut self) {
        // Release: the next owner sees these counts.
        self.0.taken.store(false, Ordering::Release);
    }
}

/// Adds `n` to a counter no other thread writes: a load and a store.
#[inline]
pub(crate) fn add_owned(c: &AtomicU64, n: u64) {
    c.store(c.load(Ordering::Relaxed).wrapping_add(n), Ordering::Relaxed);
}

/// An engine's shard of [`Stats`].
#[derive(Debug)]
pub(crate) struct EngineCounts(Owned<[AtomicU64; Count::N]>);

impl EngineCounts {
    #[inline]
    pub(crate) fn add(&self, c: Count, n: u64) {
        add_owned(&self.0.counts()[c as usize], n);
    }
}

impl Stats {
    /// A shard for an engine to count in.
    pub(crate) fn engine_counts(&self) -> EngineCounts {
        EngineCounts(self.shards.take())
    }

    /// The engines' counts, summed.
    fn sharded(&self) -> [u64; Count::N] {
        let mut sum = [0u64; Count::N];
        self.shards.each(|c| {
            sum.iter_mut().zip(c).for_each(|(s, c)| *s = s.wrapping_add(c.load(Ordering::Relaxed)))
        });
        sum
    }

    /// Every counter: the base and the shards.
    fn values(&self) -> [u64; Count::N] {
        let mut v = self.sharded();
        v.iter_mut().zip(&self.base).for_each(|(v, b)| *v = v.wrapping_add(b.load(Ordering::Relaxed)));
        v
    }

    /// Counts `n` I/O commands as completed (tests that need a busy controller).
    #[cfg(test)]
    pub(crate) fn add_io_commands(&self, n: u64) {
        self.base[Count::IoCommands as usize].fetch_add(n, Ordering::Relaxed);
    }

    /// I/O commands completed.
    pub fn io_commands(&self) -> u64 {
        self.values()[Count::IoCommands as usize]
    }

    pub fn snapshot(&self) -> StatsSnapshot {
        StatsSnapshot::from_values(&self.values())
    }
}

/// Upper bounds, in nanoseconds, of the command latency histogram's buckets (10 µs to
/// 10 s, 1-2.5-5 steps); a last bucket holds everything above.
pub const LATENCY_BOUNDS_NS: [u64; 19] = [
    10_000,
    25_000,
    50_000,
    100_000,
    250_000,
    500_000,
    1_000_000,
    2_500_000,
    5_000_000,
    10_000_000,
    25_000_000,
    50_000_000,
    100_000_000,
    250_000_000,
    500_000_000,
    1_000_000_000,
    2_500_000_000,
    5_000_000_000,
    10_000_000_000,
];

/// Buckets of the latency histogram: one per bound and one above.
pub const LATENCY_BUCKETS: usize = LATENCY_BOUNDS_NS.len() + 1;

/// The kinds of command a namespace counts apart.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OpClass {
    Read,
    Write,
    Flush,
    /// Everything else (Write Zeroes, Dataset Management, Compare, Verify).
    Other,
}

impl OpClass {
    /// How a namespace counts an I/O command of `opcode`.
    #[inline]
    pub(crate) fn of(opcode: u8) -> Self {
        use nvme_spec::opcode::nvm as op;
        match opcode {
            op::READ => OpClass::Read,
            op::WRITE | nvme_spec::opcode::zns::ZONE_APPEND => OpClass::Write,
            op::FLUSH => OpClass::Flush,
            _ => OpClass::Other,
        }
    }
}

/// Counters of one kind of command on one namespace. Several engines complete
/// commands of one namespace, so they are shared atomics; each kind has its own
/// cache line, so readers and writers of different kinds do not collide.
#[derive(Debug, Default)]
#[repr(align(64))]
pub struct OpStats {
    pub commands: AtomicU64,
    pub bytes: AtomicU64,
    /// Commands completed with an error status.
    pub errors: AtomicU64,
    /// From fetch to completion posted, per bucket of [`LATENCY_BOUNDS_NS`].
    pub latency: [AtomicU64; LATENCY_BUCKETS],
    pub latency_sum_ns: AtomicU64,
}

/// A copy of [`OpStats`]; `latency` per bucket (not cumulative).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct OpSnapshot {
    pub commands: u64,
    pub bytes: u64,
    pub errors: u64,
    pub latency: [u64; LATENCY_BUCKETS],
    pub latency_sum_ns: u64,
}

impl OpStats {
    /// Counts one command that moved `bytes` and took `latency_ns`, adding with
    /// `add` (a shared counter's read-modify-write, or an owned one's load and store).
    #[inline]
    fn record_with(&self, bytes: u64, latency_ns: u64, ok: bool, add: impl Fn(&AtomicU64, u64)) {
        add(&self.commands, 1);
        if bytes > 0 {
            add(&self.bytes, bytes);
        }
        if !ok {
            add(&self.errors, 1);
        }
        let b = LATENCY_BOUNDS_NS.partition_point(|&bound| bound < latency_ns);
        add(&self.latency[b], 1);
        add(&self.latency_sum_ns, latency_ns);
    }

    /// Counts one command that moved `bytes` and took `latency_ns` (any thread).
    #[cfg(test)]
    pub(crate) fn record(&self, bytes: u64, latency_ns: u64, ok: bool) {
        self.record_with(bytes, latency_ns, ok, |c, n| {
            c.fetch_add(n, Ordering::Relaxed);
        });
    }

    /// Sets every counter so that, with `less` added, it shows `s`.
    fn restore_less(&self, s: &OpSnapshot, less: &OpSnapshot) {
        let set = |c: &AtomicU64, v: u64, l: u64| c.store(v.wrapping_sub(l), Ordering::Relaxed);
        set(&self.commands, s.commands, less.commands);
        set(&self.bytes, s.bytes, less.bytes);
        set(&self.errors, s.errors, less.errors);
        self.latency.iter().zip(s.latency).zip(less.latency).for_each(|((c, v), l)| set(c, v, l));
        set(&self.latency_sum_ns, s.latency_sum_ns, less.latency_sum_ns);
    }

    /// What these counters hold, added to `to`.
    fn add_to(&self, to: &mut OpSnapshot) {
        let g = |c: &AtomicU64| c.load(Ordering::Relaxed);
        to.commands = to.commands.wrapping_add(g(&self.commands));
        to.bytes = to.bytes.wrapping_add(g(&self.bytes));
        to.errors = to.errors.wrapping_add(g(&self.errors));
        to.latency.iter_mut().zip(&self.latency).for_each(|(t, c)| *t = t.wrapping_add(g(c)));
        to.latency_sum_ns = to.latency_sum_ns.wrapping_add(g(&self.latency_sum_ns));
    }

    #[cfg(test)]
    fn snapshot(&self) -> OpSnapshot {
        let g = |c: &AtomicU64| c.load(Ordering::Relaxed);
        OpSnapshot {
            commands: g(&self.commands),
            bytes: g(&self.bytes),
            errors: g(&self.errors),
            latency: std::array::from_fn(|i| g(&self.latency[i])),
            latency_sum_ns: g(&self.latency_sum_ns),
        }
    }
}

/// What one namespace counts: commands, bytes, errors and latency by kind, and the
/// time its commands spent held back by QoS. Each engine counts its commands in a
/// shard of its own (see [`Stats`]); a snapshot adds the shards to the base.
#[derive(Debug, Default)]
pub struct NsStats {
    /// What a restore set, less what the shards held then.
    base: OpCounts,
    /// Commands QoS held back, and the nanoseconds they waited in all.
    pub throttled_commands: AtomicU64,
    pub throttled_ns: AtomicU64,
    shards: Shards<OpCounts>,
}

/// Counters by kind of command, in [`OpClass`] order.
#[derive(Debug, Default)]
pub(crate) struct OpCounts([OpStats; 4]);

impl OpClass {
    #[inline]
    fn index(self) -> usize {
        match self {
            OpClass::Read => 0,
            OpClass::Write => 1,
            OpClass::Flush => 2,
            OpClass::Other => 3,
        }
    }
}

/// An engine's shard of one namespace's [`NsStats`].
#[derive(Debug)]
pub(crate) struct NsCounts(Owned<OpCounts>);

impl NsCounts {
    /// Counts one command of `class` that moved `bytes` and took `latency_ns`.
    #[inline]
    pub(crate) fn record(&self, class: OpClass, bytes: u64, latency_ns: u64, ok: bool) {
        self.0.counts().0[class.index()].record_with(bytes, latency_ns, ok, add_owned);
    }
}

impl NsStats {
    /// A shard for an engine to count this namespace's commands in.
    pub(crate) fn engine_counts(&self) -> NsCounts {
        NsCounts(self.shards.take())
    }

    /// The shards' counts by kind.
    fn sharded(&self) -> [OpSnapshot; 4] {
        let mut sum = [OpSnapshot::default(); 4];
        self.shards.each(|c| sum.iter_mut().zip(&c.0).for_each(|(s, o)| o.add_to(s)));
        sum
    }

    /// Sets every counter to a saved value (a restored controller).
    pub(crate) fn restore(&self, s: &NsStatsSnapshot) {
        let e = self.sharded();
        let saved = [&s.read, &s.write, &s.flush, &s.other];
        for ((base, saved), less) in self.base.0.iter().zip(saved).zip(&e) {
            base.restore_less(saved, less);
        }
        self.throttled_commands.store(s.throttled_commands, Ordering::Relaxed);
        self.throttled_ns.store(s.throttled_ns, Ordering::Relaxed);
    }

    pub fn snapshot(&self) -> NsStatsSnapshot {
        let mut k = self.sharded();
        for (base, s) in self.base.0.iter().zip(&mut k) {
            base.add_to(s);
        }
        let [read, write, flush, other] = k;
        NsStatsSnapshot {
            read,
            write,
            flush,
            other,
            throttled_commands: self.throttled_commands.load(Ordering::Relaxed),
            throttled_ns: self.throttled_ns.load(Ordering::Relaxed),
        }
    }
}

/// A copy of [`NsStats`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct NsStatsSnapshot {
    pub read: OpSnapshot,
    pub write: OpSnapshot,
    pub flush: OpSnapshot,
    pub other: OpSnapshot,
    pub throttled_commands: u64,
    pub throttled_ns: u64,
}

/// What one I/O queue pair counts. Only the engine that owns the queue writes them
/// (a load and a store, no read-modify-write); anyone may read.
#[derive(Debug, Default)]
pub struct QueueStats {
    /// Commands fetched from the SQ.
    pub commands: AtomicU64,
    /// Trapped writes of the SQ tail and of the CQ head doorbell registers.
    pub sq_doorbell_writes: AtomicU64,
    pub cq_doorbell_writes: AtomicU64,
    /// Completions posted to the CQ, and interrupts signalled for it.
    pub completions: AtomicU64,
    pub interrupts: AtomicU64,
}

/// A copy of [`QueueStats`] with the queue it belongs to.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct QueueSnapshot {
    pub qid: u16,
    /// The worker that owns the queue (None: the controller's own thread).
    pub worker: Option<usize>,
    pub commands: u64,
    pub sq_doorbell_writes: u64,
    pub cq_doorbell_writes: u64,
    pub completions: u64,
    pub interrupts: u64,
}

impl QueueStats {
    /// Adds `n` to a counter only its owner writes.
    pub(crate) fn bump(c: &AtomicU64, n: u64) {
        c.store(c.load(Ordering::Relaxed).wrapping_add(n), Ordering::Relaxed);
    }

    /// Sets every counter to a saved value (a restored controller).
    pub(crate) fn restore(&self, s: &QueueSnapshot) {
        let set = |c: &AtomicU64, v: u64| c.store(v, Ordering::Relaxed);
        set(&self.commands, s.commands);
        set(&self.sq_doorbell_writes, s.sq_doorbell_writes);
        set(&self.cq_doorbell_writes, s.cq_doorbell_writes);
        set(&self.completions, s.completions);
        set(&self.interrupts, s.interrupts);
    }

    pub fn snapshot(&self, qid: u16, worker: Option<usize>) -> QueueSnapshot {
        let g = |c: &AtomicU64| c.load(Ordering::Relaxed);
        QueueSnapshot {
            qid,
            worker,
            commands: g(&self.commands),
            sq_doorbell_writes: g(&self.sq_doorbell_writes),
            cq_doorbell_writes: g(&self.cq_doorbell_writes),
            completions: g(&self.completions),
            interrupts: g(&self.interrupts),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_counter_has_one_key_one_metric_one_label_and_help() {
        let c = StatsSnapshot::COUNTERS;
        assert_eq!(c.map(|c| c.key), StatsSnapshot::NAMES);
        for (i, a) in c.iter().enumerate() {
            let ok = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_lowercase() || b == b'_');
            assert!(ok(a.metric) && !a.metric.ends_with("_total"), "{a:?}: the encoder adds _total");
            assert!(a.help.starts_with(' ') && a.help.len() > 30, "{a:?}: its doc comment is its help");
            for b in &c[i + 1..] {
                assert!(a.metric != b.metric && a.label != b.label, "{a:?} and {b:?}");
            }
        }
        // The values come in the same order as the rows.
        let s = StatsSnapshot { doorbell_pauses: 7, ..Default::default() };
        let at = c.iter().position(|c| c.key == "doorbell_pauses").unwrap();
        assert_eq!(s.values().iter().position(|&v| v == 7), Some(at));
    }

    #[test]
    fn every_counter_is_named_as_the_stats_file_keys_it_and_saved_and_restored() {
        let stats = Stats::default();
        let c = stats.engine_counts();
        for (i, n) in (0..Count::N).zip(1u64..) {
            stats.base[i].store(n, Ordering::Relaxed);
        }
        c.add(Count::BytesWritten, 100);
        let snap = stats.snapshot();
        let json = serde_json::to_value(snap).unwrap();
        let keys: std::collections::BTreeSet<&str> =
            json.as_object().unwrap().keys().map(String::as_str).collect();
        assert_eq!(keys, StatsSnapshot::NAMES.into_iter().collect(), "the stats file's keys");
        for (name, n) in StatsSnapshot::NAMES.iter().zip(1u64..) {
            let want = if *name == "bytes_written" { n + 100 } else { n };
            assert_eq!(snap.get(name), Some(want), "{name}");
            assert_eq!(json[name], want, "{name}");
        }
        assert_eq!(snap.get("no_such_counter"), None);
        // Saved, and restored into a controller whose engine already counted.
        let again = Stats::default();
        let other = again.engine_counts();
        other.add(Count::Interrupts, 7);
        again.restore(&StatsSaved::from(snap));
        assert_eq!(again.snapshot(), snap);
        assert_eq!(snap - snap, StatsSnapshot::default());
        // What an older build saved, without doorbell_pauses: 0.
        let mut old = serde_json::to_value(StatsSaved::from(snap)).unwrap();
        old.as_object_mut().unwrap().remove("doorbell_pauses");
        let saved: StatsSaved = serde_json::from_value(old).unwrap();
        assert_eq!(saved.doorbell_pauses, 0);
    }

    #[test]
    fn latency_lands_in_the_bucket_its_bound_names() {
        let s = OpStats::default();
        for ns in [0, 10_000, 10_001, 999_999, 10_000_000_000, 10_000_000_001, u64::MAX / 2] {
            s.record(4096, ns, true);
        }
        let snap = s.snapshot();
        assert_eq!(snap.latency[0], 2, "<= 10 µs");
        assert_eq!(snap.latency[1], 1, "10 µs < x <= 25 µs");
        assert_eq!(snap.latency[6], 1, "500 µs < x <= 1 ms");
        assert_eq!(snap.latency[18], 1, "<= 10 s");
        assert_eq!(snap.latency[19], 2, "above");
        assert_eq!((snap.commands, snap.bytes, snap.errors), (7, 7 * 4096, 0));
    }

    #[test]
    fn shards_add_up_outlive_their_owners_and_take_a_restore() {
        let stats = Stats::default();
        let (a, b) = (stats.engine_counts(), stats.engine_counts());
        a.add(Count::IoCommands, 3);
        b.add(Count::IoCommands, 4);
        b.add(Count::BytesRead, 4096);
        stats.add_io_commands(10);
        assert_eq!(stats.io_commands(), 17);
        assert_eq!((stats.snapshot().io_commands, stats.snapshot().bytes_read), (17, 4096));
        // A dropped owner's counts stay, and its shard is the next owner's.
        drop(a);
        assert_eq!(stats.snapshot().io_commands, 17);
        let c = stats.engine_counts();
        c.add(Count::IoCommands, 1);
        assert_eq!(stats.snapshot().io_commands, 18);
        let mut shards = 0;
        stats.shards.each(|_| shards += 1);
        assert_eq!(shards, 2, "the free shard was reused");
        // A restore shows the saved values with the shards still held.
        let saved = StatsSaved { io_commands: 5, bytes_read: 0, interrupts: 2, ..Default::default() };
        stats.restore(&saved);
        let s = stats.snapshot();
        assert_eq!((s.io_commands, s.bytes_read, s.interrupts), (5, 0, 2));
        c.add(Count::IoCommands, 1);
        assert_eq!(stats.snapshot().io_commands, 6);
        assert_eq!(StatsSaved::from(stats.snapshot()).io_commands, 6);

        let ns = NsStats::default();
        let (x, y) = (ns.engine_counts(), ns.engine_counts());
        x.record(OpClass::Read, 4096, 20_000, true);
        y.record(OpClass::Read, 8192, 5_000, false);
        y.record(OpClass::Flush, 0, 5_000, true);
        let s = ns.snapshot();
        assert_eq!((s.read.commands, s.read.bytes, s.read.errors, s.flush.commands), (2, 12288, 1, 1));
        assert_eq!((s.read.latency[0], s.read.latency[1], s.read.latency_sum_ns), (1, 1, 25_000));
        let saved = NsStatsSnapshot { write: OpSnapshot { commands: 9, ..Default::default() }, ..s };
        ns.restore(&NsStatsSnapshot { read: OpSnapshot::default(), ..saved });
        let r = ns.snapshot();
        assert_eq!((r.read, r.write.commands, r.flush.commands), (OpSnapshot::default(), 9, 1));
        drop((x, y));
        assert_eq!(ns.snapshot(), r);
    }
}
