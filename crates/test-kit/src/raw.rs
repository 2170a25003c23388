//! The raw facade: admin commands built with exactly the fields a test wants to get
//! wrong, each run through the admin facade (so the device runs) and returning the
//! completion or its status (never failing on an error status), so tests can assert
//! the status the spec names.

use nvme_spec::admin::{
    AbortCmd, CreateIoCqCmd, CreateIoSqCmd, DeleteIoCqCmd, DeleteIoSqCmd, DoorbellBufferConfigCmd,
    FeatureSelect, GetFeaturesCmd, GetLogPageCmd, IdentifyCmd, SetFeaturesCmd,
};
use nvme_spec::opcode::admin as aop;
use nvme_spec::{Cqe, Sqe, Status};
use zerocopy::little_endian::U32;

use crate::{HostDbbuf, MockHost, PAGE};

impl MockHost {
    /// Create I/O Completion Queue with every field given.
    pub fn create_cq_raw(&mut self, cmd: CreateIoCqCmd) -> Status {
        self.admin_status(cmd.to_sqe())
    }

    /// Create I/O Submission Queue with every field given.
    pub fn create_sq_raw(&mut self, qid: u16, qsize_z: u16, base: u64, pc: bool, cqid: u16) -> Status {
        self.admin_status(CreateIoSqCmd { qid, qsize_z, base, pc, cqid, ..Default::default() }.to_sqe())
    }

    pub fn delete_sq(&mut self, qid: u16) -> Status {
        self.admin_status(DeleteIoSqCmd { qid }.to_sqe())
    }

    pub fn delete_cq(&mut self, qid: u16) -> Status {
        self.admin_status(DeleteIoCqCmd { qid }.to_sqe())
    }

    /// Identify with CNS, NSID and CDW11 (CSI in 31:24) given; the data on success.
    /// CDW11 is raw so tests can set its reserved bits.
    pub fn identify_raw(&mut self, cns: u8, nsid: u32, cdw11: u32) -> Result<Vec<u8>, Status> {
        let mut c = IdentifyCmd { nsid, cns, ..Default::default() }.to_sqe();
        c.set_prps(self.admin_buf, 0);
        c.cdw11 = U32::new(cdw11);
        self.mem.fill(self.admin_buf, PAGE, 0xa5).expect("admin buf");
        let st = self.admin_status(c);
        if !st.is_success() {
            return Err(st);
        }
        let mut v = vec![0u8; PAGE as usize];
        self.mem.read(self.admin_buf, &mut v).expect("admin buf");
        Ok(v)
    }

    /// Get Log Page with every field given: `numd_z` dwords (0's based) from byte
    /// `offset`, into the admin buffer (PRP1, PRP2 = next page). Returns the
    /// completion status and the first `min(len, 8 KiB)` bytes of the buffer.
    pub fn get_log_raw(
        &mut self,
        lid: u8,
        nsid: u32,
        numd_z: u32,
        offset: u64,
        rae: bool,
    ) -> (Status, Vec<u8>) {
        let (st, v, others) = self.get_log_exec(lid, nsid, numd_z, offset, rae);
        assert!(others.is_empty(), "unexpected admin completions: {others:?}");
        (st, v)
    }

    /// As [`MockHost::get_log_raw`], also returning the other admin completions reaped
    /// meanwhile (an Asynchronous Event Request that reading the log unmasked).
    pub fn get_log_exec(
        &mut self,
        lid: u8,
        nsid: u32,
        numd_z: u32,
        offset: u64,
        rae: bool,
    ) -> (Status, Vec<u8>, Vec<Cqe>) {
        let mut c = GetLogPageCmd { nsid, lid, rae, numd_z, offset, ..Default::default() }.to_sqe();
        c.set_prps(self.admin_buf, self.admin_buf + PAGE);
        let len = ((numd_z as u64 + 1) * 4).min(2 * PAGE);
        self.mem.fill(self.admin_buf, 2 * PAGE, 0xa5).expect("admin buf");
        let (c, others) = self.admin_exec(c);
        let st = c.expect("get log page completed").status();
        let mut v = vec![0u8; len as usize];
        self.mem.read(self.admin_buf, &mut v).expect("admin buf");
        (st, v, others)
    }

    /// Get Log Page of `len` bytes from `offset` that must succeed.
    pub fn log_at(&mut self, lid: u8, len: u32, offset: u64, rae: bool) -> Vec<u8> {
        let (st, v) = self.get_log_raw(lid, 0xffff_ffff, len / 4 - 1, offset, rae);
        assert_eq!(st, Status::SUCCESS, "get log page {lid:#x}");
        v
    }

    /// Get Features with SEL (raw, so tests can send reserved values) and CDW11 given;
    /// PRP1 is the admin buffer.
    pub fn get_features_raw(&mut self, fid: u8, sel: u8, cdw11: u32) -> Cqe {
        let sel = FeatureSelect::from_bits(sel);
        let mut c = GetFeaturesCmd { fid, sel, cdw11, ..Default::default() }.to_sqe();
        c.set_prps(self.admin_buf, 0);
        self.admin_raw(c)
    }

    /// Set Features with SV and CDW11 given; PRP1 is the admin buffer.
    pub fn set_features_raw(&mut self, fid: u8, cdw11: u32, sv: bool) -> Cqe {
        let mut c = SetFeaturesCmd { fid, sv, cdw11, ..Default::default() }.to_sqe();
        c.set_prps(self.admin_buf, 0);
        self.admin_raw(c)
    }

    /// Format NVM of `nsid` with CDW10 given.
    pub fn format_raw(&mut self, nsid: u32, cdw10: u32) -> Status {
        let mut c = Sqe::with_opcode(aop::FORMAT_NVM);
        c.nsid = U32::new(nsid);
        c.cdw10 = U32::new(cdw10);
        self.admin_status(c)
    }

    /// Abort of command `cid` on SQ `sqid`; returns the completion.
    pub fn abort_raw(&mut self, sqid: u16, cid: u16) -> Cqe {
        self.admin_raw(AbortCmd { sqid, cid }.to_sqe())
    }

    /// Doorbell Buffer Config with PRP1 and PRP2 given. On success the host starts
    /// using these buffers for its shadow doorbells.
    pub fn dbbuf_raw(&mut self, shadow: u64, eventidx: u64) -> Status {
        let st = self.admin_status(DoorbellBufferConfigCmd { shadow_doorbell: shadow, eventidx }.to_sqe());
        if st.is_success() {
            self.dbbuf = Some(HostDbbuf { shadow, eventidx });
        }
        st
    }

    /// An admin SQE with `opcode`, PRPs used for data, everything else zero.
    pub fn admin_sqe(opcode: u8) -> Sqe {
        Sqe::with_opcode(opcode)
    }
}
