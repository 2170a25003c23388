//! The admin side of reservations (`crate::reservation`): the Host Identifier,
//! Reservation Notification Mask and Reservation Persistence features, and the
//! Reservation Notification log page (LID 80h) this controller fills from the
//! notifications other controllers' changes owe it
//! ([`crate::reservation::NotificationLog`]).

use std::sync::Arc;

use nvme_spec::admin::FeatureSelect;
use nvme_spec::admin::Features;
use nvme_spec::aer::{AsyncEvent, EventType};
use nvme_spec::resv::{fid, notify_mask};
use nvme_spec::{Sqe, NSID_ALL};
use zerocopy::IntoBytes;

use super::{Admin, AdminDone};
use crate::error::{CmdResult, CommandError};
use crate::namespace::{active, Namespace};

/// The namespaces with reservations `nsid` names (every one for FFFFFFFFh), or
/// Invalid Field / Invalid Namespace.
fn reserved(namespaces: &[Option<Arc<Namespace>>], nsid: u32) -> CmdResult<Vec<Arc<Namespace>>> {
    if nsid == NSID_ALL {
        return Ok(active(namespaces).filter(|n| n.reservations().is_some()).cloned().collect());
    }
    let ns = crate::namespace::for_command(namespaces, nsid)?;
    if ns.reservations().is_none() {
        return Err(CommandError::InvalidField("the namespace has no reservations"));
    }
    Ok(vec![ns])
}

impl Admin<'_> {
    /// Set Features of a reservation feature (None: not one).
    pub(crate) fn set_resv_feature(&mut self, sqe: &Sqe) -> Option<CmdResult<AdminDone>> {
        if !self.admin.resv_log.watching() {
            // No namespace has reservations: the features do not exist.
            return None;
        }
        let f = Features(sqe);
        Some(match f.fid() {
            fid::HOST_IDENTIFIER => self.set_host_id(sqe),
            fid::RESERVATION_NOTIFICATION_MASK => reserved(self.namespaces, f.nsid()).map(|nss| {
                for ns in nss {
                    self.admin.resv_log.set_mask(ns.nsid, f.value() & notify_mask::ALL);
                }
                AdminDone::Complete(0)
            }),
            fid::RESERVATION_PERSISTENCE => reserved(self.namespaces, f.nsid()).and_then(|nss| {
                let ptpl = f.value() & 1 != 0;
                for ns in nss {
                    let r = ns.reservations().expect("only those with reservations");
                    r.update(|s, _| {
                        s.ptpl = ptpl;
                        Ok(())
                    })
                    .map_err(CommandError::Status)?;
                }
                Ok(AdminDone::Complete(0))
            }),
            _ => return None,
        })
    }

    fn set_host_id(&mut self, sqe: &Sqe) -> CmdResult<AdminDone> {
        // EXHID: the 128-bit form (Reservation Report's extended structure), else
        // the 64-bit one.
        let extended = Features(sqe).value() & 1 != 0;
        let len = if extended { 16 } else { 8 };
        let data = self.copy_from_host(sqe, len)?;
        let mut id = [0u8; 16];
        id[..len].copy_from_slice(&data);
        // No reservation command of this host runs meanwhile (see
        // `HostIdentity::serialize`).
        let host = self.admin.host.clone();
        let _one = host.serialize();
        let (old, _) = self.admin.host.get();
        if id != old {
            // A registered host keeps its identifier (Command Sequence Error).
            let registered = active(self.namespaces)
                .filter_map(|n| n.reservations())
                .any(|r| r.current().registrants.iter().any(|g| g.host == old));
            if registered && old != [0; 16] {
                return Err(CommandError::Sequence("Host Identifier changed while the host is registered"));
            }
        }
        self.admin.host.set(id, extended);
        for r in active(self.namespaces).filter_map(|n| n.reservations()) {
            r.name_host(id);
        }
        Ok(AdminDone::Complete(0))
    }

    /// Get Features of a reservation feature (None: not one).
    pub(crate) fn get_resv_feature(&mut self, sqe: &Sqe) -> Option<CmdResult<AdminDone>> {
        if !self.admin.resv_log.watching() {
            return None;
        }
        let f = Features(sqe);
        if f.sel() == FeatureSelect::SupportedCapabilities {
            return match f.fid() {
                fid::HOST_IDENTIFIER => {
                    Some(Ok(AdminDone::Complete(nvme_spec::features::capability::CHANGEABLE)))
                }
                fid::RESERVATION_NOTIFICATION_MASK | fid::RESERVATION_PERSISTENCE => {
                    Some(Ok(AdminDone::Complete(
                        nvme_spec::features::capability::CHANGEABLE
                            | nvme_spec::features::capability::NAMESPACE_SPECIFIC,
                    )))
                }
                _ => None,
            };
        }
        let current = f.sel() == FeatureSelect::Current;
        Some(match f.fid() {
            fid::HOST_IDENTIFIER => {
                let (id, extended) = if current { self.admin.host.get() } else { ([0; 16], false) };
                let len = if extended { 16 } else { 8 };
                self.copy_to_host(sqe, &id[..len]).map(|()| AdminDone::Complete(extended as u32))
            }
            fid::RESERVATION_NOTIFICATION_MASK if f.nsid() != NSID_ALL => reserved(self.namespaces, f.nsid())
                .map(|nss| {
                    let m = if current { self.admin.resv_log.mask(nss[0].nsid) } else { None };
                    AdminDone::Complete(m.unwrap_or(0))
                }),
            fid::RESERVATION_PERSISTENCE if f.nsid() != NSID_ALL => {
                reserved(self.namespaces, f.nsid()).map(|nss| {
                    let ptpl = current && nss[0].reservations().is_some_and(|r| r.current().ptpl);
                    AdminDone::Complete(ptpl as u32)
                })
            }
            fid::RESERVATION_NOTIFICATION_MASK | fid::RESERVATION_PERSISTENCE => {
                Err(CommandError::InvalidField("a namespace specific feature of every namespace"))
            }
            _ => return None,
        })
    }

    /// The Reservation Notification log page: its next entry (taken once the
    /// host has it: [`NotificationLog::taken`](crate::reservation::NotificationLog)).
    pub(crate) fn resv_notification_page(&mut self) -> Vec<u8> {
        self.admin.resv_log.peek().as_bytes().to_vec()
    }

    /// Takes the notifications other controllers' changes owe this one: log
    /// entries (unless masked) and a Reservation Log Page Available event.
    pub(crate) fn collect_resv_notices(&mut self) -> bool {
        let mut any = false;
        for ns in active(self.namespaces) {
            let Some(r) = ns.reservations() else { continue };
            for kind in r.take_notices() {
                if self.admin.resv_log.masked(ns.nsid, kind) {
                    continue;
                }
                self.admin.resv_log.push(kind, ns.nsid);
                any = true;
            }
        }
        if any {
            self.events.raise(AsyncEvent {
                kind: EventType::IoCommandSpecific,
                info: nvme_spec::resv::AEN_LOG_PAGE_AVAILABLE,
                log_page: nvme_spec::resv::LID_NOTIFICATION,
            });
        }
        any
    }
}
