//! The pause between two looks at a doorbell in memory that a host is writing.
//!
//! A polling engine reads a mapped doorbell page (or a shadow doorbell) from guest
//! memory the host writes. A host at queue depth rings once per command, so while it
//! submits a burst the engine that has just drained the queue reads the same cache line
//! again at once, finds one more command, and reads again: every read takes the line
//! from the host's core, and the host's next doorbell store waits to take it back. The
//! cost falls on the host (measured with `vnvme perf`, mapped doorbells and polling:
//! the client, not the server, sets the pace at QD 16 and 64).
//!
//! So after a round of its queues in which an I/O queue had work, and before the next
//! round reads their doorbells again, a polling engine pauses for about [`GAP_NS`]:
//! long enough for a host in a burst to write a few more commands, short enough that a
//! host at QD 1 (which must see a completion before it submits again) has not
//! submitted yet, so no command waits for it. One pause per round, not per queue: many
//! busy queues are each other's pause. Interrupts owed are signalled before it. The
//! pause is `spin_loop` hints, counted once per process against the clock
//! ([`pauses`]), since a hint lasts from a few to more than a hundred cycles depending
//! on the CPU.
//!
//! Engines that sleep between commands (EventIdx armed, trapped doorbells, `--poll
//! off`) never pause: their host rings a doorbell the engine does not read.

use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// How long a polling engine waits after a round that found work.
///
/// 250 ns: on the development host a QD 1 round trip of `vnvme perf` is about 700 ns,
/// and pauses up to 400 ns made it faster still (less contention for the lines it
/// writes), 600 ns slower; at QD 16 and 64, 100 to 250 ns gave 6 to 14 % more.
pub(crate) const GAP_NS: u64 = 250;

/// The most hints one pause takes, whatever the clock said (a host preempted while
/// counting cannot make an engine stall).
const MAX_PAUSES: u32 = 64;

/// Waits about [`GAP_NS`].
#[inline]
pub(crate) fn pause() {
    for _ in 0..pauses() {
        std::hint::spin_loop();
    }
}

/// How many `spin_loop` hints last [`GAP_NS`] on this CPU: measured once, the
/// fastest of a few tries of a thousand hints (a try the scheduler interrupted only
/// reads slower, which gives fewer hints, never more).
fn pauses() -> u32 {
    static PAUSES: OnceLock<u32> = OnceLock::new();
    *PAUSES.get_or_init(|| {
        const HINTS: u32 = 1000;
        let fastest = (0..5)
            .map(|_| {
                let t = Instant::now();
                for _ in 0..HINTS {
                    std::hint::spin_loop();
                }
                t.elapsed()
            })
            .min()
            .unwrap_or(Duration::ZERO);
        hints_for(GAP_NS, fastest, HINTS)
    })
}

/// Hints that last `gap_ns`, when `hints` of them took `took`.
fn hints_for(gap_ns: u64, took: Duration, hints: u32) -> u32 {
    let took_ns = took.as_nanos().max(1) as u64;
    let n = gap_ns.saturating_mul(hints as u64) / took_ns;
    n.clamp(1, MAX_PAUSES as u64) as u32
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pause_lasts_the_gap_as_the_count_measured_it_and_never_more_than_the_bound() {
        // 1000 hints in 9.5 us (this development host): 250 ns is 26 of them.
        assert_eq!(hints_for(250, Duration::from_nanos(9_500), 1000), 26);
        // 140-cycle hints at 3 GHz: 5.
        assert_eq!(hints_for(250, Duration::from_nanos(46_000), 1000), 5);
        // A clock that did not move, or hints of no time: the bound.
        assert_eq!(hints_for(250, Duration::ZERO, 1000), MAX_PAUSES);
        // Counted while preempted for a millisecond: one hint, not none.
        assert_eq!(hints_for(250, Duration::from_millis(1), 1000), 1);
        let n = pauses();
        assert!((1..=MAX_PAUSES).contains(&n), "{n} hints");
    }
}
