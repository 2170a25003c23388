//! Mostly-valid commands: built the way a correct host builds them (valid opcode,
//! namespace, LBA range, PRPs or SGLs over the data area), then one field mutated.

use nvme_spec::admin::{
    AbortCmd, CreateIoCqCmd, CreateIoSqCmd, DeleteIoCqCmd, DeleteIoSqCmd, DoorbellBufferConfigCmd,
    FeatureSelect, FormatNvmCmd, GetFeaturesCmd, GetLogPageCmd, IdentifyCmd, SetFeaturesCmd,
};
use nvme_spec::command::Psdt;
use nvme_spec::nvm::{
    CopyCmd, CopyRange, CopyRangeF1, DatasetManagementCmd, DsmRange, FlushCmd, ReadWriteCmd, WriteZeroesCmd,
};
use nvme_spec::opcode::{admin as aop, nvm as iop, zns as zop};
use nvme_spec::sgl::{SglDescriptor, SglType};
use nvme_spec::zns::ZoneMgmtCmd;
use nvme_spec::{Sqe, CQE_SIZE, NSID_ALL, SQE_SIZE};
use test_kit::PAGE;
use zerocopy::little_endian::{U32, U64};
use zerocopy::IntoBytes;

use crate::exec::{Fuzzer, LIST_PAGES, MEM_BYTES};
use crate::program::{AdminCmd, Burst, IoCmd, Mutation};

/// Mutation kinds below this leave the command valid.
const MUTATE_FROM: u8 = 12;

/// What a mutation did, to decide whether it may break host/controller agreement.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Mutated {
    None,
    /// Anything that can make the controller write somewhere the host did not intend.
    Pointer,
    /// Fields that change what the command does within its own buffers.
    Field,
}

/// The I/O commands the fuzzer builds with a builder of their own, by `IoCmd::op`
/// (Flush twice); one slot more builds a command of the controller's tables that
/// has none here, generically, so a command added to the tables is fuzzed with no
/// change here. Each is in the tables (`typed_io_opcodes_are_the_controllers`).
const IO_OPCODES: [u8; 18] = [
    iop::READ,
    iop::WRITE,
    iop::COMPARE,
    iop::VERIFY,
    iop::WRITE_ZEROES,
    iop::FLUSH,
    iop::DATASET_MANAGEMENT,
    iop::COPY,
    iop::FLUSH,
    zop::ZONE_APPEND,
    zop::ZONE_MGMT_SEND,
    zop::ZONE_MGMT_RECV,
    iop::IO_MGMT_RECV,
    iop::IO_MGMT_SEND,
    iop::RESERVATION_REGISTER,
    iop::RESERVATION_ACQUIRE,
    iop::RESERVATION_RELEASE,
    iop::RESERVATION_REPORT,
];

/// The admin commands the fuzzer builds, by `AdminCmd::op % 15`: the opcodes each
/// builder may make. The one with raw dwords (`RAW_ADMIN`) makes commands of the
/// controller's table that have no builder here (a command added to the table is
/// fuzzed with no change here), opcodes the controller lacks, and now and then any
/// at all. A builder that makes an opcode not listed for it stops the run; each
/// listed is in the table or meant to be missing from it
/// (`typed_admin_opcodes_are_the_controllers`).
const ADMIN_OPS: [&[u8]; 15] = [
    &[aop::IDENTIFY],
    &[aop::GET_LOG_PAGE],
    &[aop::GET_FEATURES],
    &[aop::SET_FEATURES],
    &[aop::CREATE_IO_CQ],
    &[aop::CREATE_IO_SQ],
    &[aop::DELETE_IO_SQ],
    &[aop::DELETE_IO_CQ],
    &[aop::ASYNC_EVENT_REQUEST],
    &[aop::ABORT],
    // The host's own buffers (`fresh_dbbuf`), then addresses it will not use.
    &[aop::DOORBELL_BUFFER_CONFIG],
    &[aop::DOORBELL_BUFFER_CONFIG],
    &[aop::FORMAT_NVM],
    &RAW_ADMIN,
    &[aop::NAMESPACE_MANAGEMENT, aop::NAMESPACE_ATTACHMENT],
];

/// The opcodes the controller lacks that the raw admin builder picks from.
const RAW_ADMIN: [u8; 5] = [aop::FIRMWARE_COMMIT, aop::SANITIZE, aop::DEVICE_SELF_TEST, 0xc0, 0xff];

/// An opcode of a controller table (`table`) that has no builder of its own
/// (`typed` says which do), the `pick`-th (any of the table's while every one has).
fn table_opcode(mut table: impl Iterator<Item = u8> + Clone, typed: impl Fn(u8) -> bool, pick: usize) -> u8 {
    let untyped = table.clone().filter(|&o| !typed(o)).count();
    if untyped > 0 {
        return table.filter(|&o| !typed(o)).nth(pick % untyped).expect("counted");
    }
    let all = table.clone().count();
    table.nth(pick % all).expect("a table has rows")
}

