//! The pool's namespaces on this controller (`crate::pool`): what the pool says
//! is attached here is active here. Each time the admin side runs it looks at
//! the pool's change counter (one load); when it moved, namespaces attached to
//! this controller since are added and those detached, deleted or made again
//! (a new NGUID at the same NSID) are removed, and those another controller
//! formatted take their new format, each raising Namespace Attribute Changed as
//! an operator's `ns.add` and `ns.remove` do.

use std::sync::Arc;

use tracing::{info, warn};

use super::Controller;
use crate::config::NamespaceConfig;
use crate::namespace::FormatState;
use crate::pool::{NamespacePool, PoolNamespace};

/// What the controller attaches for the pool's namespace `nsid`.
fn pool_namespace_config(
    pool: &NamespacePool,
    nsid: u32,
    n: &PoolNamespace,
) -> Result<NamespaceConfig, String> {
    let backend = pool
        .open_backend(nsid, &n.nguid)
        .map_err(|e| format!("{}: {e}", crate::pool::data_file(nsid, &n.nguid)))?;
    Ok(NamespaceConfig {
        nsid: Some(nsid),
        ana_group: Some(n.ana_group),
        identity: Some(n.nguid),
        ..NamespaceConfig::new(backend, n.lba_format)
    })
}

impl Controller {
    /// The namespace pool this controller creates and attaches namespaces from.
    pub fn pool(&self) -> Option<&Arc<NamespacePool>> {
        self.cfg.pool.as_ref()
    }

    /// Makes this controller's namespaces match what the pool says of it, if the
    /// pool changed since the last look (the admin side does this each time it
    /// runs; an operator's change through this controller, at once). Returns
    /// whether any namespace came or went.
    pub fn sync_pool(&mut self) -> bool {
        // One load of the pool's counter when nothing changed (this runs with
        // every `process`); a namespace that could not be attached is tried
        // again a second later.
        let Some(p) = &self.cfg.pool else { return false };
        let retry = self.admin.pool_retry_at.is_some_and(|at| self.clock.now_ns() >= at);
        if !p.changed_since_last_look() && !retry {
            return false;
        }
        let pool = p.clone();
        self.sync_pool_now(&pool, true)
    }

    /// [`Self::sync_pool`] without telling the host (at the controller's start).
    pub(crate) fn sync_pool_quietly(&mut self) {
        if let Some(pool) = self.cfg.pool.clone() {
            pool.changed_since_last_look();
            self.sync_pool_now(&pool, false);
        }
    }

    fn sync_pool_now(&mut self, pool: &Arc<NamespacePool>, tell: bool) -> bool {
        let state = pool.state();
        let me = pool.cntlid();
        let mut changed = false;
        self.admin.pool_retry_at = None;
        let here: Vec<(u32, [u8; 16])> = self.admin.pool_here.iter().map(|(&n, &g)| (n, g)).collect();
        for (nsid, nguid) in here {
            let stays = state.namespaces.get(&nsid).filter(|n| n.nguid == nguid && n.attached.contains(&me));
            if let Some(n) = stays {
                let f = FormatState { lbaf: n.lba_format, dps: 0, extended: false };
                changed |= self.follow_format(nsid, f, tell);
            } else {
                self.admin.pool_here.remove(&nsid);
                match self.drop_namespace(nsid) {
                    Ok(()) if tell => self.namespace_changed(nsid),
                    Ok(()) => {}
                    Err(e) => warn!(nsid, "namespace pool: cannot detach namespace {nsid} here: {e}"),
                }
                changed = true;
            }
        }
        for (&nsid, &f) in &state.fixed_formats {
            if !self.admin.pool_here.contains_key(&nsid) {
                changed |= self.follow_format(nsid, f, tell);
            }
        }
        for (&nsid, n) in &state.namespaces {
            if !n.attached.contains(&me) || self.admin.pool_here.contains_key(&nsid) {
                continue;
            }
            let added = pool_namespace_config(pool, nsid, n)
                .and_then(|cfg| self.insert_namespace(&cfg, nsid).map_err(|e| e.to_string()));
            match added {
                Ok(()) => {
                    self.admin.pool_here.insert(nsid, n.nguid);
                    if tell {
                        self.namespace_changed(nsid);
                    }
                    changed = true;
                }
                Err(e) => {
                    log_limit::limited_warn!(target: "vnvme::backend", nsid, "namespace pool: cannot attach namespace {nsid} here (trying again each second): {e}");
                    self.admin.pool_retry_at = Some(self.clock.now_ns() + 1_000_000_000);
                }
            }
        }
        changed
    }

    /// Puts namespace `nsid` in format `f`, the one a host chose through another
    /// controller that has it (or through this one before it started again), if
    /// it is not in it already and can be (`format::adopt`). Its metadata is left
    /// as the formatting controller left it; its zones start over, as there. True
    /// if it changed (and the host was told, with `tell`).
    fn follow_format(&mut self, nsid: u32, f: FormatState, tell: bool) -> bool {
        let Some(ns) = crate::namespace::lookup(&self.namespaces, nsid).cloned() else { return false };
        match crate::admin::format::adopt(&ns, f) {
            Ok(false) => return false,
            Ok(true) => {}
            Err(why) => {
                log_limit::limited_warn!(target: "vnvme::backend", nsid, lbaf = f.lbaf, "namespace pool: the format another controller gave namespace {nsid} is not taken up: {why}");
                return false;
            }
        }
        if let Some(z) = &ns.zones {
            z.reset_controller(true);
        }
        self.admin.format_epoch += 1;
        info!(nsid, lba_size = 1u32 << ns.lba_shift(), "namespace formatted through another controller");
        if tell {
            self.namespace_changed(nsid);
        }
        true
    }

    /// Whether `nsid` is one of the pool's namespaces, active here (an upgrade
    /// leaves it to the pool: the next process attaches it from there).
    pub fn is_pool_namespace(&self, nsid: u32) -> bool {
        self.admin.pool_here.contains_key(&nsid)
    }

    /// Tells the pool which NSIDs the operator gave this controller (those active
    /// and not the pool's), so it never gives them out.
    pub(crate) fn claim_fixed_nsids(&self) -> Result<(), String> {
        let Some(pool) = &self.cfg.pool else { return Ok(()) };
        let fixed: Vec<u32> =
            self.namespaces().map(|n| n.nsid).filter(|n| !self.admin.pool_here.contains_key(n)).collect();
        pool.claim(&fixed)
    }
}
