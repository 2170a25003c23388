//! A controller standing in for one whose process died (`vnvme serve
//! --restart-on-crash`): what survived is what the keeper journaled (CC, the admin
//! queue registers, the ANA states, the namespaces' formats), not the queues'
//! positions or the commands in flight. It reads as enabled with Controller Fatal Status, which a host resets
//! (Base §3.7); and so that the host need not wait for a command to time out
//! before it looks, it completes the host's outstanding Asynchronous Event Request
//! with Persistent Internal Error, as a drive does when its firmware starts again
//! after a crash (Linux resets the controller on it at once).

use nvme_spec::aer::{error_info, AsyncEvent, EventType};
use nvme_spec::opcode::admin;
use nvme_spec::regs::Csts;
use nvme_spec::{Cqe, Sqe};

use super::Controller;
use crate::lifecycle::Phase;
use crate::namespace::FormatState;

/// The admin queues as the host last programmed them (AQA, ASQ, ACQ).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct AdminQueues {
    pub aqa: u32,
    pub asq: u64,
    pub acq: u64,
}

impl AdminQueues {
    /// (ASQ entries, ACQ entries), as AQA gives them (0's based).
    fn sizes(&self) -> (u32, u32) {
        ((self.aqa & 0xfff) + 1, ((self.aqa >> 16) & 0xfff) + 1)
    }
}

/// Where the next completion of the admin CQ goes, read back from the host's
/// memory: the slot after the last one the dead controller wrote, and its phase;
/// with the SQ head the last completion reported.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct CqPosition {
    pub tail: u32,
    pub phase: bool,
    pub sq_head: u16,
}

/// The admin CQ's position from its entries' phase tags (`phases[i]`, with the SQ
/// head each reported): the entries of the current lap carry the phase of entry 0;
/// the first that does not is where the next goes. All alike: a lap ended at the
/// last slot, and the next goes at 0 with the other phase.
pub(crate) fn cq_position(phases: &[(bool, u16)]) -> Option<CqPosition> {
    let (&(p0, _), _) = phases.split_first()?;
    let tail = phases.iter().position(|&(p, _)| p != p0).unwrap_or(0) as u32;
    let phase = if tail == 0 { !p0 } else { p0 };
    let last = if tail == 0 { phases.len() - 1 } else { tail as usize - 1 };
    Some(CqPosition { tail, phase, sq_head: phases[last].1 })
}

/// The Asynchronous Event Request a host has outstanding: the last one in the SQ
/// before `sq_head` (the command fetched most recently of that kind), by CID.
pub(crate) fn outstanding_aer(sqes: &[(u8, u16)], sq_head: u16) -> Option<u16> {
    let n = sqes.len();
    if n == 0 || sq_head as usize >= n {
        return None;
    }
    (1..=n).map(|back| (sq_head as usize + n - back) % n).find_map(|i| {
        let (op, cid) = sqes[i];
        (op == admin::ASYNC_EVENT_REQUEST).then_some(cid)
    })
}

impl Controller {
    /// Moves each time Format NVM changes a namespace here.
    pub fn format_epoch(&self) -> u64 {
        self.admin.format_epoch
    }

    /// The formats of the namespaces here other than the pool's (whose format the
    /// pool keeps), by NSID: what a stand-in serves them in.
    pub fn formats_saved(&self) -> Vec<(u32, FormatState)> {
        self.namespaces()
            .filter(|n| !self.is_pool_namespace(n.nsid))
            .map(|n| (n.nsid, n.format_state()))
            .collect()
    }

    /// A stand-in puts its namespaces in the formats the host had chosen before the
    /// crash (`format::adopt` checks each: the journal came from a process a
    /// hostile VMM may have taken over); one that does not fit, or names no
    /// namespace here but the pool's, is left as it is, logged. The zones are as
    /// their state file has them, after that format's reset.
    pub fn restore_formats(&mut self, formats: &[(u32, FormatState)]) {
        for &(nsid, f) in formats {
            let ns =
                crate::namespace::lookup(&self.namespaces, nsid).filter(|_| !self.is_pool_namespace(nsid));
            match ns.map(|ns| crate::admin::format::adopt(ns, f)) {
                Some(Ok(false)) => {}
                Some(Ok(true)) => {
                    tracing::info!(nsid, lbaf = f.lbaf, "namespace format kept from before the crash")
                }
                Some(Err(why)) => {
                    tracing::warn!(nsid, lbaf = f.lbaf, "the format before the crash is not kept: {why}")
                }
                None => tracing::warn!(nsid, "the format before the crash names no namespace here: not kept"),
            }
        }
    }

    /// The ANA groups' states as set here (what a stand-in keeps: they are the
    /// operator's, not the host's).
    pub fn ana_saved(&self) -> crate::ana::AnaSaved {
        self.admin.ana.save()
    }

