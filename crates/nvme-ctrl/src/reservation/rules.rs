//! The reservation rules (Base §8.1.22) on one namespace's state, as plain data:
//! who is registered with which key, who holds the reservation of which type,
//! what each Register, Acquire and Release does to that, which commands of a
//! host conflict, and which notifications each change owes which controllers.
//! No I/O and no locking here: `store` keeps the state and shares it.

use nvme_spec::resv::{cptpl, notification, racqa, rrega, rrela, ReservationType};
use nvme_spec::Status;
use serde::{Deserialize, Serialize};

/// A host's identifier (Host Identifier feature); an 8-byte one is kept in the
/// first 8 bytes.
pub type HostId = [u8; 16];

/// The host and controller a command comes through.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Requester {
    pub host: HostId,
    pub cntlid: u16,
}

/// A registered host: its key, and the controllers it registered through (a
/// Reservation Report lists each).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Registrant {
    pub host: HostId,
    pub key: u64,
    pub cntlids: Vec<u16>,
}

/// One namespace's reservation state: what every controller of the subsystem
/// shares.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ResvState {
    /// Counts registrations, unregistrations, key replacements and preemptions
    /// (Reservation Report's Generation).
    pub generation: u32,
    pub registrants: Vec<Registrant>,
    /// The reservation's type (None: no reservation).
    pub rtype: Option<u8>,
    /// Its holder (for the all-registrants types: None, every registrant holds it).
    pub holder: Option<HostId>,
    /// Persist Through Power Loss.
    pub ptpl: bool,
    /// Notifications owed to controllers: (CNTLID, log page type), oldest first.
    pub notices: Vec<(u16, u8)>,
    /// The Host Identifier each controller's host gave it (Set Features 81h), by
    /// CNTLID: a host's notifications reach every controller it named itself on,
    /// not only those it registered through.
    #[serde(default)]
    pub named: Vec<(u16, HostId)>,
}

/// Most notifications kept waiting for a controller that does not take them.
const MAX_NOTICES: usize = 1024;

/// Most registrants a namespace takes (a host that registers more is refused).
pub const MAX_REGISTRANTS: usize = 128;

/// Most controllers whose host's identifier a state keeps (CNTLIDs of a
/// subsystem's controllers; the namespace pool has at most 64).
pub const MAX_NAMED: usize = 256;

/// Commands as the reservation rules see them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Access {
    Read,
    Write,
}

/// What a Register, Acquire or Release asks first: its action, and the key it
/// holds (CRKEY), which is not checked when IEKEY is set.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Ask {
    pub action: u8,
    pub iekey: bool,
    pub crkey: u64,
}

impl ResvState {
    fn registrant(&self, host: &HostId) -> Option<&Registrant> {
        self.registrants.iter().find(|r| &r.host == host)
    }

    fn kind(&self) -> Option<ReservationType> {
        self.rtype.and_then(ReservationType::from_u8)
    }

    /// `host` holds the reservation.
    pub fn holds(&self, host: &HostId) -> bool {
        match self.kind() {
            None => false,
            Some(t) if t.all_registrants() => self.registrant(host).is_some(),
            Some(_) => self.holder.as_ref() == Some(host),
        }
    }

    /// Whether `host` may run a command of kind `access` (Base, "Command
    /// Behavior in the Presence of a Reservation").
    pub fn allows(&self, host: &HostId, access: Access) -> bool {
        let Some(t) = self.kind() else { return true };
        if access == Access::Read && !t.exclusive_access() {
            return true;
        }
        self.holds(host) || (t.registrants_may_access() && self.registrant(host).is_some())
    }

    /// The key check every action but a first registration makes: the host is a
    /// registrant, and its key is `crkey` unless `iekey`.
    fn checked_key(&self, me: &Requester, crkey: u64, iekey: bool) -> Result<usize, Status> {
        let i =
            self.registrants.iter().position(|r| r.host == me.host).ok_or(Status::RESERVATION_CONFLICT)?;
        if !iekey && self.registrants[i].key != crkey {
            return Err(Status::RESERVATION_CONFLICT);
        }
        Ok(i)
    }

