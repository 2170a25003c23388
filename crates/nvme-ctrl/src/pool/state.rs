//! The namespace pool's shared state and its rules: the capacity, the
//! controllers of the subsystem, the NSIDs operators gave controllers directly
//! (`--ns`: not the pool's), and the namespaces the pool holds with the
//! controllers each is attached to. Pure: no file is touched here.

use std::collections::{BTreeMap, BTreeSet};

use nvme_spec::Status;
use serde::{Deserialize, Serialize};

use crate::lba_format::FormatState;

/// The most namespaces a pool holds (NSIDs stay within a controller's NN anyway).
pub const MAX_POOL_NAMESPACES: usize = 1024;
/// The most controllers a pool knows.
pub const MAX_POOL_CONTROLLERS: usize = 64;

/// One namespace of the pool.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PoolNamespace {
    /// Its size in logical blocks (NSZE = NCAP: no thin provisioning).
    pub nsze: u64,
    /// Its LBA format: 0 (512 bytes) or 1 (4096 bytes).
    pub lba_format: u8,
    /// NMIC bit 0: it may be attached to several controllers at once.
    pub shared: bool,
    /// Its ANA group (1 to 32).
    pub ana_group: u32,
    /// The controllers it is attached to.
    pub attached: BTreeSet<u16>,
    /// Its NGUID, new with each creation: a namespace made again at the same NSID
    /// is not the one deleted there.
    pub nguid: [u8; 16],
}

impl PoolNamespace {
    /// Its logical block size in bytes.
    pub fn lba_bytes(&self) -> u64 {
        if self.lba_format == 1 {
            4096
        } else {
            512
        }
    }

    /// Its size in bytes (what it takes from the pool's capacity).
    pub fn bytes(&self) -> u64 {
        self.nsze.saturating_mul(self.lba_bytes())
    }
}

/// What a host (or an operator) asks of a new namespace.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NewNamespace {
    pub nsze: u64,
    pub lba_format: u8,
    pub shared: bool,
    pub ana_group: u32,
}

/// The pool as every controller of the subsystem shares it.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PoolState {
    /// Bytes the pool's namespaces may take together (TNVMCAP).
    pub capacity: u64,
    /// The controllers that have joined (each at its start), by CNTLID.
    pub controllers: BTreeSet<u16>,
    /// NSIDs an operator gave a controller directly, with the controllers that
    /// have them: the pool never gives them out.
    pub fixed: BTreeMap<u32, BTreeSet<u16>>,
    pub namespaces: BTreeMap<u32, PoolNamespace>,
    /// The formats hosts chose with Format NVM for operators' NSIDs (absent: as
    /// each `--ns` says): every controller that has the NSID serves it so.
    #[serde(default)]
    pub fixed_formats: BTreeMap<u32, FormatState>,
}

impl PoolState {
    /// Bytes the pool's namespaces take.
    pub fn used(&self) -> u64 {
        self.namespaces.values().map(PoolNamespace::bytes).fold(0, u64::saturating_add)
    }

    /// Bytes left (UNVMCAP).
    pub fn unallocated(&self) -> u64 {
        self.capacity.saturating_sub(self.used())
    }

    /// Whether `nsid` exists in the subsystem (the pool's, or an operator's).
    pub fn allocated(&self, nsid: u32) -> bool {
        self.namespaces.contains_key(&nsid) || self.fixed.contains_key(&nsid)
    }

    /// The capacity a controller opening the pool gives, if any: a new pool takes
    /// it; an existing one keeps its own, and another given is refused (it cannot
    /// shrink under its namespaces: say so rather than pick one).
    pub fn settle_capacity(&mut self, given: Option<u64>) -> Result<(), String> {
        match (self.capacity, given) {
            (0, Some(c)) => self.capacity = c,
            (0, None) => return Err("a new pool needs its capacity: --pool DIR:SIZE".into()),
            (have, Some(c)) if have != c => {
                return Err(format!("it holds {have} bytes, not {c}: leave the size out to use it as it is"))
            }
            _ => {}
        }
        Ok(())
    }

