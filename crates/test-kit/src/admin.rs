//! The admin facade: sending an admin command and getting its completion.
//!
//! Every method here runs the device ([`MockHost::process`]) after posting, the way
//! Linux's admin path waits for its completion. They differ only in what they do
//! with the result:
//!
//! | method                 | reaps   | other completions reaped meanwhile | error status |
//! |------------------------|---------|------------------------------------|--------------|
//! | [`MockHost::admin_exec`]   | all | returned                          | returned     |
//! | [`MockHost::admin_cmd`]    | all | dropped                           | returned     |
//! | [`MockHost::admin_ok`]     | all | dropped                           | `Err`        |
//! | [`MockHost::admin_raw`]    | all | a panic                           | returned     |
//! | [`MockHost::admin_status`] | all | a panic                           | returned     |
//! | [`MockHost::submit_aer`]   | none| left for [`MockHost::reap_admin`] | —            |
//!
//! "Other completions" are in practice Asynchronous Event Requests an event
//! completed. To post an admin command *without* running the device, use the queue
//! level [`MockHost::submit`] with queue 0: nothing at that level runs the device.

use nvme_spec::admin::{GetFeaturesCmd, GetLogPageCmd, IdentifyCmd, SetFeaturesCmd};
use nvme_spec::opcode::admin as aop;
use nvme_spec::{Cqe, Sqe};

use crate::{HostError, MockHost, PAGE};

impl MockHost {
    /// Posts an admin command, runs the device, and returns the command's completion
    /// (None if it has none yet) together with every other admin completion reaped
    /// meanwhile.
    pub fn admin_exec(&mut self, sqe: Sqe) -> (Option<Cqe>, Vec<Cqe>) {
        let cid = self.submit(0, sqe).expect("admin queue has room");
        self.process();
        let (mine, others): (Vec<Cqe>, Vec<Cqe>) =
            self.reap_queue(0).into_iter().partition(|c| c.cid.get() == cid);
        (mine.into_iter().next(), others)
    }

    /// As [`MockHost::admin_exec`], dropping the other completions: for bring-up and
    /// queue management that must work whatever AERs are outstanding.
    pub fn admin_cmd(&mut self, sqe: Sqe) -> Result<Cqe, HostError> {
        self.admin_exec(sqe).0.ok_or(HostError::NoCompletion)
    }

    /// As [`MockHost::admin_cmd`], failing on an error status.
    pub fn admin_ok(&mut self, sqe: Sqe) -> Result<Cqe, HostError> {
        let c = self.admin_cmd(sqe)?;
        if c.status().is_success() {
            Ok(c)
        } else {
            Err(HostError::Command(c.status()))
        }
    }

    /// Runs an admin command that must complete, alone; returns its completion.
    pub fn admin_raw(&mut self, sqe: Sqe) -> Cqe {
        let (c, others) = self.admin_exec(sqe);
        assert!(others.is_empty(), "unexpected admin completions: {others:?}");
        c.expect("admin command completed")
    }

    /// The status of an admin command that must complete, alone.
    pub fn admin_status(&mut self, sqe: Sqe) -> nvme_spec::Status {
        self.admin_raw(sqe).status()
    }

    /// Posts an Asynchronous Event Request and runs the device, so the controller
    /// holds it outstanding before the test goes on. Returns its command identifier;
    /// its completion comes from a later reap.
    pub fn submit_aer(&mut self) -> u16 {
        let cid = self.submit(0, Sqe::with_opcode(aop::ASYNC_EVENT_REQUEST)).expect("admin queue has room");
        self.process();
        cid
    }

    /// Runs the device and returns every new admin completion.
    pub fn reap_admin(&mut self) -> Vec<Cqe> {
        self.process();
        self.reap_queue(0)
    }

    // ---- commands the bring-up uses

    /// Identify into the admin buffer; returns the 4096 bytes.
    pub fn identify(&mut self, cns: u8, nsid: u32) -> Result<Vec<u8>, HostError> {
        let mut c = IdentifyCmd { nsid, cns, ..Default::default() }.to_sqe();
        c.set_prps(self.admin_buf, 0);
        self.admin_ok(c)?;
        let mut v = vec![0u8; 4096];
        self.mem.read(self.admin_buf, &mut v).expect("admin buf");
        Ok(v)
    }

    pub fn set_feature(&mut self, fid: u8, value: u32) -> Result<Cqe, HostError> {
        self.admin_ok(SetFeaturesCmd { fid, cdw11: value, ..Default::default() }.to_sqe())
    }

    pub fn get_feature(&mut self, fid: u8, cdw11: u32) -> Result<Cqe, HostError> {
        let mut c = GetFeaturesCmd { fid, cdw11, ..Default::default() }.to_sqe();
        c.set_prps(self.admin_buf, 0);
        self.admin_ok(c)
    }

    /// Get Log Page of `len` bytes (a multiple of 4) into the admin buffer.
    pub fn get_log(&mut self, lid: u8, nsid: u32, len: u32, rae: bool) -> Result<Vec<u8>, HostError> {
        if len as u64 > 2 * PAGE {
            panic!("mock host get_log supports up to 8 KiB");
        }
        let mut c = GetLogPageCmd { nsid, lid, rae, numd_z: len / 4 - 1, ..Default::default() }.to_sqe();
        c.set_prps(self.admin_buf, self.admin_buf + PAGE);
        self.admin_ok(c)?;
        let mut v = vec![0u8; len as usize];
        self.mem.read(self.admin_buf, &mut v).expect("admin buf");
        Ok(v)
    }
}
