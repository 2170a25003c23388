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
use nvme_spec::{Sqe, Status};

use super::IoEngine;
use crate::qos::QosGroup;
use crate::stats::OpClass;

/// A command waiting for its namespace's limits.
#[derive(Debug)]
pub(crate) struct Held {
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
    pub(crate) held_total: usize,
    /// The earliest time (clock ns) a held command may start, once looked at.
    pub(crate) next_release_ns: u64,
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

impl IoEngine {
    /// Makes namespace `nsid` draw from `group` (None: no limits). Held commands of it
    /// are looked at again on the next poll.
    pub(crate) fn set_qos(&mut self, nsid: u32, group: Option<Arc<QosGroup>>) {
        let i = nsid as usize - 1;
        let t = &mut self.throttle;
        if t.groups.len() <= i {
            t.groups.resize_with(i + 1, || None);
        }
        t.groups[i] = group;
        t.active = t.groups.iter().any(Option::is_some);
        t.next_release_ns = 0;
    }

    /// Lets a command just fetched start now (true), or holds it back (false).
    pub(crate) fn qos_admits(&mut self, sqid: u16, sqe: &Sqe) -> bool {
        if !self.throttle.active {
            return true;
        }
        let nsid = sqe.nsid.get();
        let i = (nsid as usize).wrapping_sub(1);
        let Some(g) = self.throttle.groups.get(i).and_then(Option::as_ref).cloned() else { return true };
        let Some(ns) = crate::namespace::lookup(&self.ctx.namespaces, nsid) else { return true };
        let clock = &self.ctx.clock;
        let now = *self.poll_now_ns.get_or_insert_with(|| clock.now_ns());
        let queued = self.throttle.held.get(i).is_some_and(|q| !q.is_empty());
        if !queued {
            let (class, bytes) = class_and_bytes(sqe, ns.lba_shift());
            let wait = g.admit(class, bytes, now);
            if wait == 0 {
                return true;
            }
            let t = &mut self.throttle;
            t.next_release_ns = t.next_release_ns.min(now + wait).max(1);
        }
        let t = &mut self.throttle;
        if t.held.len() <= i {
            t.held.resize_with(i + 1, VecDeque::new);
        }
        t.held[i].push_back(Held { sqid, sqe: *sqe, since_ns: now });
        t.held_total += 1;
        false
    }

    /// Starts held commands whose time has come, in order per namespace. True if any
    /// started.
    pub(crate) fn release_held(&mut self) -> bool {
        if self.throttle.held_total == 0 {
            return false;
        }
        let clock = &self.ctx.clock;
        let now = *self.poll_now_ns.get_or_insert_with(|| clock.now_ns());
        // A quiesce lets everything held back run now (state.rs).
        if now < self.throttle.next_release_ns && !self.quiesced {
            return false;
        }
        let mut next = u64::MAX;
        let mut started = false;
        for i in 0..self.throttle.held.len() {
            while let Some(front) = self.throttle.held[i].front() {
                let group = self.throttle.groups.get(i).and_then(Option::as_ref);
                let ns = crate::namespace::lookup(&self.ctx.namespaces, i as u32 + 1);
                let wait = match (group, ns) {
                    _ if self.quiesced => 0,
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
                let h = self.throttle.held[i].pop_front().expect("front exists");
                self.throttle.held_total -= 1;
                if let Some(ns) = ns {
                    ns.stats.throttled_commands.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    ns.stats.throttled_ns.fetch_add(now - h.since_ns, std::sync::atomic::Ordering::Relaxed);
                }
                self.run(h.sqid, h.sqe);
                started = true;
            }
        }
        self.throttle.next_release_ns = next;
        started
    }

    /// Completes, with `status`, the held commands `pick` chooses (by SQ and NSID).
    pub(crate) fn drop_held(&mut self, pick: impl Fn(u16, u32) -> bool, status: Status) {
        for i in 0..self.throttle.held.len() {
            let q = std::mem::take(&mut self.throttle.held[i]);
            for h in q {
                if pick(h.sqid, h.sqe.nsid.get()) {
                    self.throttle.held_total -= 1;
                    self.complete(h.sqid, h.sqe.cid(), status, 0, h.sqe.nsid.get(), 0);
                } else {
                    self.throttle.held[i].push_back(h);
                }
            }
        }
    }

    /// The earliest time (clock ns) a held command may start, if any is held.
    pub(crate) fn next_release(&self) -> Option<u64> {
        (self.throttle.held_total > 0).then_some(self.throttle.next_release_ns)
    }
}