impl Fuzzer<'_> {
    /// An address chosen to be interesting: inside or just outside guest memory,
    /// inside a queue ring, a shadow doorbell page or a PRP list page, or raw.
    pub(crate) fn wild(&self, v: u64) -> u64 {
        let r = v >> 8;
        let ring = |cq: bool| {
            let qs: Vec<&test_kit::HostQueue> =
                self.h.admin.iter().chain(self.h.io.iter().filter(|q| q.qid != 0)).collect();
            if qs.is_empty() {
                return r % MEM_BYTES;
            }
            let q = qs[r as usize % qs.len()];
            let (base, entry) = if cq { (q.cq.base, CQE_SIZE) } else { (q.sq.base, SQE_SIZE) };
            base + (((r >> 8) % (q.size() as u64 * entry as u64)) & !3)
        };
        match v as u8 % 12 {
            0 => v,
            1 => r % MEM_BYTES,
            2 => (r % MEM_BYTES) & !3,
            3 => (r % MEM_BYTES) & !(PAGE - 1),
            4 => ring(false),
            5 => ring(true),
            6 => match self.h.dbbuf {
                Some(b) => (if r & 1 == 0 { b.shadow } else { b.eventidx }) + (((r >> 1) % PAGE) & !3),
                None => self.h.admin_buf,
            },
            7 => (MEM_BYTES - (r % 8192 + 4)) & !3,
            8 => MEM_BYTES + r % (1 << 30),
            9 => u64::MAX - r % 8192,
            10 => self.areas.lists + ((r % (LIST_PAGES * PAGE)) & !7),
            _ => 0,
        }
    }

    /// The next list page. If the command that last used it may still be
    /// outstanding, its list is about to change under it: taint.
    pub(crate) fn list_page(&mut self) -> (usize, u64) {
        let (i, addr, owner) = self.areas.next_list_page();
        if let Some((q, cid)) = owner {
            if self.outstanding.get(&q).is_some_and(|s| s.contains(&cid)) {
                self.tainted = true;
            }
        }
        (i, addr)
    }

    pub(crate) fn write_mem(&self, addr: u64, bytes: &[u8]) {
        self.h.mem.write(addr, bytes).expect("harness buffers are in guest memory");
    }

    /// PRP1/PRP2 for `len` bytes at `buf`, with a PRP list (optionally starting
    /// near the end of its page, so it chains into a second one) when needed.
    fn prps(&mut self, buf: u64, len: u64, chain: u8, pages: &mut Vec<usize>) -> (u64, u64) {
        let first = PAGE - buf % PAGE;
        if len <= first {
            return (buf, 0);
        }
        if len <= first + PAGE {
            return (buf, buf + first);
        }
        let entries: Vec<u64> =
            (0..).map(|i| buf + first + i * PAGE).take_while(|&p| p < buf + len).collect();
        let (i, page) = self.list_page();
        pages.push(i);
        let slots = if chain & 1 != 0 { 2 + (chain as usize >> 1) % 8 } else { 512 };
        let start = page + PAGE - slots as u64 * 8;
        if entries.len() <= slots {
            self.write_mem(start, entries.as_bytes());
        } else {
            let (j, next) = self.list_page();
            pages.push(j);
            let mut head: Vec<u64> = entries[..slots - 1].to_vec();
            head.push(next);
            self.write_mem(start, head.as_bytes());
            self.write_mem(next, entries[slots - 1..].as_bytes());
        }
        (buf, start)
    }

    /// SGL Descriptor 1 for `len` bytes at `buf`, as the command's `flags` say
    /// (`IoCmd::flags`): one data block (form 1), a last segment of some pieces
    /// (form 2) or a segment chaining to a last segment (form 3). Reads may turn a
    /// piece into a bit bucket.
    fn sgl(&mut self, buf: u64, len: u64, flags: u8, read: bool, pages: &mut Vec<usize>) -> SglDescriptor {
        let (form, pieces) = (flags & 3, flags >> 3);
        if form == 1 {
            return SglDescriptor::new(SglType::DataBlock, buf, len as u32);
        }
        let k = (1 + pieces as u64 % 8).min(len);
        let mut descs: Vec<SglDescriptor> = (0..k)
            .map(|i| {
                let lo = len * i / k;
                let hi = len * (i + 1) / k;
                SglDescriptor::new(SglType::DataBlock, buf + lo, (hi - lo) as u32)
            })
            .collect();
        if read && pieces & 0x80 != 0 && k > 2 {
            let l = descs[1].len.get();
            descs[1] = SglDescriptor::new(SglType::BitBucket, 0, l);
        }
        let (i, page) = self.list_page();
        pages.push(i);
        if form == 2 || k < 2 {
            self.write_mem(page, descs.as_bytes());
            return SglDescriptor::new(SglType::LastSegment, page, k as u32 * 16);
        }
        let rest = page + PAGE / 2;
        let first = [descs[0], SglDescriptor::new(SglType::LastSegment, rest, (k as u32 - 1) * 16)];
        self.write_mem(page, first.as_bytes());
        self.write_mem(rest, descs[1..].as_bytes());
        SglDescriptor::new(SglType::Segment, page, 32)
    }

    /// Applies `m` to `sqe`. `pages` are the list pages the command uses.
    fn mutate(&mut self, sqe: &mut Sqe, m: Mutation, pages: &[usize]) -> Mutated {
        let v = m.value;
        let kind = m.kind % 24;
        if kind < MUTATE_FROM {
            return Mutated::None;
        }
        let cdw0 = sqe.cdw0.get();
        match kind {
            12 => sqe.dptr[0] = U64::new(self.wild(v)),
            13 => sqe.dptr[1] = U64::new(self.wild(v)),
            14 => sqe.cdw12 = U32::new((sqe.cdw12.get() & !0xffff) | (v as u32 & 0xffff)),
            15 => {
                sqe.cdw10 = U32::new(v as u32);
                sqe.cdw11 = U32::new((v >> 32) as u32);
            }
            16 => {
                let n = self.h.ctrl.max_namespaces();
                sqe.nsid = U32::new([0, NSID_ALL, v as u32 >> 8, n + 1][v as usize % 4]);
            }
            17 => sqe.cdw0 = U32::new((cdw0 & !(3 << 14)) | ((v as u32 & 3) << 14)),
            18 => {
                let val = U32::new((v >> 8) as u32);
                match v % 6 {
                    0 => sqe.cdw10 = val,
                    1 => sqe.cdw11 = val,
                    2 => sqe.cdw12 = val,
                    3 => sqe.cdw13 = val,
                    4 => sqe.cdw14 = val,
                    _ => sqe.cdw15 = val,
                }
            }
            19 => sqe.cdw0 = U32::new((cdw0 & !(3 << 8)) | ((v as u32 & 3) << 8)),
            20 => sqe.cdw0 = U32::new((cdw0 & !0xff) | (v as u32 & 0xff)),
            21 => match pages.first() {
                Some(&i) => {
                    let at = self.areas.lists + i as u64 * PAGE + (v >> 56) * 8 % PAGE;
                    let w = self.wild(v);
                    self.write_mem(at, &w.to_le_bytes());
                }
                None => sqe.dptr[1] = U64::new(self.wild(v)),
            },
            22 => {
                sqe.cdw2 = U32::new(v as u32);
                sqe.cdw3 = U32::new((v >> 32) as u32);
                sqe.mptr = U64::new(v.rotate_left(13));
            }
            _ => sqe.dptr = [U64::new(v), U64::new(v.rotate_left(32))],
        }
        match kind {
            14 | 15 | 16 | 18 | 22 => Mutated::Field,
            _ => Mutated::Pointer,
        }
    }

    /// Builds a valid NVM command from `c`. Returns it, the list pages it uses and
    /// whether it writes guest memory.
    fn build_io(&mut self, c: &IoCmd) -> (Sqe, Vec<usize>, bool) {
        let nss: Vec<_> = self.h.ctrl.namespaces().cloned().collect();
        let ns = &nss[c.nsid as usize % nss.len()];
        let (shift, nsze) = (ns.lba_shift(), ns.nsze());
        let max_nlb = (self.p.mdts_bytes >> shift).clamp(1, nsze.min(65536));
        let nlb = 1 + c.nlb as u64 % max_nlb;
        let slba = c.slba as u64 % (nsze - nlb + 1);
        let len = nlb << shift;
        let buf = self.areas.data + (c.buf as u64 * 4) % 0x10000;
        let opcode = match IO_OPCODES.get(c.op as usize % (IO_OPCODES.len() + 1)) {
            Some(&o) => o,
            None => {
                // What it does is not known here: the run checks less after it.
                self.tainted = true;
                table_opcode(nvme_ctrl::io_opcodes(), |o| IO_OPCODES.contains(&o), c.slba as usize)
            }
        };
        let mut pages = Vec::new();
        let nsid = if c.op % 12 == 8 { NSID_ALL } else { ns.nsid };
        // On a zoned namespace, zone commands mostly name a zone's start (and Zone
        // Append then mostly goes to the zone's write pointer); on others they are
        // refused.
        let zone_blocks = ns.zones.as_ref().map_or(1 << 20, |z| z.config().zone_size >> shift);
        let zslba = if c.flags & 0x40 == 0 { slba - slba % zone_blocks } else { slba };
        let form = c.flags & 3;
        let writes_host = opcode == iop::READ;
        let (nlb_z, fua) = ((nlb - 1) as u16, c.flags & 4 != 0);
        let rw = ReadWriteCmd { nsid, slba, nlb_z, fua, lr: false };
        let s = match opcode {
            iop::READ | iop::WRITE | iop::COMPARE | zop::ZONE_APPEND => {
                let rw = if opcode == zop::ZONE_APPEND { ReadWriteCmd { slba: zslba, ..rw } } else { rw };
                let mut s = rw.to_sqe(opcode);
                if form == 0 {
                    let (p1, p2) = self.prps(buf, len, c.flags >> 3, &mut pages);
                    s.set_prps(p1, p2);
                } else {
                    s.set_cdw0(opcode, 0, Psdt::SglMptrContiguous);
                    let d = self.sgl(buf, len, c.flags, opcode == iop::READ, &mut pages);
                    s.set_sgl1(&d);
                }
                s
            }
            iop::DATASET_MANAGEMENT => {
                let n = 1 + c.nlb as u64 % 8;
                let (i, page) = self.list_page();
                pages.push(i);
                let mut raw = Vec::new();
                for k in 0..n {
                    let nlb = (c.slba as u64 >> (k * 4)) % 64 % nsze;
                    let slba = (c.slba as u64).wrapping_mul(k + 7) % (nsze - nlb + 1);
                    raw.extend_from_slice(DsmRange::new(slba, nlb as u32).as_bytes());
                }
                self.write_mem(page, &raw);
                let nr_z = (n - 1) as u8;
                let mut s = DatasetManagementCmd { nsid, nr_z, ad: fua, ..Default::default() }.to_sqe();
                s.set_prps(page, 0);
                return (s, pages, false);
            }
            iop::COPY => {
                // Up to 8 ranges, now and then one past MSSRL (256 blocks of 512
                // bytes) or past the end, and now and then descriptor format 1h.
                let n = 1 + c.nlb as u64 % 8;
                let (i, page) = self.list_page();
                pages.push(i);
                let mut raw = Vec::new();
                let (nr_z, desfmt) = ((n - 1) as u8, (c.flags >> 4) & 1);
                for k in 0..n {
                    let nlb = 1 + (c.slba as u64 >> (k * 5)) % 300;
                    let slba = (c.slba as u64).wrapping_mul(k + 3) % (nsze + 2);
                    // Mostly the reference tag type 1 wants; format 1h's entries
                    // (the 64-bit guard's) are 40 bytes with a 48-bit tag.
                    let eilbrt = slba + (c.flags as u64 >> 7);
                    if desfmt == 1 {
                        raw.extend_from_slice(CopyRangeF1::new(slba, nlb as u32, eilbrt).as_bytes());
                    } else {
                        let mut r = CopyRange::new(slba, nlb as u32);
                        r.eilbrt = U32::new(eilbrt as u32);
                        raw.extend_from_slice(r.as_bytes());
                    }
                }
                self.write_mem(page, &raw);
                let mut s = CopyCmd { nsid, sdlba: slba, nr_z, desfmt, fua }.to_sqe();
                s.set_prps(page, 0);
                if ns.meta_size() > 0 {
                    // PRINFOR and PRINFOW (PRACT mostly the same on both), and the
                    // destination's tags.
                    let (r, w) = ((c.nlb >> 8) as u32 & 0xf, (c.nlb >> 12) as u32 & 0xf);
                    let w = if c.flags & 0x20 == 0 { (w & 7) | (r & 8) } else { w };
                    s.cdw12 = U32::new(s.cdw12.get() | r << 12 | w << 26);
                    s.cdw14 = U32::new(slba as u32);
                    s.cdw15 = U32::new(c.buf as u32);
                }
                if c.flags & 0x40 != 0 {
                    // The destination placed by a Data Placement directive.
                    s.cdw12 = U32::new(s.cdw12.get() | 2 << 20);
                    s.cdw13 = U32::new((c.buf as u32 % 10) << 16);
                }
                return (s, pages, false);
            }
            zop::ZONE_MGMT_SEND => {
                // Close, finish, open, reset, offline, and now and then a reserved
                // or unsupported action; Select All now and then.
                let zsa = [1, 2, 3, 4, 5, 0x10, 0][c.nlb as usize % 7];
                ZoneMgmtCmd { nsid, slba: zslba }.send(zsa, c.flags & 8 != 0)
            }
            zop::ZONE_MGMT_RECV => {
                // Report Zones (now and then Extended) of every filter, partial or
                // not, into a buffer of 1 to 64 descriptors.
                let len = ((1 + c.nlb as u64 % 64) * 64).min(self.p.mdts_bytes);
                let (zrasf, partial) = ((c.nlb >> 6) as u8 % 9, c.flags & 8 != 0);
                let mut s =
                    ZoneMgmtCmd { nsid, slba: zslba }.receive((c.flags >> 4) & 1, zrasf, partial, len as u32);
                let (p1, p2) = self.prps(buf, len, c.flags >> 3, &mut pages);
                s.set_prps(p1, p2);
                return (s, pages, true);
            }
            iop::IO_MGMT_RECV => {
                // Reclaim unit handle status (now and then MO 0 or a reserved one)
                // into a buffer of 1 dword to 8 KiB.
                let len = (4 * (1 + c.slba as u64 % 2048)).min(self.p.mdts_bytes);
                let mut s = Sqe::with_opcode(opcode);
                s.nsid = U32::new(nsid);
                s.cdw10 = U32::new(c.nlb as u32 % 3);
                s.cdw11 = U32::new((len / 4 - 1) as u32);
                let (p1, p2) = self.prps(buf, len, c.flags >> 3, &mut pages);
                s.set_prps(p1, p2);
                return (s, pages, true);
            }
            iop::IO_MGMT_SEND => {
                // Reclaim unit handle update of 1 to 8 placement identifiers, some
                // beyond the handles (now and then MO 0 or a reserved one).
                let n = 1 + c.slba % 8;
                let (i, page) = self.list_page();
                pages.push(i);
                let pids: Vec<u8> =
                    (0..n).flat_map(|k| ((c.slba >> (k * 3)) as u16 % 10).to_le_bytes()).collect();
                self.write_mem(page, &pids);
                let mut s = Sqe::with_opcode(opcode);
                s.nsid = U32::new(nsid);
                s.cdw10 = U32::new((c.nlb as u32 % 3) | ((n - 1) << 16));
                s.set_prps(page, 0);
                return (s, pages, false);
            }
            iop::RESERVATION_REGISTER | iop::RESERVATION_ACQUIRE | iop::RESERVATION_RELEASE => {
                // Keys from a small set, so they meet; actions, types and IEKEY
                // of every kind, reserved ones now and then.
                let (i, page) = self.list_page();
                pages.push(i);
                let keys = [(c.slba % 4).to_le_bytes(), ((c.slba >> 2) % 4).to_le_bytes()].concat();
                self.write_mem(page, &keys);
                let mut s = Sqe::with_opcode(opcode);
                s.nsid = U32::new(nsid);
                s.cdw10 = U32::new(
                    (c.nlb as u32 % 4)
                        | (c.flags as u32 & 8)
                        | ((c.nlb as u32 >> 2) % 8) << 8
                        | ((c.flags as u32 >> 6) & 3) << 30,
                );
                s.set_prps(page, 0);
                return (s, pages, false);
            }
            iop::RESERVATION_REPORT => {
                // Into a buffer of 1 dword to 8 KiB, either structure.
                let len = (4 * (1 + c.slba as u64 % 2048)).min(self.p.mdts_bytes);
                let mut s = Sqe::with_opcode(opcode);
                s.nsid = U32::new(nsid);
                s.cdw10 = U32::new((len / 4 - 1) as u32);
                s.cdw11 = U32::new((c.flags as u32 >> 3) & 1);
                let (p1, p2) = self.prps(buf, len, c.flags >> 3, &mut pages);
                s.set_prps(p1, p2);
                return (s, pages, true);
            }
            iop::FLUSH => FlushCmd { nsid }.to_sqe(),
            iop::WRITE_ZEROES => WriteZeroesCmd { nsid, slba, nlb_z, deac: c.flags & 8 != 0, fua }.to_sqe(),
            _ => rw.to_sqe(opcode),
        };
        let mut s = s;
        if c.flags & 0x10 != 0 && matches!(opcode, iop::WRITE | iop::WRITE_ZEROES) {
            // A Data Placement directive, its placement identifier now and then
            // beyond the handles.
            s.cdw12 = U32::new(s.cdw12.get() | 2 << 20);
            s.cdw13 = U32::new(s.cdw13.get() | (c.buf as u32 % 10) << 16);
        }
        if ns.meta_size() > 0
            && matches!(opcode, iop::READ | iop::WRITE | iop::COMPARE | iop::VERIFY | iop::WRITE_ZEROES)
        {
            self.protection_fields(&mut s, c, slba, buf);
        }
        (s, pages, writes_host)
    }

    /// On a namespace with metadata: a metadata buffer in the data area (now and
    /// then misaligned), PRINFO from the command's bits, the reference tag mostly
    /// the LBA's (type 1's rule), the application tag and mask from the buffer's.
    fn protection_fields(&mut self, s: &mut Sqe, c: &IoCmd, slba: u64, buf: u64) {
        let v = c.slba as u64 ^ (c.buf as u64) << 7;
        let mptr = self.areas.data + (v * 8) % 0x10000 + if c.flags & 0x80 != 0 { 2 } else { 0 };
        s.mptr = U64::new(mptr);
        let prinfo = (c.nlb >> 12) as u32 & 0xf;
        s.cdw12 = U32::new((s.cdw12.get() & !(0xf << 26)) | prinfo << 26);
        let ref_tag = if c.flags & 0x20 == 0 { slba as u32 } else { (slba as u32).wrapping_add(1) };
        s.cdw14 = U32::new(ref_tag);
        s.cdw15 = U32::new((buf as u32 & 0xffff) | (c.buf as u32) << 16);
    }

    pub(crate) fn io_cmd(&mut self, c: &IoCmd) {
        let Some(qid) = self.io_queue(c.queue) else {
            self.stats.skipped += 1;
            return;
        };
        let (mut sqe, pages, writes_host) = self.build_io(c);
        let m = self.mutate(&mut sqe, c.mutation, &pages);
        // A read whose pointers or length changed may write anywhere (a longer PRP
        // walk reads stale list entries); any command may become a read by opcode.
        let kind = c.mutation.kind % 24;
        if m != Mutated::None && ((writes_host && !matches!(kind, 15 | 16 | 22)) || kind == 20) {
            self.tainted = true;
        }
        self.submit_owning(qid, sqe, &pages);
    }

    fn submit_owning(&mut self, qid: u16, sqe: Sqe, pages: &[usize]) {
        match self.submit(qid, sqe) {
            Some(cid) => pages.iter().for_each(|&i| self.areas.own(i, qid, cid)),
            None => self.stats.skipped += 1,
        }
    }

    pub(crate) fn burst(&mut self, b: &Burst) {
        let mut seed = b.seed as u64 | 1;
        for i in 0..1 + b.n % 32 {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            let c = IoCmd {
                queue: b.queue,
                op: b.op.wrapping_add(i) % 3,
                nsid: seed as u8,
                slba: (seed >> 8) as u32,
                nlb: (seed >> 40) as u16 % 64,
                buf: (seed >> 24) as u16,
                flags: (seed >> 56) as u8,
                mutation: Mutation::default(),
            };
            let Some(qid) = self.io_queue(c.queue) else {
                self.stats.skipped += 1;
                return;
            };
            let (sqe, pages, _) = self.build_io(&c);
            self.submit_owning(qid, sqe, &pages);
        }
    }

    /// A pool page for the ring of a queue created by a fuzzed admin command.
    fn pool_page(&mut self) -> u64 {
        self.areas.next_pool_page()
    }

    pub(crate) fn admin_cmd(&mut self, c: &AdminCmd) {
        if self.h.admin.is_none() {
            self.stats.skipped += 1;
            return;
        }
        let (a, b, cc) = (c.a, c.b, c.c);
        let nns = self.h.ctrl.max_namespaces();
        let nsid = |v: u32| match v % 8 {
            0..=3 => 1 + v % nns,
            4 => 0,
            5 => NSID_ALL,
            6 => nns + 1,
            _ => v,
        };
        let maxq = self.p.max_io_queues as u32;
        let buf = self.h.admin_buf;
        let mut aer = false;
        let mut deletes_host_queue = false;
        let op = c.op % ADMIN_OPS.len() as u8;
        // Queue identifiers stay below max_io_queues + 2 (at most 18): u16 holds them.
        let mut s = match op {
            0 => {
                // The namespace management lists (10h-13h) too, from a CNTLID.
                let cns = [0u32, 1, 2, 3, 5, 6, 0x10, 0x11, 0x12, 0x13, a >> 8][a as usize % 11] as u8;
                let csi = if cc & 1 != 0 { (cc >> 24) as u8 } else { 0 };
                let cntid = if cc & 2 != 0 { (cc >> 8) as u16 } else { 0 };
                let mut s = IdentifyCmd { nsid: nsid(b), cns, cntid, csi }.to_sqe();
                s.set_prps(buf, 0);
                s
            }
            1 => {
                let lid = [1u32, 2, 3, 4, 5, a >> 8][a as usize % 6] as u8;
                let cmd = GetLogPageCmd {
                    nsid: if cc & 0x10 != 0 { NSID_ALL } else { 0 },
                    lid,
                    rae: a >> 31 != 0,
                    numd_z: b % 2048,
                    offset: (((cc >> 8) % 1024) & !3) as u64,
                    ..Default::default()
                };
                let mut s = cmd.to_sqe();
                s.set_prps(buf, buf + PAGE);
                s
            }
            2 | 3 => {
                let fid = [1u32, 2, 4, 5, 6, 7, 8, 9, 0xa, 0xb, 0xe, a >> 8][a as usize % 12] as u8;
                let mut s = if op == 2 {
                    let sel = FeatureSelect::from_bits((b % 8) as u8);
                    GetFeaturesCmd { nsid: 0, fid, sel, cdw11: cc }.to_sqe()
                } else {
                    SetFeaturesCmd { nsid: 0, fid, sv: b >> 31 != 0, cdw11: cc }.to_sqe()
                };
                s.set_prps(buf, 0);
                s
            }
            4 => {
                let qid = (1 + a % (maxq + 1)) as u16;
                let qsize_z = (1 + b % 255) as u16;
                let base = self.pool_page();
                let (ien, iv) = (cc & 2 != 0, ((cc >> 16) % 20) as u16);
                CreateIoCqCmd { qid, qsize_z, base, pc: true, ien, iv }.to_sqe()
            }
            5 => {
                let qid = (1 + a % (maxq + 1)) as u16;
                let qsize_z = (1 + b % 63) as u16;
                let base = self.pool_page();
                let cqid = (cc % (maxq + 2)) as u16;
                CreateIoSqCmd { qid, qsize_z, base, pc: true, cqid, ..Default::default() }.to_sqe()
            }
            6 | 7 => {
                let qid = (a % (maxq + 2)) as u16;
                deletes_host_queue = self.h.io.iter().any(|q| q.qid != 0 && q.qid == qid);
                if op == 6 {
                    DeleteIoSqCmd { qid }.to_sqe()
                } else {
                    DeleteIoCqCmd { qid }.to_sqe()
                }
            }
            8 => {
                aer = true;
                Sqe::with_opcode(aop::ASYNC_EVENT_REQUEST)
            }
            9 => AbortCmd { sqid: a as u16, cid: (a >> 16) as u16 }.to_sqe(),
            10 => {
                self.fresh_dbbuf();
                return;
            }
            11 => {
                // Doorbell Buffer Config with addresses the host will not use.
                self.tainted = true;
                let pick = |f: &Self, v: u32| match v % 4 {
                    0 => f.areas.pool + (v as u64 >> 2) % 64 * PAGE,
                    1 => f.wild(v as u64 * 0x0100_0001) & !(PAGE - 1),
                    2 => f.wild((v as u64) << 8 | 4),
                    _ => f.h.dbbuf.map_or(f.areas.pool, |d| d.shadow),
                };
                let shadow = pick(self, a);
                let ei = if b % 5 == 0 { shadow } else { pick(self, b) };
                DoorbellBufferConfigCmd { shadow_doorbell: shadow, eventidx: ei }.to_sqe()
            }
            12 => {
                // LBAF 0/1 mostly; SES 0/1 mostly; MSET, PI and PIL rarely.
                let lbaf = (if b & 0x80 != 0 { b & 0xf } else { b & 1 }) as u8;
                let ses = (if b & 0x100 != 0 { (b >> 9) & 7 } else { (b >> 9) & 1 }) as u8;
                let extra = if cc % 8 == 0 { cc } else { 0 };
                let (mset, pi, pil) = (extra & 0x10 != 0, ((extra >> 5) & 7) as u8, extra & 0x100 != 0);
                FormatNvmCmd { nsid: nsid(a), lbaf, mset, pi, pil, ses }.to_sqe()
            }
            14 => {
                // Namespace Management (create: a size, format, sharing and ANA
                // group, mostly small and valid; delete: one NSID or all) and
                // Namespace Attachment with a Controller List of this controller,
                // others, repeats, or a count past the list. The namespaces come
                // and go under the host's I/O.
                self.tainted = true;
                let mut data = [0u8; 4096];
                let mut s = if a & 1 == 0 {
                    let mut s = Sqe::with_opcode(aop::NAMESPACE_MANAGEMENT);
                    let create = b & 1 == 0;
                    s.cdw10 = U32::new(if create { 0 } else { 1 } | if cc % 16 == 0 { cc & !3 } else { 0 });
                    s.nsid = U32::new(if create {
                        if cc % 8 == 0 {
                            cc
                        } else {
                            0
                        }
                    } else {
                        nsid(cc)
                    });
                    // Each field out of bounds an eighth of the time.
                    let rare = |n: u32| (cc >> (17 + 3 * n)) & 7 == 7;
                    let nsze = if rare(4) { (b as u64) << 8 } else { 1 + (b >> 8) as u64 % 8192 };
                    data[..8].copy_from_slice(&nsze.to_le_bytes());
                    let ncap = if rare(0) { nsze / 2 } else { nsze };
                    data[8..16].copy_from_slice(&ncap.to_le_bytes());
                    data[26] = if rare(1) { (b >> 24) as u8 } else { (b >> 24) as u8 & 1 };
                    data[29] = if rare(2) { (a >> 8) as u8 } else { 0 };
                    data[30] = (a >> 1) as u8 & if rare(3) { 0xff } else { 1 };
                    let group = if rare(0) { a >> 16 } else { (a >> 16) % 33 };
                    data[92..96].copy_from_slice(&group.to_le_bytes());
                    s
                } else {
                    let mut s = Sqe::with_opcode(aop::NAMESPACE_ATTACHMENT);
                    s.cdw10 = U32::new((b >> 1) & 1 | if cc % 16 == 0 { cc & !3 } else { 0 });
                    // Mostly a namespace of the pool (the first), else any NSID.
                    let made = self.h.ctrl.pool().and_then(|p| p.state().namespaces.keys().next().copied());
                    s.nsid = U32::new(match made {
                        Some(n) if cc & 3 != 0 => n,
                        _ => nsid(cc),
                    });
                    // This controller, it and one the subsystem lacks, or wild ones;
                    // now and then a count past what is listed.
                    let me = self.h.ctrl.pool().map_or(0, |p| p.cntlid());
                    let ids: Vec<u16> = match (b >> 5) & 3 {
                        0 | 1 => vec![me],
                        2 => vec![me, me.wrapping_add(1)],
                        _ => vec![a as u16, (a >> 16) as u16, me],
                    };
                    let count = if b & 0x4 != 0 { (b >> 16) as u16 } else { ids.len() as u16 };
                    data[..2].copy_from_slice(&count.to_le_bytes());
                    for (i, id) in ids.iter().enumerate() {
                        data[2 + 2 * i..4 + 2 * i].copy_from_slice(&id.to_le_bytes());
                    }
                    s
                };
                // A page of its own: the admin buffer may be another command's
                // output before this one runs.
                let (_, page, _) = self.areas.next_list_page();
                self.h.mem.write(page, &data).expect("a list page");
                s.set_prps(page, 0);
                s
            }
            _ => {
                let typed = |o: u8| ADMIN_OPS.iter().any(|l| l.contains(&o));
                let opc = match b % 8 {
                    0 | 1 => table_opcode(nvme_ctrl::admin_opcodes(), typed, (a >> 8) as usize),
                    k @ 2..=6 => RAW_ADMIN[k as usize - 2],
                    _ => a as u8,
                };
                // One of the table's, or a random opcode, may change queues or
                // shadow doorbells.
                if !RAW_ADMIN.contains(&opc) {
                    self.tainted = true;
                }
                // Raw dwords: the point is opcodes the controller may not know.
                let mut s = Sqe::with_opcode(opc);
                s.nsid = U32::new(nsid(cc));
                s.set_prps(buf, 0);
                s.cdw10 = U32::new(a);
                s
            }
        };
        let raw = op == 13 && matches!(b % 8, 0 | 1 | 7);
        assert!(
            raw || ADMIN_OPS[op as usize].contains(&s.opcode()),
            "admin builder {op} made {:#04x}",
            s.opcode()
        );
        let m = self.mutate(&mut s, c.mutation, &[]);
        if m != Mutated::None || deletes_host_queue {
            self.tainted = true;
        }
        match self.submit(0, s) {
            Some(cid) if aer && m == Mutated::None => {
                self.aers.insert(cid);
            }
            Some(_) => {}
            None => self.stats.skipped += 1,
        }
    }
}