    /// Controller `cntlid` joins, with the NSIDs its operator gave it. Refused
    /// (with why) if one of them is a namespace of the pool.
    pub fn join(&mut self, cntlid: u16, fixed: &[u32]) -> Result<(), String> {
        if let Some(n) = fixed.iter().find(|n| self.namespaces.contains_key(n)) {
            return Err(format!(
                "NSID {n} is a namespace of the pool (made by a host or with ns.create): give --ns another \
                 NSID, or delete it from the pool first"
            ));
        }
        if !self.controllers.contains(&cntlid) && self.controllers.len() >= MAX_POOL_CONTROLLERS {
            return Err(format!("the pool knows {MAX_POOL_CONTROLLERS} controllers already"));
        }
        self.controllers.insert(cntlid);
        for c in self.fixed.values_mut() {
            c.remove(&cntlid);
        }
        for &n in fixed {
            self.fixed.entry(n).or_default().insert(cntlid);
        }
        self.drop_unclaimed();
        Ok(())
    }

    /// An operator's NSID no controller has any more is no one's: its format goes.
    fn drop_unclaimed(&mut self) {
        self.fixed.retain(|_, c| !c.is_empty());
        let fixed = &self.fixed;
        self.fixed_formats.retain(|n, _| fixed.contains_key(n));
    }

    /// The operator's namespace `nsid` takes format `f` (a Format NVM through one
    /// of the controllers that have it).
    pub fn format_fixed(&mut self, nsid: u32, f: FormatState) -> Result<(), Status> {
        if !self.fixed.contains_key(&nsid) {
            return Err(Status::INVALID_NAMESPACE);
        }
        self.fixed_formats.insert(nsid, f);
        Ok(())
    }

    /// Forgets controller `cntlid` (its process gone for good): it leaves the
    /// controller list, its operator's NSIDs are free for the pool again, and every
    /// namespace is detached from it. Returns those namespaces. A controller that
    /// starts again joins again.
    pub fn forget(&mut self, cntlid: u16) -> Result<Vec<u32>, Status> {
        if !self.controllers.remove(&cntlid) {
            return Err(Status::INVALID_FIELD);
        }
        for c in self.fixed.values_mut() {
            c.remove(&cntlid);
        }
        self.drop_unclaimed();
        let mut detached = Vec::new();
        for (&nsid, n) in self.namespaces.iter_mut() {
            if n.attached.remove(&cntlid) {
                detached.push(nsid);
            }
        }
        Ok(detached)
    }

    /// Makes a namespace at the lowest NSID from 1 to `nn` that the subsystem does
    /// not use; returns it.
    pub fn create(&mut self, n: NewNamespace, nn: u32, nguid: [u8; 16]) -> Result<u32, Status> {
        let ns = PoolNamespace {
            nsze: n.nsze,
            lba_format: n.lba_format,
            shared: n.shared,
            ana_group: n.ana_group,
            attached: BTreeSet::new(),
            nguid,
        };
        if n.nsze == 0 || n.lba_format > 1 || ns.nsze.checked_mul(ns.lba_bytes()).is_none() {
            return Err(Status::INVALID_FIELD);
        }
        if ns.bytes() > self.unallocated() {
            return Err(Status::NAMESPACE_INSUFFICIENT_CAPACITY);
        }
        if self.namespaces.len() >= MAX_POOL_NAMESPACES {
            return Err(Status::NAMESPACE_IDENTIFIER_UNAVAILABLE);
        }
        let nsid = (1..=nn).find(|&i| !self.allocated(i)).ok_or(Status::NAMESPACE_IDENTIFIER_UNAVAILABLE)?;
        self.namespaces.insert(nsid, ns);
        Ok(nsid)
    }

