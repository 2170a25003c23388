//! Identify (Base §5.1.13): controller, namespace, active namespace lists and
//! namespace identification descriptors, plus the NVM command set specific
//! structures (CNS 05h, 06h) a Linux host asks for.

use nvme_spec::admin::Identify;
use nvme_spec::ana::anacap;
use nvme_spec::identify::{
    active_ns_list, ascii_pad, cmic, cns, cntrltype, ctratt, dlfeat, dpc, elbaf, frmw, lpa, mc, nidt, nmic,
    ns_descriptor_list, nul_pad, oaes, oncs, sgls, vwc, IdentifyController, IdentifyNamespace,
    IdentifyNamespaceNvm, IoCommandSetNvmController, LbaFormat,
};
use nvme_spec::nsmgmt::cns as nsmgmt_cns;
use nvme_spec::regs::NVME_VERSION_1_4;
use nvme_spec::zns::{IdentifyControllerZns, IdentifyNamespaceZns, ZoneFormatExtension, CSI_NVM, CSI_ZNS};
use nvme_spec::{Sqe, NSID_ALL};
use zerocopy::little_endian::{U16, U32, U64};
use zerocopy::{FromZeros, IntoBytes};

use super::features::{CCTEMP_K, WCTEMP_K};
use super::{Admin, AdminDone};
use crate::error::{CmdResult, CommandError};
use crate::events::ERROR_LOG_ENTRIES;
use crate::namespace::{active, Namespace, LBA_FORMATS};

/// CNS 1Ch: the I/O Command Set data structure (Base §5.1.13.2.19).
const CNS_IO_COMMAND_SETS: u8 = 0x1c;