#[cfg(test)]
mod io_opcode_tests {
    use super::{table_opcode, ADMIN_OPS, IO_OPCODES, RAW_ADMIN};
    use std::collections::BTreeSet;

    /// The fuzzer's own I/O builders make commands the controller implements.
    #[test]
    fn typed_io_opcodes_are_the_controllers() {
        let table: BTreeSet<u8> = nvme_ctrl::io_opcodes().collect();
        let extra: Vec<u8> = IO_OPCODES.into_iter().filter(|o| !table.contains(o)).collect();
        assert!(extra.is_empty(), "built, not in the controller's tables: {extra:02x?}");
    }

    /// The admin builders make the table's commands, or ones meant to be missing.
    #[test]
    fn typed_admin_opcodes_are_the_controllers() {
        let table: BTreeSet<u8> = nvme_ctrl::admin_opcodes().collect();
        let extra: Vec<u8> = ADMIN_OPS[..13]
            .iter()
            .chain(&ADMIN_OPS[14..])
            .flat_map(|o| o.iter().copied())
            .filter(|o| !table.contains(o))
            .collect();
        assert!(extra.is_empty(), "built, not in the controller's table: {extra:02x?}");
        assert!(
            RAW_ADMIN.iter().all(|o| !table.contains(o)),
            "RAW_ADMIN is for opcodes the controller lacks"
        );
    }

    /// A command of the tables with no builder of its own is what the generic
    /// slot builds; with none, any of the table's.
    #[test]
    fn the_generic_slot_takes_what_has_no_builder() {
        let table = [1u8, 2, 9, 0x80];
        assert_eq!(
            (0..8).map(|i| table_opcode(table.into_iter(), |o| [1, 2].contains(&o), i)).collect::<Vec<_>>(),
            [9, 0x80, 9, 0x80, 9, 0x80, 9, 0x80]
        );
        assert_eq!(table_opcode(table.into_iter(), |_| true, 2), 9);
    }
}
