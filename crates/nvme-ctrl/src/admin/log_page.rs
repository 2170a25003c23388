//! Get Log Page (Base §5.1.12): Error Information, SMART / Health, Firmware Slot,
//! Changed Namespace List, Commands Supported and Effects, Asymmetric Namespace
//! Access.

use nvme_spec::admin::GetLogPage;
use nvme_spec::log::{
    lid, u128_le, ChangedNamespaceList, ErrorInformationEntry, FirmwareSlotLog, SmartHealthLog,
};
use nvme_spec::zns::{CSI_NVM, CSI_ZNS};
use nvme_spec::{Sqe, Status};
use zerocopy::little_endian::U16;
use zerocopy::{FromZeros, IntoBytes};

use super::{status, Admin, AdminDone};
use crate::error::{CmdResult, CommandError};
use crate::events::ERROR_LOG_ENTRIES;
use crate::io::{NVM, ZONED};

impl Admin<'_> {
    pub(crate) fn get_log_page(&mut self, sqe: &Sqe) -> CmdResult<AdminDone> {
        let g = GetLogPage(sqe);
        if g.ot() {
            return Err(CommandError::InvalidField("index offsets are not supported"));
        }
        let page: Vec<u8> = match g.lid() {
            lid::ERROR_INFORMATION => {
                let mut v = self.events.error_log();
                v.resize(ERROR_LOG_ENTRIES, ErrorInformationEntry::new_zeroed());
                v.as_bytes().to_vec()
            }
            lid::SMART_HEALTH => self.smart_log().as_bytes().to_vec(),
            lid::FIRMWARE_SLOT => {
                let mut f = FirmwareSlotLog::new_zeroed();
                f.afi = 1;
                f.frs[0] = nvme_spec::identify::ascii_pad(&self.cfg.firmware);
                f.as_bytes().to_vec()
            }
            lid::CHANGED_NAMESPACE_LIST => {
                ChangedNamespaceList::new(&self.events.changed_namespaces()).as_bytes().to_vec()
            }
            lid::COMMANDS_SUPPORTED_AND_EFFECTS => match g.csi() {
                CSI_NVM => crate::commands::effects_log(&super::table::ADMIN, &[&NVM], &self.offers())
                    .as_bytes()
                    .to_vec(),
                CSI_ZNS => {
                    crate::commands::effects_log(&super::table::ADMIN, &[&NVM, &ZONED], &self.offers())
                        .as_bytes()
                        .to_vec()
                }
                _ => {
                    return Err(CommandError::InvalidField(
                        "Commands Supported and Effects of an unknown CSI",
                    ))
                }
            },
            lid::FDP_CONFIGURATIONS | lid::RUH_USAGE | lid::FDP_STATISTICS | lid::FDP_EVENTS => {
                let Some(fdp) = self.admin.fdp.clone() else {
                    return status(Status::INVALID_LOG_PAGE);
                };
                if g.lsi() != crate::fdp::ENDGID {
                    return Err(CommandError::InvalidField("no such endurance group"));
                }
                match g.lid() {
                    lid::FDP_CONFIGURATIONS => fdp.configurations_log(self.max_namespaces()),
                    lid::RUH_USAGE => fdp.usage_log(),
                    lid::FDP_STATISTICS => fdp.statistics_log(),
                    _ => fdp.events_log(g.lsp() & 1 != 0, |at| self.timestamp_at(at)),
                }
            }
            // Reported by a controller of a subsystem only (crate::ana).
            lid::ANA if self.cfg.subsystem.is_some() => {
                let groups_only = g.lsp() & nvme_spec::ana::LSP_RETURN_GROUPS_ONLY != 0;
                let members = crate::namespace::active(self.namespaces).map(|n| (n.nsid, n.ana_group().id()));
                self.admin.ana.log_page(members, groups_only)
            }
            // Where some namespace has reservations.
            nvme_spec::resv::LID_NOTIFICATION if self.admin.resv_log.watching() => {
                self.resv_notification_page()
            }
            lid::CHANGED_ZONE_LIST => {
                let ns = self.active_ns(sqe.nsid.get())?;
                let Some(zones) = &ns.zones else {
                    return Err(CommandError::InvalidField("the Changed Zone List is a zoned namespace's"));
                };
                // Emptied below, once the host has the page.
                let (list, overflow) = zones.changed_zones(ns.lba_shift());
                nvme_spec::zns::changed_zone_list(&list, overflow).to_vec()
            }
            _ => return status(Status::INVALID_LOG_PAGE),
        };
        let off = g.offset();
        if off % 4 != 0 || off > page.len() as u64 {
            return Err(CommandError::InvalidField("log page offset"));
        }
        let len = g.transfer_len();
        if len > self.mdts_bytes() {
            return Err(CommandError::TooLarge(len));
        }
        // Bytes past the end of the log read as zero.
        let mut out = vec![0u8; len as usize];
        let avail = &page[off as usize..];
        let n = avail.len().min(out.len());
        out[..n].copy_from_slice(&avail[..n]);
        self.copy_to_host(sqe, &out)?;
        if g.lid() == nvme_spec::resv::LID_NOTIFICATION {
            // Delivered: the next read gives the next entry.
            self.admin.resv_log.taken();
        }
        if !g.rae() {
            self.events.log_read(g.lid());
            if let (lid::CHANGED_ZONE_LIST, Ok(ns)) = (g.lid(), self.active_ns(sqe.nsid.get())) {
                if let Some(z) = &ns.zones {
                    z.clear_changed_zones();
                }
            }
        }
        Ok(AdminDone::Complete(0))
    }

    fn smart_log(&self) -> SmartHealthLog {
        let s = self.stats.snapshot();
        let mut l = SmartHealthLog::new_zeroed();
        l.critical_warning = self.events.critical_warning();
        l.composite_temperature = U16::new(self.cfg.temperature_k);
        l.temp_sensor[0] = U16::new(self.cfg.temperature_k);
        l.available_spare = 100;
        l.available_spare_threshold = 10;
        // Data units are thousands of 512-byte units, rounded up (Base SMART log).
        l.data_units_read = u128_le((s.bytes_read as u128).div_ceil(512_000));
        l.data_units_written = u128_le((s.bytes_written as u128).div_ceil(512_000));
        l.host_read_commands = u128_le(s.read_commands as u128);
        l.host_write_commands = u128_le(s.write_commands as u128);
        l.power_cycles = u128_le(1);
        let hours = self.clock.now_ns().saturating_sub(self.admin.created_ns) / 3_600_000_000_000;
        l.power_on_hours = u128_le(hours as u128);
        l.media_errors = u128_le(s.media_errors as u128);
        l.num_err_log_entries = u128_le(self.events.error_count() as u128);
        l
    }
}