impl Admin<'_> {
    pub(crate) fn identify(&mut self, sqe: &Sqe) -> CmdResult<AdminDone> {
        let id = Identify(sqe);
        let nsid = id.nsid();
        let data: Vec<u8> = match id.cns() {
            cns::NAMESPACE => self.identify_namespace(nsid)?.as_bytes().to_vec(),
            cns::CONTROLLER => self.identify_controller().as_bytes().to_vec(),
            cns::ACTIVE_NAMESPACE_LIST => self.active_list(nsid, None)?,
            cns::NS_DESCRIPTOR_LIST => {
                let ns = self.active_ns(nsid)?;
                ns_descriptor_list(&[
                    (nidt::EUI64, &ns.ids.eui64[..]),
                    (nidt::NGUID, &ns.ids.nguid[..]),
                    (nidt::UUID, &ns.ids.uuid[..]),
                    (nidt::CSI, &[ns.csi()][..]),
                ])
                .to_vec()
            }
            cns::CSI_NAMESPACE => {
                let ns = self.active_ns(nsid)?;
                match id.csi() {
                    // The NVM command set specific structure (a zoned namespace's
                    // too: its command set builds on the NVM one).
                    CSI_NVM => nvm_namespace_data(&ns).as_bytes().to_vec(),
                    CSI_ZNS if ns.zones.is_some() => zoned_namespace_data(&ns).as_bytes().to_vec(),
                    _ => return Err(CommandError::InvalidField("the namespace is not of that command set")),
                }
            }
            cns::CSI_CONTROLLER if id.csi() == CSI_ZNS => {
                // Zone Append Size Limit 0: MDTS.
                IdentifyControllerZns::default().as_bytes().to_vec()
            }
            cns::CSI_CONTROLLER => {
                if id.csi() != CSI_NVM {
                    return Err(CommandError::InvalidField("unsupported command set"));
                }
                let mut c = IoCommandSetNvmController::new_zeroed();
                // Verify Size Limit = MDTS.
                c.vsl = self.cfg.mdts;
                // The backends' limits, where they have them (0: none). WZSL is a
                // power of two in units of the 4 KiB minimum page size, rounded down.
                let wz =
                    active(self.namespaces).filter(|n| n.info.write_zeroes).map(|n| n.info.write_zeroes_max);
                if let Some(max) = wz.filter(|&m| m > 0).min() {
                    c.wzsl = (max / 4096).max(1).ilog2().max(1) as u8;
                }
                let dm = active(self.namespaces).filter(|n| n.info.discard && n.info.discard_max > 0);
                if let Some(blocks) = dm.map(|n| n.info.discard_max >> n.lba_shift()).min() {
                    c.dmrsl = U32::new(blocks.clamp(1, u32::MAX as u64) as u32);
                }
                c.as_bytes().to_vec()
            }
            cns::CSI_ACTIVE_NAMESPACE_LIST => {
                let csi = id.csi();
                if csi != CSI_NVM && csi != CSI_ZNS {
                    return Err(CommandError::InvalidField("unsupported command set"));
                }
                self.active_list(nsid, Some(csi))?
            }
            nsmgmt_cns::ALLOCATED_NAMESPACE_LIST if self.cfg.pool.is_some() => self.allocated_list(nsid)?,
            nsmgmt_cns::ALLOCATED_NAMESPACE if self.cfg.pool.is_some() => {
                self.allocated_namespace(nsid)?.as_bytes().to_vec()
            }
            nsmgmt_cns::NAMESPACE_CONTROLLER_LIST if self.cfg.pool.is_some() => {
                self.controller_list(Some(nsid), id.cntid())?
            }
            nsmgmt_cns::CONTROLLER_LIST if self.cfg.pool.is_some() => {
                self.controller_list(None, id.cntid())?
            }
            CNS_IO_COMMAND_SETS => {
                // One combination, index 0: the NVM (bit 0) and Zoned Namespace (bit
                // 2) command sets, each namespace of one of them.
                let mut v = vec![0u8; 4096];
                v[0] = 1 << CSI_NVM | 1 << CSI_ZNS;
                v
            }
            _ => return Err(CommandError::InvalidField("unsupported CNS value")),
        };
        self.copy_to_host(sqe, &data)?;
        Ok(AdminDone::Complete(0))
    }

    /// The active NSIDs above `after`, of command set `csi` if given.
    fn active_list(&self, after: u32, csi: Option<u8>) -> CmdResult<Vec<u8>> {
        if after >= 0xffff_fffe {
            return Err(CommandError::InvalidNamespace(after));
        }
        let of_set = active(self.namespaces).filter(|n| csi.is_none_or(|c| n.csi() == c));
        Ok(active_ns_list(after, of_set.map(|n| n.nsid)).to_vec())
    }

    pub(crate) fn identify_controller(&self) -> IdentifyController {
        let cfg = &self.cfg;
        let mut c = IdentifyController::new_zeroed();
        c.vid = U16::new(cfg.vid);
        c.ssvid = U16::new(cfg.ssvid);
        c.sn = ascii_pad(&cfg.serial);
        c.mn = ascii_pad(&cfg.model);
        c.fr = ascii_pad(&cfg.firmware);
        c.rab = 6;
        c.mdts = cfg.mdts;
        // One controller of several in its subsystem: its own ID, and CMIC says
        // there are others (each namespace is then shared: NMIC).
        if let Some(sub) = cfg.subsystem {
            c.cntlid = U16::new(sub.cntlid);
            // And Asymmetric Namespace Access: which of its paths to use, and
            // which not now (crate::ana).
            c.cmic = cmic::MULTI_CONTROLLER | cmic::ANA_REPORTING;
            c.anatt = crate::ana::TRANSITION_SECONDS;
            c.anacap = anacap::OPTIMIZED
                | anacap::NON_OPTIMIZED
                | anacap::INACCESSIBLE
                | anacap::PERSISTENT_LOSS
                | anacap::CHANGE
                | anacap::GRPID_STATIC
                | if cfg.pool.is_some() { anacap::GRPID_IN_NS_MGMT } else { 0 };
            c.anagrpmax = U32::new(crate::ana::MAX_GROUPS);
            c.nanagrpid = U32::new(crate::ana::MAX_GROUPS);
            // Linux sizes its ANA log buffer by MNAN, which must be set (and at
            // most NN) once ANA is reported.
            c.mnan = U32::new(self.max_namespaces());
        }
        c.ver = U32::new(NVME_VERSION_1_4);
        // Namespace attribute notices: Linux only sends AERs if OAES has a bit it knows.
        let ana_notices = if cfg.subsystem.is_some() { oaes::ANA_CHANGE } else { 0 };
        c.oaes = U32::new(oaes::NS_ATTRIBUTE_CHANGED | oaes::ZONE_DESCRIPTOR_CHANGED | ana_notices);
        c.cntrltype = cntrltype::IO;
        // The admin commands offered (crate::commands, as dispatch and the Effects log).
        let offers = self.offers();
        c.oacs = U16::new(crate::commands::oacs(&super::table::ADMIN, &offers));
        // Keep Alive, optional over PCIe: supported (Keep Alive Timer feature,
        // Keep Alive command), off until the host sets a KATO.
        c.kas = U16::new(super::features::KAS_100MS);
        if let Some((total, unallocated)) = self.pool_capacity() {
            (c.tnvmcap, c.unvmcap) = (total, unallocated);
        }
        c.acl = cfg.acl_z;
        let [crdt1, crdt2, crdt3] = crate::config::RETRY_DELAYS;
        (c.crdt1, c.crdt2, c.crdt3) = (U16::new(crdt1), U16::new(crdt2), U16::new(crdt3));
        c.aerl = cfg.aerl_z;
        c.frmw = frmw::SLOT1_READ_ONLY | frmw::num_slots(1);
        c.lpa = lpa::COMMANDS_EFFECTS | lpa::EXTENDED_DATA;
        c.elpe = (ERROR_LOG_ENTRIES - 1) as u8;
        c.npss = 0;
        c.wctemp = U16::new(WCTEMP_K);
        c.cctemp = U16::new(CCTEMP_K);
        c.sqes = 0x66;
        c.cqes = 0x44;
        c.nn = U32::new(self.namespaces.len() as u32);
        // The NVM commands offered (crate::commands: Deallocation and Write Zeroes
        // only where a backend does them natively, reservations where some
        // namespace keeps a state file), and two features.
        c.oncs =
            U16::new(crate::commands::oncs(&crate::io::NVM, &offers) | oncs::SAVE_SELECT | oncs::TIMESTAMP);
        // Copy descriptor formats 0h and 1h (the latter for the 64-bit guard).
        c.ocfs = U16::new(0b11);
        c.fna = 0;
        c.vwc =
            if self.admin.features.vwc_present { vwc::PRESENT | vwc::FLUSH_BROADCAST_SUPPORTED } else { 0 };
        // MPTR may hold an SGL descriptor for metadata (bit 19): Linux then maps
        // metadata of several segments, and passthrough metadata, that way.
        c.sgls = U32::new(sgls::SUPPORTED_NO_ALIGN | sgls::BIT_BUCKET | sgls::MPTR_SGL);
        c.subnqn = nul_pad(&format!("nqn.2024-01.io.vnvme:{}", cfg.serial));
        // Power state 0: 9 W maximum, entry/exit latencies of a fast device.
        c.psd[0].mp = U16::new(900);
        c.psd[0].enlat = U32::new(10);
        c.psd[0].exlat = U32::new(10);
        // Extended LBA formats: each format's guard is in Identify CNS 05h.
        c.ctratt = U32::new(ctratt::ELBAS);
        if self.admin.fdp.is_some() {
            c.ctratt = U32::new(ctratt::ELBAS | ctratt::ENDURANCE_GROUPS | ctratt::FDPS);
            c.endgidmax = U16::new(crate::fdp::ENDGID);
        }
        c
    }

    pub(crate) fn identify_namespace(&self, nsid: u32) -> CmdResult<IdentifyNamespace> {
        if nsid == NSID_ALL {
            // What namespaces made here have in common; without a pool there are
            // none to make, so no common capabilities.
            return match self.cfg.pool {
                Some(_) => self.common_namespace_data(),
                None => Err(CommandError::InvalidNamespace(nsid)),
            };
        }
        match self.active_ns(nsid) {
            Ok(ns) => {
                let mut d = namespace_data(&ns);
                if self.cfg.subsystem.is_some() {
                    d.nmic = nmic::SHARED;
                    d.anagrpid = U32::new(ns.ana_group().id());
                }
                if self.admin.fdp.is_some() {
                    // Every namespace is in the one endurance group (a zoned one
                    // without placement handles).
                    d.endgid = U16::new(crate::fdp::ENDGID);
                }
                if self.cfg.pool.is_some() {
                    // Its capacity in the subsystem (what TNVMCAP counts).
                    d.nvmcap = nvme_spec::log::u128_le(ns.size() as u128);
                }
                if let Some(shared) = self.admin.pool_here.get(&nsid).and_then(|_| self.pool_shared(nsid)) {
                    // A pool namespace is shared or private as it was made.
                    d.nmic = shared as u8;
                }
                Ok(d)
            }
            // An inactive NSID (within NN, no namespace now): a zero-filled
            // structure (Base §5.1.13.2.1), which is how a host learns it went away.
            Err(_) if nsid >= 1 && nsid <= self.max_namespaces() => Ok(IdentifyNamespace::new_zeroed()),
            Err(e) => Err(e),
        }
    }
}