    fn notify(&mut self, hosts: impl IntoIterator<Item = HostId>, kind: u8, except: &HostId) {
        let owed: Vec<(u16, u8)> = hosts
            .into_iter()
            .filter(|h| h != except)
            .flat_map(|h| self.controllers_of(&h))
            .map(|c| (c, kind))
            .collect();
        self.notify_cntlids(owed);
    }

    /// Every controller of `host`: those it registered through, and those it
    /// named itself on.
    fn controllers_of(&self, host: &HostId) -> Vec<u16> {
        let mut c = self.registrant(host).map(|r| r.cntlids.clone()).unwrap_or_default();
        c.extend(self.named.iter().filter(|(_, h)| h == host).map(|&(cntlid, _)| cntlid));
        c.sort_unstable();
        c.dedup();
        c
    }

    /// Controller `cntlid`'s host now names itself `host` (all zeroes: none). The
    /// oldest entry goes past [`MAX_NAMED`].
    pub fn name_host(&mut self, cntlid: u16, host: HostId) {
        self.named.retain(|&(c, _)| c != cntlid);
        if host != [0; 16] {
            self.named.push((cntlid, host));
        }
        let over = self.named.len().saturating_sub(MAX_NAMED);
        self.named.drain(..over);
    }

    fn notify_cntlids(&mut self, owed: Vec<(u16, u8)>) {
        self.notices.extend(owed);
        let over = self.notices.len().saturating_sub(MAX_NOTICES);
        self.notices.drain(..over);
    }

    /// Takes the notifications owed to controller `cntlid`.
    pub fn take_notices(&mut self, cntlid: u16) -> Vec<u8> {
        let mut mine = Vec::new();
        self.notices.retain(|&(c, k)| {
            if c == cntlid {
                mine.push(k);
            }
            c != cntlid
        });
        mine
    }

    /// Ends the reservation, owing Reservation Released to the other registrants
    /// when its type is a registrants-only or all-registrants one.
    fn release_by(&mut self, me: &HostId) {
        if self.kind().is_some_and(|t| t.registrants_may_access()) {
            let others: Vec<HostId> = self.registrants.iter().map(|r| r.host).collect();
            self.notify(others, notification::RESERVATION_RELEASED, me);
        }
        self.rtype = None;
        self.holder = None;
    }

    fn set_ptpl(&mut self, c: u8, ptpl_capable: bool) -> Result<(), Status> {
        match c {
            cptpl::NO_CHANGE => {}
            cptpl::CLEAR => self.ptpl = false,
            cptpl::SET if ptpl_capable => self.ptpl = true,
            _ => return Err(Status::INVALID_FIELD),
        }
        Ok(())
    }