    /// Namespace `nsid` takes LBA format `lba_format` (a Format NVM through one of
    /// its controllers): the same bytes, counted in the new block size.
    pub fn format(&mut self, nsid: u32, lba_format: u8) -> Result<(), Status> {
        if lba_format > 1 {
            return Err(Status::INVALID_FORMAT);
        }
        let ns = self.namespaces.get_mut(&nsid).ok_or(Status::INVALID_NAMESPACE)?;
        let bytes = ns.bytes();
        ns.lba_format = lba_format;
        ns.nsze = bytes / ns.lba_bytes();
        Ok(())
    }

    /// The pool's namespace `nsid`, or the status a command naming it gets: an
    /// operator's namespace is not the pool's to change (Invalid Field), an NSID
    /// the subsystem does not have is Invalid Namespace or Format.
    pub fn pool_namespace(&self, nsid: u32) -> Result<&PoolNamespace, Status> {
        match self.namespaces.get(&nsid) {
            Some(ns) => Ok(ns),
            None if self.fixed.contains_key(&nsid) => Err(Status::INVALID_FIELD),
            None => Err(Status::INVALID_NAMESPACE),
        }
    }

    /// Deletes `nsid` (detached from every controller first); returns it with the
    /// controllers it was attached to.
    pub fn delete(&mut self, nsid: u32) -> Result<PoolNamespace, Status> {
        self.pool_namespace(nsid)?;
        Ok(self.namespaces.remove(&nsid).expect("checked"))
    }

    /// A Controller List's identifiers, checked: at least one, no repeats, every
    /// one a controller of the subsystem.
    pub fn controller_list(&self, ids: &[u16]) -> Result<BTreeSet<u16>, Status> {
        let set: BTreeSet<u16> = ids.iter().copied().collect();
        if ids.is_empty() || set.len() != ids.len() || !set.is_subset(&self.controllers) {
            return Err(Status::CONTROLLER_LIST_INVALID);
        }
        Ok(set)
    }

    /// Attaches `nsid` to `ids`.
    pub fn attach(&mut self, nsid: u32, ids: &[u16]) -> Result<(), Status> {
        let ns = self.pool_namespace(nsid)?;
        let ids = self.controller_list(ids)?;
        if !ids.is_disjoint(&ns.attached) {
            return Err(Status::NAMESPACE_ALREADY_ATTACHED);
        }
        if !ns.shared && ids.len() + ns.attached.len() > 1 {
            return Err(Status::NAMESPACE_IS_PRIVATE);
        }
        self.namespaces.get_mut(&nsid).expect("checked").attached.extend(ids);
        Ok(())
    }

    /// Detaches `nsid` from `ids`.
    pub fn detach(&mut self, nsid: u32, ids: &[u16]) -> Result<(), Status> {
        let ns = self.pool_namespace(nsid)?;
        let ids = self.controller_list(ids)?;
        if !ids.is_subset(&ns.attached) {
            return Err(Status::NAMESPACE_NOT_ATTACHED);
        }
        let ns = self.namespaces.get_mut(&nsid).expect("checked");
        ns.attached.retain(|c| !ids.contains(c));
        Ok(())
    }

    /// What a state read back (written by another process) must hold for the
    /// rules and the controllers to rely on it.
    pub fn check(&self) -> Result<(), String> {
        if self.namespaces.len() > MAX_POOL_NAMESPACES || self.controllers.len() > MAX_POOL_CONTROLLERS {
            return Err("more namespaces or controllers than a pool holds".into());
        }
        if self.used() > self.capacity {
            return Err(format!("its namespaces take {} bytes of {}", self.used(), self.capacity));
        }
        for (&nsid, ns) in &self.namespaces {
            if nsid == 0 || nsid == nvme_spec::NSID_ALL || ns.nsze == 0 || ns.lba_format > 1 {
                return Err(format!("namespace {nsid} is malformed"));
            }
            if self.fixed.contains_key(&nsid) {
                return Err(format!("NSID {nsid} is both the pool's and an operator's"));
            }
            if !ns.attached.is_subset(&self.controllers) || (!ns.shared && ns.attached.len() > 1) {
                return Err(format!("namespace {nsid} is attached where it cannot be"));
            }
            if !(1..=crate::ana::MAX_GROUPS).contains(&ns.ana_group) {
                return Err(format!("namespace {nsid} is in ANA group {}", ns.ana_group));
            }
        }
        if let Some(n) = self.fixed_formats.keys().find(|n| !self.fixed.contains_key(n)) {
            return Err(format!("NSID {n} has a format and no controller"));
        }
        Ok(())
    }
}