/// The Identify Namespace structure of `ns` in its current LBA format.
pub(crate) fn namespace_data(ns: &Namespace) -> IdentifyNamespace {
    let mut d = IdentifyNamespace::new_zeroed();
    let nsze = ns.nsze();
    d.nsze = U64::new(nsze);
    d.ncap = U64::new(nsze);
    d.nuse = U64::new(nsze);
    let formats = &LBA_FORMATS[..ns.format_count()];
    d.nlbaf = (formats.len() - 1) as u8;
    d.flbas = nvme_spec::identify::flbas::from_index(ns.lba_format(), ns.extended());
    if ns.info.read_only {
        d.nsattr = nvme_spec::identify::nsattr::WRITE_PROTECTED;
    }
    if ns.meta.is_some() {
        // Metadata in a separate buffer (MPTR) or inline (extended LBAs).
        d.mc = mc::SEPARATE | mc::EXTENDED;
        d.dpc = dpc::TYPE1 | dpc::TYPE2 | dpc::TYPE3 | dpc::FIRST | dpc::LAST;
        d.dps = ns.dps();
    }
    if ns.info.discard && ns.info.discard_zeroes {
        d.dlfeat = dlfeat::READ_ZEROES | dlfeat::WRITE_ZEROES_DEALLOC;
    }
    for (i, f) in formats.iter().enumerate() {
        // Relative performance: 4 KiB is "best" (0), 512 B "better" (1), either
        // with metadata (kept apart from the data) "good" (2).
        let rp = (f.shift != 12) as u8 + if f.ms > 0 { 1 } else { 0 };
        d.lbaf[i] = LbaFormat { ms: U16::new(f.ms), lbads: f.shift, rp };
    }
    let (mssrl, mcl, msrc) = crate::io::copy_limits(ns.lba_shift());
    d.mssrl = U16::new(mssrl);
    d.mcl = U32::new(mcl);
    d.msrc = msrc;
    d.nguid = ns.ids.nguid;
    d.eui64 = ns.ids.eui64;
    if ns.reservations().is_some() {
        // Every type, kept through power loss (the state file); IEKEY honoured
        // on Acquire and Release too (Linux sets it there), so not the 1.3 bit.
        use nvme_spec::resv::rescap;
        d.rescap = rescap::PTPL | rescap::ALL_TYPES;
    }
    d
}