    /// Reservation Register (NVM §3.2.6).
    pub fn register(&mut self, me: &Requester, ask: Ask, nrkey: u64, ptpl: (u8, bool)) -> Result<(), Status> {
        let Ask { action, iekey, crkey } = ask;
        if ptpl.0 == 1 {
            return Err(Status::INVALID_FIELD);
        }
        match action {
            rrega::REGISTER => {
                let full = self.registrants.len() >= MAX_REGISTRANTS;
                match self.registrants.iter_mut().find(|r| r.host == me.host) {
                    // Registering again with the key it has: success, and this
                    // controller is one of the host's.
                    Some(r) if r.key == nrkey => {
                        if !r.cntlids.contains(&me.cntlid) {
                            r.cntlids.push(me.cntlid);
                        }
                        self.set_ptpl(ptpl.0, ptpl.1)?;
                        // A successful Register moves the generation, as any does.
                        self.generation = self.generation.wrapping_add(1);
                        return Ok(());
                    }
                    Some(_) => return Err(Status::RESERVATION_CONFLICT),
                    None if nrkey == 0 => return Err(Status::INVALID_FIELD),
                    None if full => return Err(Status::RESERVATION_CONFLICT),
                    None => {}
                }
                self.set_ptpl(ptpl.0, ptpl.1)?;
                self.registrants.push(Registrant { host: me.host, key: nrkey, cntlids: vec![me.cntlid] });
            }
            rrega::UNREGISTER => {
                let i = self.checked_key(me, crkey, iekey)?;
                self.set_ptpl(ptpl.0, ptpl.1)?;
                let holder = self.holds(&me.host);
                self.registrants.remove(i);
                let all = self.kind().is_some_and(|t| t.all_registrants());
                // A holder's reservation ends with its registration (for the
                // all-registrants types, with the last registrant's).
                if holder && (!all || self.registrants.is_empty()) {
                    self.release_by(&me.host);
                }
            }
            rrega::REPLACE => {
                if nrkey == 0 {
                    return Err(Status::INVALID_FIELD);
                }
                match self.checked_key(me, crkey, iekey) {
                    Ok(i) => self.registrants[i].key = nrkey,
                    // Replace with Ignore Existing Key registers a host that is not.
                    Err(_) if iekey && self.registrant(&me.host).is_none() => {
                        if self.registrants.len() >= MAX_REGISTRANTS {
                            return Err(Status::RESERVATION_CONFLICT);
                        }
                        self.registrants.push(Registrant {
                            host: me.host,
                            key: nrkey,
                            cntlids: vec![me.cntlid],
                        })
                    }
                    Err(e) => return Err(e),
                }
                self.set_ptpl(ptpl.0, ptpl.1)?;
            }
            _ => return Err(Status::INVALID_FIELD),
        }
        self.generation = self.generation.wrapping_add(1);
        Ok(())
    }

    /// Reservation Acquire (NVM §3.2.8). Returns the hosts it preempted (whose
    /// commands a Preempt and Abort aborts).
    pub fn acquire(
        &mut self,
        me: &Requester,
        ask: Ask,
        rtype: u8,
        prkey: u64,
    ) -> Result<Vec<HostId>, Status> {
        let Ask { action, iekey, crkey } = ask;
        let t = ReservationType::from_u8(rtype).ok_or(Status::INVALID_FIELD)?;
        self.checked_key(me, crkey, iekey)?;
        match action {
            racqa::ACQUIRE => {
                match self.kind() {
                    None => {
                        self.rtype = Some(rtype);
                        self.holder = (!t.all_registrants()).then_some(me.host);
                    }
                    Some(cur) if cur == t && self.holds(&me.host) => {}
                    Some(_) => return Err(Status::RESERVATION_CONFLICT),
                }
                Ok(Vec::new())
            }
            racqa::PREEMPT | racqa::PREEMPT_AND_ABORT => self.preempt(me, t, prkey),
            _ => Err(Status::INVALID_FIELD),
        }
    }

    fn preempt(&mut self, me: &Requester, t: ReservationType, prkey: u64) -> Result<Vec<HostId>, Status> {
        let cur = self.kind();
        let holder_key = self.holder.and_then(|h| self.registrant(&h)).map(|r| r.key);
        let taken: Vec<HostId>;
        match cur {
            // An all-registrants reservation: PRKEY 0 preempts every other
            // registrant and the reservation becomes this host's, of type t.
            Some(c) if c.all_registrants() && prkey == 0 => {
                taken = self.registrants.iter().map(|r| r.host).filter(|h| h != &me.host).collect();
                self.take_reservation(me, t, &taken);
            }
            Some(c) if c.all_registrants() => taken = self.unregister_key(me, prkey)?,
            // The holder preempted: its registration goes (unless it is this host),
            // and the reservation is this host's, of type t.
            Some(_) if holder_key == Some(prkey) => {
                taken = self
                    .registrants
                    .iter()
                    .filter(|r| r.key == prkey && r.host != me.host)
                    .map(|r| r.host)
                    .collect();
                self.take_reservation(me, t, &taken);
            }
            // No reservation, or another key than the holder's: those
            // registrants are removed, the reservation stays.
            _ => {
                if prkey == 0 {
                    return Err(Status::INVALID_FIELD);
                }
                taken = self.unregister_key(me, prkey)?;
            }
        }
        self.generation = self.generation.wrapping_add(1);
        Ok(taken)
    }

