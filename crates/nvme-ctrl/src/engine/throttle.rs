//! Commands QoS holds back (`crate::qos`): a command fetched while its namespace's
//! limits say "not yet" waits here, behind any other held command of its namespace,
//! until the moment the limits name; the engine's owner wakes for it through
//! `next_deadline`. Held commands stay counted in their SQ's in-flight total, so the
//! bound on work a guest leaves in flight holds for them too.
//!
//! A namespace without limits costs one slot lookup per command. Held commands of a
//! queue that is deleted complete with Command Aborted due to SQ Deletion; those of
//! a namespace that is removed, with Invalid Namespace.

use std::collections::VecDeque;
use std::sync::Arc;

use nvme_spec::nvm::ReadWrite;
use nvme_spec::opcode::nvm as op;
use nvme_spec::Sqe;

use crate::namespace::Namespace;
use crate::qos::QosGroup;
use crate::stats::OpClass;

/// A command waiting for its namespace's limits.
#[derive(Debug)]
struct Held {
    sqid: u16,
    sqe: Sqe,
    since_ns: u64,
}

/// QoS state of an engine: the group each namespace draws from (by nsid - 1) and the
/// commands held back per namespace.
#[derive(Debug, Default)]
pub(crate) struct Throttle {
    groups: Vec<Option<Arc<QosGroup>>>,
    held: Vec<VecDeque<Held>>,
    /// Commands held, over all namespaces.
    held_total: usize,
    /// The earliest time (clock ns) a held command may start, once looked at.
    next_release_ns: u64,
    /// Some namespace has limits: the check runs at all.
    active: bool,
}

/// How QoS counts a command: its kind and the bytes it moves.
fn class_and_bytes(sqe: &Sqe, lba_shift: u32) -> (OpClass, u64) {
    let bytes = |s: &Sqe| (ReadWrite(s).nlb() as u64) << lba_shift;
    match sqe.opcode() {
        op::READ => (OpClass::Read, bytes(sqe)),
        op::WRITE => (OpClass::Write, bytes(sqe)),
        op::FLUSH => (OpClass::Flush, 0),
        _ => (OpClass::Other, 0),
    }
}

impl Throttle {
    /// Makes namespace `nsid` draw from `group` (None: no limits). Held commands of it
    /// are looked at again on the next release.
    pub fn set_group(&mut self, nsid: u32, group: Option<Arc<QosGroup>>) {
        let i = nsid as usize - 1;
        if self.groups.len() <= i {
            self.groups.resize_with(i + 1, || None);
        }
        self.groups[i] = group;
        self.active = self.groups.iter().any(Option::is_some);
        self.next_release_ns = 0;
    }

    /// Lets command `sqe` from SQ `sqid`, on namespace `ns`, start now (true) or
    /// holds it back (false). `now` is read only when the namespace has limits.
    #[inline]
    pub fn admit(&mut self, sqid: u16, sqe: &Sqe, ns: Option<&Namespace>, now: impl FnOnce() -> u64) -> bool {
        if !self.active {
            return true;
        }
        let i = (sqe.nsid.get() as usize).wrapping_sub(1);
        let Some(g) = self.groups.get(i).and_then(Option::as_ref) else { return true };
        let Some(ns) = ns else { return true };
        let now = now();
        let queued = self.held.get(i).is_some_and(|q| !q.is_empty());
        if !queued {
            let (class, bytes) = class_and_bytes(sqe, ns.lba_shift());
            let wait = g.admit(class, bytes, now);
            if wait == 0 {
                return true;
            }
            self.next_release_ns = self.next_release_ns.min(now + wait).max(1);
        }
        if self.held.len() <= i {
            self.held.resize_with(i + 1, VecDeque::new);
        }
        self.held[i].push_back(Held { sqid, sqe: *sqe, since_ns: now });
        self.held_total += 1;
        false
    }

    /// Moves the held commands whose time has come into `out`, in order per
    /// namespace (`all`: every one, as a quiesce wants). `ns(nsid)` is the namespace
    /// of an NSID, if it is still active.
    pub fn release<'a>(
        &mut self,
        now: u64,
        all: bool,
        ns: impl Fn(u32) -> Option<&'a Arc<Namespace>>,
        out: &mut Vec<(u16, Sqe)>,
    ) {
        if self.held_total == 0 || (now < self.next_release_ns && !all) {
            return;
        }
        let mut next = u64::MAX;
        for i in 0..self.held.len() {
            while let Some(front) = self.held[i].front() {
                let group = self.groups.get(i).and_then(Option::as_ref);
                let ns = ns(i as u32 + 1);
                let wait = match (group, ns) {
                    _ if all => 0,
                    (Some(g), Some(ns)) => {
                        let (class, bytes) = class_and_bytes(&front.sqe, ns.lba_shift());
                        g.admit(class, bytes, now)
                    }
                    // No limits any more (or no namespace: it fails when it runs).
                    _ => 0,
                };
                if wait > 0 {
                    next = next.min(now + wait);
                    break;
                }
                let h = self.held[i].pop_front().expect("front exists");
                self.held_total -= 1;
                if let Some(ns) = ns {
                    ns.stats.throttled_commands.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    ns.stats.throttled_ns.fetch_add(now - h.since_ns, std::sync::atomic::Ordering::Relaxed);
                }
                out.push((h.sqid, h.sqe));
            }
        }
        self.next_release_ns = next;
    }

    /// Moves the held commands `pick` chooses (by SQ and NSID) into `out`.
    pub fn take_where(&mut self, pick: impl Fn(u16, u32) -> bool, out: &mut Vec<(u16, Sqe)>) {
        for q in &mut self.held {
            let before = q.len();
            q.retain(|h| {
                let take = pick(h.sqid, h.sqe.nsid.get());
                if take {
                    out.push((h.sqid, h.sqe));
                }
                !take
            });
            self.held_total -= before - q.len();
        }
    }

    /// Commands held back.
    #[inline]
    pub fn held(&self) -> usize {
        self.held_total
    }

    /// The earliest time (clock ns) a held command may start, if any is held.
    pub fn next_release(&self) -> Option<u64> {
        (self.held_total > 0).then_some(self.next_release_ns)
    }
}