impl crate::shared_file::SharedState for PoolState {
    const MAGIC: &'static [u8; 8] = b"VNVMEPOL";
    const WHAT: &'static str = "namespace pool state file";
    fn check(&self) -> Result<(), String> {
        PoolState::check(self)
    }
    /// A namespace made or attached stays so after a power loss.
    fn durable(&self) -> bool {
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pool(capacity: u64) -> PoolState {
        let mut p = PoolState { capacity, ..Default::default() };
        p.join(1, &[1]).unwrap();
        p.join(2, &[]).unwrap();
        p
    }

    fn new(nsze: u64, shared: bool) -> NewNamespace {
        NewNamespace { nsze, lba_format: 0, shared, ana_group: 1 }
    }

    #[test]
    fn create_takes_capacity_and_the_lowest_free_nsid() {
        let mut p = pool(1 << 20);
        assert_eq!(p.create(new(1024, true), 8, [1; 16]), Ok(2), "NSID 1 is controller 1's own");
        assert_eq!(p.unallocated(), (1 << 20) - 512 * 1024);
        assert_eq!(p.create(new(2048, true), 8, [2; 16]), Err(Status::NAMESPACE_INSUFFICIENT_CAPACITY));
        assert_eq!(p.create(new(1024, false), 8, [3; 16]), Ok(3));
        assert_eq!(p.create(new(0, false), 8, [3; 16]), Err(Status::INVALID_FIELD));
        assert_eq!(p.delete(2).unwrap().nsze, 1024);
        assert_eq!(p.create(new(8, false), 3, [4; 16]), Ok(2), "a deleted NSID is given again");
        assert_eq!(p.create(new(1, false), 3, [3; 16]), Err(Status::NAMESPACE_IDENTIFIER_UNAVAILABLE));
        assert_eq!(p.delete(1), Err(Status::INVALID_FIELD), "an operator's namespace");
        assert_eq!(p.delete(7), Err(Status::INVALID_NAMESPACE));
        p.check().unwrap();
    }

    #[test]
    fn a_format_keeps_the_bytes_and_counts_them_in_the_new_block_size() {
        let mut p = pool(1 << 20);
        let n = p.create(new(1024, true), 8, [1; 16]).unwrap();
        assert_eq!(p.format(n, 1), Ok(()));
        assert_eq!((p.namespaces[&n].nsze, p.namespaces[&n].lba_format), (128, 1));
        assert_eq!(p.unallocated(), (1 << 20) - 512 * 1024, "the capacity it takes is unchanged");
        assert_eq!(p.format(n, 2), Err(Status::INVALID_FORMAT), "formats with metadata");
        assert_eq!(p.format(1, 0), Err(Status::INVALID_NAMESPACE), "an operator's namespace");
        assert_eq!(p.format(n, 0), Ok(()));
        assert_eq!(p.namespaces[&n].nsze, 1024);
        p.check().unwrap();
    }

    #[test]
    fn an_operators_nsid_keeps_its_format_while_a_controller_has_it() {
        let mut p = pool(1 << 20);
        let f = FormatState { lbaf: 1, dps: 0, extended: false };
        assert_eq!(p.format_fixed(1, f), Ok(()));
        assert_eq!(p.format_fixed(2, f), Err(Status::INVALID_NAMESPACE), "no controller has NSID 2");
        p.join(2, &[1]).unwrap();
        p.join(1, &[]).unwrap();
        assert_eq!(p.fixed_formats.get(&1), Some(&f), "controller 2 has NSID 1 now");
        p.check().unwrap();
        p.forget(2).unwrap();
        assert!(p.fixed_formats.is_empty(), "no controller has it: its format goes with it");
        p.fixed_formats.insert(1, f);
        assert!(p.check().is_err(), "a state another process wrote is checked before it is believed");
    }

    #[test]
    fn attach_and_detach_follow_the_controller_list_and_sharing() {
        let mut p = pool(1 << 30);
        let shared = p.create(new(8, true), 8, [1; 16]).unwrap();
        let private = p.create(new(8, false), 8, [2; 16]).unwrap();
        assert_eq!(p.attach(shared, &[]), Err(Status::CONTROLLER_LIST_INVALID));
        assert_eq!(p.attach(shared, &[1, 1]), Err(Status::CONTROLLER_LIST_INVALID));
        assert_eq!(p.attach(shared, &[3]), Err(Status::CONTROLLER_LIST_INVALID));
        assert_eq!(p.attach(shared, &[1, 2]), Ok(()));
        assert_eq!(p.attach(shared, &[2]), Err(Status::NAMESPACE_ALREADY_ATTACHED));
        assert_eq!(p.attach(private, &[1, 2]), Err(Status::NAMESPACE_IS_PRIVATE));
        assert_eq!(p.attach(private, &[2]), Ok(()));
        assert_eq!(p.attach(private, &[1]), Err(Status::NAMESPACE_IS_PRIVATE));
        assert_eq!(p.detach(private, &[1]), Err(Status::NAMESPACE_NOT_ATTACHED));
        assert_eq!(p.detach(shared, &[2]), Ok(()));
        assert_eq!(p.namespaces[&shared].attached, BTreeSet::from([1]));
        p.check().unwrap();
        // A state another process wrote is checked before it is believed.
        p.namespaces.get_mut(&private).unwrap().attached.insert(1);
        assert!(p.check().is_err());
    }

    #[test]
    fn a_new_pool_takes_its_capacity_and_an_existing_one_keeps_it() {
        let mut p = PoolState::default();
        assert!(p.settle_capacity(None).is_err(), "a new pool needs one");
        p.settle_capacity(Some(64)).unwrap();
        p.settle_capacity(None).unwrap();
        p.settle_capacity(Some(64)).unwrap();
        assert!(p.settle_capacity(Some(32)).unwrap_err().contains("64 bytes, not 32"));
        assert_eq!(p.capacity, 64);
    }

    #[test]
    fn a_forgotten_controller_leaves_every_list() {
        let mut s = pool(64 << 20);
        s.join(1, &[]).unwrap();
        s.join(2, &[7]).unwrap();
        let a = s.create(new(64, true), 32, [1; 16]).unwrap();
        let b = s.create(new(64, true), 32, [2; 16]).unwrap();
        s.attach(a, &[1, 2]).unwrap();
        s.attach(b, &[1]).unwrap();
        assert_eq!(s.forget(2), Ok(vec![a]));
        assert_eq!(s.controllers, BTreeSet::from([1]));
        assert!(!s.allocated(7), "its operator's NSID is free again");
        assert_eq!(s.namespaces[&a].attached, BTreeSet::from([1]));
        assert!(s.check().is_ok());
        assert_eq!(s.forget(2), Err(Status::INVALID_FIELD), "unknown now");
        assert_eq!(s.attach(a, &[2]), Err(Status::CONTROLLER_LIST_INVALID), "not a target any more");
        s.join(2, &[]).unwrap();
        s.attach(a, &[2]).unwrap();
    }

    #[test]
    fn a_controller_may_not_claim_a_pool_nsid() {
        let mut p = pool(1 << 30);
        let n = p.create(new(8, true), 8, [1; 16]).unwrap();
        assert!(p.join(2, &[n]).is_err());
        p.join(2, &[5]).unwrap();
        assert_eq!(p.create(new(8, true), 8, [1; 16]), Ok(3));
        assert_eq!(p.create(new(8, true), 8, [1; 16]), Ok(4));
        assert_eq!(p.create(new(8, true), 8, [1; 16]), Ok(6), "5 is controller 2's");
        p.join(2, &[]).unwrap();
        assert!(!p.fixed.contains_key(&5), "a controller started again without it lets it go");
    }
}