    /// Removes the registrants (other than `me`) with key `key`: Reservation
    /// Conflict if there are none.
    fn unregister_key(&mut self, me: &Requester, key: u64) -> Result<Vec<HostId>, Status> {
        let taken: Vec<HostId> =
            self.registrants.iter().filter(|r| r.key == key && r.host != me.host).map(|r| r.host).collect();
        if taken.is_empty() {
            return Err(Status::RESERVATION_CONFLICT);
        }
        self.notify(taken.clone(), notification::REGISTRATION_PREEMPTED, &me.host);
        self.registrants.retain(|r| !taken.contains(&r.host));
        Ok(taken)
    }

    /// The reservation becomes `me`'s, of type `t`; `taken` lose their
    /// registrations; the other registrants are told the reservation was
    /// preempted.
    fn take_reservation(&mut self, me: &Requester, t: ReservationType, taken: &[HostId]) {
        self.notify(taken.to_vec(), notification::REGISTRATION_PREEMPTED, &me.host);
        let rest: Vec<HostId> =
            self.registrants.iter().map(|r| r.host).filter(|h| !taken.contains(h)).collect();
        self.notify(rest, notification::RESERVATION_PREEMPTED, &me.host);
        self.registrants.retain(|r| !taken.contains(&r.host));
        self.rtype = Some(t as u8);
        self.holder = (!t.all_registrants()).then_some(me.host);
    }

    /// Reservation Release (NVM §3.2.9).
    pub fn release(&mut self, me: &Requester, ask: Ask, rtype: u8) -> Result<(), Status> {
        let Ask { action, iekey, crkey } = ask;
        self.checked_key(me, crkey, iekey)?;
        match action {
            rrela::RELEASE => {
                let Some(cur) = self.rtype else { return Ok(()) };
                if !self.holds(&me.host) {
                    // Not the holder: nothing happens.
                    return Ok(());
                }
                if cur != rtype {
                    return Err(Status::INVALID_FIELD);
                }
                self.release_by(&me.host);
                Ok(())
            }
            rrela::CLEAR => {
                let others: Vec<HostId> = self.registrants.iter().map(|r| r.host).collect();
                self.notify(others, notification::RESERVATION_PREEMPTED, &me.host);
                self.registrants.clear();
                self.rtype = None;
                self.holder = None;
                self.generation = self.generation.wrapping_add(1);
                Ok(())
            }
            _ => Err(Status::INVALID_FIELD),
        }
    }

    /// Checks a state read back (a file another process wrote): what the rules
    /// rely on.
    pub fn check(&self) -> Result<(), String> {
        if self.registrants.len() > MAX_REGISTRANTS {
            return Err(format!("{} registrants (at most {MAX_REGISTRANTS})", self.registrants.len()));
        }
        if self.named.len() > MAX_NAMED {
            return Err(format!("{} named hosts (at most {MAX_NAMED})", self.named.len()));
        }
        for (i, (c, _)) in self.named.iter().enumerate() {
            if self.named[..i].iter().any(|(d, _)| d == c) {
                return Err(format!("controller {c} named twice"));
            }
        }
        if let Some(t) = self.rtype {
            let t = ReservationType::from_u8(t).ok_or_else(|| format!("reservation type {t}"))?;
            match (t.all_registrants(), &self.holder) {
                (false, Some(h)) if self.registrant(h).is_none() => {
                    return Err("the holder is not a registrant".into())
                }
                (false, None) => return Err("a reservation without a holder".into()),
                _ => {}
            }
        } else if self.holder.is_some() {
            return Err("a holder without a reservation".into());
        }
        if self.notices.len() > MAX_NOTICES {
            return Err(format!("{} notifications waiting", self.notices.len()));
        }
        Ok(())
    }
}

impl crate::shared_file::SharedState for ResvState {
    const MAGIC: &'static [u8; 8] = b"VNVMERSV";
    const WHAT: &'static str = "reservation state file";
    fn check(&self) -> Result<(), String> {
        ResvState::check(self)
    }
    /// Persist Through Power Loss: the change is on the medium before the
    /// command that made it completes.
    fn durable(&self) -> bool {
        self.ptpl
    }
}