    /// This new controller stands in for one whose process died with its host's
    /// queues (a crash, not a hand-over): nothing of its state survived but CC as
    /// the host last wrote it (`cc`), the admin queue registers (`admin`) and the
    /// ANA states the operator had set (`ana`). A controller the host had enabled
    /// reads as ready with Controller Fatal Status (Base §3.7: the host resets it,
    /// and the commands it had outstanding are retried, on another path if it has
    /// one), and tells the host so through its outstanding Asynchronous Event
    /// Request ([`Self::post_crash_event`]); one it had not enabled is simply
    /// disabled, `cc` kept. Call it on a new controller, its memory set, before the
    /// host's first access.
    pub fn stand_in_after_crash(
        &mut self,
        cc: u32,
        admin: Option<AdminQueues>,
        ana: Option<&crate::ana::AnaSaved>,
    ) {
        match ana.map(|a| a.check()) {
            Some(Ok(c)) => self.admin.ana.restore(c),
            Some(Err(e)) => tracing::warn!("the ANA states before the crash are not kept: {e}"),
            None => {}
        }
        self.regs.set_cc(cc);
        if !self.regs.cc().en() {
            return;
        }
        self.regs.set_csts(Csts(Csts::RDY | Csts::CFS));
        self.phase = Phase::Fatal;
        let told = admin.and_then(|q| self.post_crash_event(q));
        tracing::warn!(
            cc = format_args!("{cc:#x}"),
            "standing in for a controller whose process died: CSTS.CFS set until the host resets it{}",
            match told {
                Some(cid) => format!("; told the host through its Asynchronous Event Request (CID {cid})"),
                None => "; no outstanding Asynchronous Event Request found: the host finds out when a command times out".into(),
            }
        );
    }

    /// Completes the host's outstanding Asynchronous Event Request with Error
    /// Status / Persistent Internal Error at the admin CQ's next slot, read back
    /// from the host's memory, and signals vector 0. The host owns that memory and
    /// may have put anything there: every read is bounded by AQA and goes through
    /// the memory map, and what is written is one completion in the host's own CQ.
    /// Returns the CID completed, or None (nothing found that reads as a queue).
    fn post_crash_event(&mut self, q: AdminQueues) -> Option<u16> {
        let (sqs, cqs) = q.sizes();
        if sqs < 2 || cqs < 2 || !q.asq.is_multiple_of(4096) || !q.acq.is_multiple_of(4096) {
            return None;
        }
        let mem = self.engine.io.mem.clone();
        let mut phases = Vec::with_capacity(cqs as usize);
        for i in 0..cqs as u64 {
            let c: Cqe = mem.read_obj(q.acq + i * 16).ok()?;
            phases.push((c.phase(), c.sqhd.get()));
        }
        let at = cq_position(&phases)?;
        let mut sqes = Vec::with_capacity(sqs as usize);
        for i in 0..sqs as u64 {
            let s: Sqe = mem.read_obj(q.asq + i * 64).ok()?;
            sqes.push((s.opcode(), s.cid()));
        }
        let cid = outstanding_aer(&sqes, at.sq_head)?;
        let event = AsyncEvent {
            kind: EventType::ErrorStatus,
            info: error_info::PERSISTENT_INTERNAL_ERROR,
            log_page: nvme_spec::log::lid::ERROR_INFORMATION,
        };
        let slot = q.acq + at.tail as u64 * 16;
        // Dwords 0-2 first, then dword 3 with the phase tag, as any completion.
        let head = [event.dw0(), 0, at.sq_head as u32].map(u32::to_le_bytes).concat();
        mem.write(slot, &head).ok()?;
        let dw3 = cid as u32 | ((at.phase as u32) << 16);
        mem.write(slot + 12, &dw3.to_le_bytes()).ok()?;
        self.engine.io.ctx.irq.signal(0);
        Some(cid)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_next_slot_is_where_the_phase_turns() {
        // First lap, three written.
        let p = [(true, 1), (true, 2), (true, 3), (false, 0), (false, 0)];
        assert_eq!(cq_position(&p), Some(CqPosition { tail: 3, phase: true, sq_head: 3 }));
        // Second lap (phase 0), two written over the first lap's.
        let p = [(false, 9), (false, 10), (true, 3), (true, 4)];
        assert_eq!(cq_position(&p), Some(CqPosition { tail: 2, phase: false, sq_head: 10 }));
        // A lap just ended: the next goes at 0 with the other phase.
        let p = [(true, 5), (true, 6), (true, 7)];
        assert_eq!(cq_position(&p), Some(CqPosition { tail: 0, phase: false, sq_head: 7 }));
        // Nothing ever written: slot 0, phase 1.
        let p = [(false, 0), (false, 0)];
        assert_eq!(cq_position(&p).map(|c| (c.tail, c.phase)), Some((0, true)));
        assert_eq!(cq_position(&[]), None);
    }

    #[test]
    fn the_outstanding_aer_is_the_last_fetched() {
        let aer = admin::ASYNC_EVENT_REQUEST;
        // Fetched up to slot 4 (head 4): the AER at 3, not the older one at 0.
        let s = [(aer, 31), (0x06, 1), (0x02, 2), (aer, 32), (0x06, 3), (aer, 33)];
        assert_eq!(outstanding_aer(&s, 4), Some(32));
        // Wrapping back past slot 0.
        assert_eq!(outstanding_aer(&s, 1), Some(31));
        assert_eq!(outstanding_aer(&s, 0), Some(33), "slot 5 came before 0");
        assert_eq!(outstanding_aer(&[(0x06, 1), (0x02, 2)], 1), None);
        assert_eq!(outstanding_aer(&s, 6), None, "a head past the queue");
    }
}