/// The NVM command set specific Identify Namespace structure of `ns`: each
/// format's guard (no storage tags).
pub(crate) fn nvm_namespace_data(ns: &Namespace) -> IdentifyNamespaceNvm {
    let mut d = IdentifyNamespaceNvm::new_zeroed();
    for (i, f) in LBA_FORMATS[..ns.format_count()].iter().enumerate() {
        d.elbaf[i] = U32::new(elbaf::new(0, f.guard.pif()));
    }
    d
}

/// The Zoned Namespace command set's Identify Namespace structure of zoned `ns`.
fn zoned_namespace_data(ns: &Namespace) -> IdentifyNamespaceZns {
    let zones = ns.zones.as_ref().expect("a zoned namespace");
    let cfg = zones.config();
    let limit = |n: u32| U32::new(if n == 0 { nvme_spec::zns::NO_LIMIT } else { n - 1 });
    let mut d = IdentifyNamespaceZns {
        // Reads may cross zone boundaries; capacity is fixed, no active excursions.
        ozcs: U16::new(nvme_spec::zns::OZCS_RAZB),
        mar: limit(cfg.max_active),
        mor: limit(cfg.max_open),
        ..Default::default()
    };
    for (i, f) in LBA_FORMATS[..ns.format_count()].iter().enumerate() {
        d.lbafe[i] = ZoneFormatExtension { zsze: U64::new(cfg.zone_size >> f.shift), ..Default::default() };
    }
    d
}
