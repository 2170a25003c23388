//! Namespace Management and Namespace Attachment (Base §5.1.21, §5.1.20) on a
//! controller with a namespace pool (`crate::pool`), and the Identify
//! structures that go with them (CNS 10h-13h). Only where the pool is (OACS
//! bit 3); elsewhere both opcodes are Invalid Opcode.
//!
//! Namespaces made here are of the NVM command set, in LBA format 0 (512
//! bytes) or 1 (4 KiB), without metadata or protection information, NCAP =
//! NSZE (no thin provisioning), private or shared (NMIC bit 0), in the ANA
//! group the host names (0: group 1).

use nvme_spec::identify::{flbas, IdentifyNamespace, LbaFormat};
use nvme_spec::log::u128_le;
use nvme_spec::nsmgmt::{attach_sel, mgmt_sel, ControllerList};
use nvme_spec::{Sqe, Status, NSID_ALL};
use tracing::info;
use zerocopy::little_endian::{U16, U32, U64};
use zerocopy::{FromBytes, FromZeros, IntoBytes};

use super::{status, Admin, AdminDone};
use crate::error::{CmdResult, CommandError};
use crate::pool::{NamespacePool, NewNamespace, PoolNamespace};

impl Admin<'_> {
    fn pool(&self) -> CmdResult<&NamespacePool> {
        self.cfg.pool.as_deref().ok_or(CommandError::InvalidOpcode(0))
    }

    pub(crate) fn namespace_management(&mut self, sqe: &Sqe) -> CmdResult<AdminDone> {
        let sel = (sqe.cdw10.get() & 0xf) as u8;
        let nsid = sqe.nsid.get();
        match sel {
            mgmt_sel::CREATE => {
                if sqe.cdw11.get() >> 24 != nvme_spec::zns::CSI_NVM as u32 {
                    return Err(CommandError::InvalidField("namespaces of the NVM command set only"));
                }
                let data = self.copy_from_host(sqe, 4096)?;
                let id = IdentifyNamespace::read_from_bytes(&data).expect("4096 bytes");
                let new = self.new_namespace(&id)?;
                let nn = self.max_namespaces();
                let made = self.pool()?.create(new, nn).map_err(|s| CommandError::Status(s.with_dnr()))?;
                info!(
                    nsid = made,
                    blocks = new.nsze,
                    lba_format = new.lba_format,
                    shared = new.shared,
                    "namespace created by the host"
                );
                Ok(AdminDone::Complete(made))
            }
            mgmt_sel::DELETE => {
                if nsid == 0 {
                    return Err(CommandError::InvalidNamespace(nsid));
                }
                let gone = self.pool()?.delete(nsid).map_err(|s| CommandError::Status(s.with_dnr()))?;
                info!(nsids = ?gone, "namespaces deleted by the host");
                super::done()
            }
            _ => Err(CommandError::InvalidField("Namespace Management select")),
        }
    }

    /// The namespace a create's data asks for, or why not.
    fn new_namespace(&self, id: &IdentifyNamespace) -> CmdResult<NewNamespace> {
        let (nsze, ncap) = (id.nsze.get(), id.ncap.get());
        if nsze == 0 || ncap > nsze {
            return Err(CommandError::InvalidField("NSZE zero, or NCAP beyond it"));
        }
        if ncap != nsze {
            return status(Status::THIN_PROVISIONING_NOT_SUPPORTED);
        }
        let lba_format = flbas::format_index(id.flbas);
        if lba_format > 1 || id.flbas & flbas::EXTENDED_METADATA != 0 || id.dps != 0 {
            // Formats with metadata, and protection, are not made here.
            return status(Status::INVALID_FORMAT);
        }
        if id.nmic & !1 != 0 {
            return Err(CommandError::InvalidField("NMIC"));
        }
        let ana_group = match id.anagrpid.get() {
            0 => crate::ana::DEFAULT_GROUP,
            g if self.cfg.subsystem.is_some() && g <= crate::ana::MAX_GROUPS => g,
            _ => return status(Status::ANA_GROUP_IDENTIFIER_INVALID),
        };
        if id.nvmsetid.get() > 1 || id.endgid.get() > 1 {
            return Err(CommandError::InvalidField("NVM set or endurance group"));
        }
        Ok(NewNamespace { nsze, lba_format, shared: id.nmic & 1 != 0, ana_group })
    }

    pub(crate) fn namespace_attachment(&mut self, sqe: &Sqe) -> CmdResult<AdminDone> {
        let sel = (sqe.cdw10.get() & 0xf) as u8;
        let nsid = sqe.nsid.get();
        if sel != attach_sel::ATTACH && sel != attach_sel::DETACH {
            return Err(CommandError::InvalidField("Namespace Attachment select"));
        }
        if nsid == 0 || nsid == NSID_ALL {
            return Err(CommandError::InvalidNamespace(nsid));
        }
        let data = self.copy_from_host(sqe, 4096)?;
        let list = ControllerList::read_from_bytes(&data).expect("4096 bytes");
        let Some(ids) = list.entries().map(|i| i.collect::<Vec<u16>>()) else {
            return status(Status::CONTROLLER_LIST_INVALID);
        };
        let pool = self.pool()?;
        let r = if sel == attach_sel::ATTACH { pool.attach(nsid, &ids) } else { pool.detach(nsid, &ids) };
        r.map_err(|s| CommandError::Status(s.with_dnr()))?;
        let what = if sel == attach_sel::ATTACH { "attached" } else { "detached" };
        info!(nsid, controllers = ?ids, "namespace {what} by the host");
        super::done()
    }

    /// Identify CNS 10h: the NSIDs of the subsystem above `after`.
    pub(crate) fn allocated_list(&self, after: u32) -> CmdResult<Vec<u8>> {
        if after >= 0xffff_fffe {
            return Err(CommandError::InvalidNamespace(after));
        }
        let state = self.pool()?.state();
        let mut ids: Vec<u32> = state.namespaces.keys().chain(state.fixed.keys()).copied().collect();
        ids.extend(crate::namespace::active(self.namespaces).map(|n| n.nsid));
        ids.sort_unstable();
        ids.dedup();
        Ok(nvme_spec::identify::active_ns_list(after, ids.into_iter()).to_vec())
    }

    /// Identify CNS 11h: namespace `nsid` whether attached here or not.
    pub(crate) fn allocated_namespace(&self, nsid: u32) -> CmdResult<IdentifyNamespace> {
        if self.active_ns(nsid).is_ok() {
            return self.identify_namespace(nsid);
        }
        if nsid == 0 || nsid == NSID_ALL {
            return Err(CommandError::InvalidNamespace(nsid));
        }
        let state = self.pool()?.state();
        Ok(match state.namespaces.get(&nsid) {
            Some(n) => self.pool_namespace_data(n),
            // Another controller's own, or not allocated: nothing to say.
            None => IdentifyNamespace::new_zeroed(),
        })
    }

    /// The Identify Namespace structure of a pool namespace not attached here.
    fn pool_namespace_data(&self, n: &PoolNamespace) -> IdentifyNamespace {
        let mut d = IdentifyNamespace::new_zeroed();
        (d.nsze, d.ncap, d.nuse) = (U64::new(n.nsze), U64::new(n.nsze), U64::new(n.nsze));
        plain_formats(&mut d);
        d.flbas = flbas::from_index(n.lba_format, false);
        d.nmic = n.shared as u8;
        d.nvmcap = u128_le(n.bytes() as u128);
        if self.cfg.subsystem.is_some() {
            d.anagrpid = U32::new(n.ana_group);
        }
        d.nguid = n.nguid;
        d
    }

    /// What Identify Namespace with NSID FFFFFFFFh gives where namespaces are
    /// made: what every namespace made here has in common (its LBA formats).
    pub(crate) fn common_namespace_data(&self) -> CmdResult<IdentifyNamespace> {
        self.pool()?;
        let mut d = IdentifyNamespace::new_zeroed();
        plain_formats(&mut d);
        Ok(d)
    }

    /// Identify CNS 12h (of namespace `nsid`) and 13h (`nsid` None: of the
    /// subsystem): the CNTLIDs at or above `from`.
    pub(crate) fn controller_list(&self, nsid: Option<u32>, from: u16) -> CmdResult<Vec<u8>> {
        let state = self.pool()?.state();
        let ids: Vec<u16> = match nsid {
            None => state.controllers.iter().copied().collect(),
            Some(n) => match state.namespaces.get(&n) {
                Some(ns) => ns.attached.iter().copied().collect(),
                None => state
                    .fixed
                    .get(&n)
                    .map(|c| c.iter().copied().collect())
                    .ok_or(CommandError::InvalidNamespace(n))?,
            },
        };
        let mut l = ControllerList::new_zeroed();
        let ids: Vec<u16> =
            ids.into_iter().filter(|&c| c >= from).take(nvme_spec::nsmgmt::CONTROLLER_LIST_MAX).collect();
        l.count = U16::new(ids.len() as u16);
        for (slot, id) in l.ids.iter_mut().zip(ids) {
            *slot = U16::new(id);
        }
        Ok(l.as_bytes().to_vec())
    }

    /// TNVMCAP and UNVMCAP: the pool's capacity and what is left of it.
    pub(crate) fn pool_capacity(&self) -> Option<([u8; 16], [u8; 16])> {
        let state = self.cfg.pool.as_ref()?.state();
        Some((u128_le(state.capacity as u128), u128_le(state.unallocated() as u128)))
    }

    /// Whether the pool's namespace `nsid` was made shared (None: not the pool's).
    pub(crate) fn pool_shared(&self, nsid: u32) -> Option<bool> {
        self.cfg.pool.as_ref()?.state().namespaces.get(&nsid).map(|n| n.shared)
    }
}

/// The LBA formats a namespace of the pool has: 512 bytes ("better") and 4 KiB
/// ("best"), without metadata, as an active namespace reports them.
fn plain_formats(d: &mut IdentifyNamespace) {
    d.nlbaf = 1;
    d.lbaf[0] = LbaFormat { ms: U16::new(0), lbads: 9, rp: 1 };
    d.lbaf[1] = LbaFormat { ms: U16::new(0), lbads: 12, rp: 0 };
}
