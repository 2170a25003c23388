//! What fuzz input bytes mean: a [`Program`] of a controller [`Setup`] and up to
//! [`MAX_ACTIONS`] [`Action`]s, decoded with [`arbitrary::Unstructured`].
//!
//! Every field is a plain integer or byte array read little-endian, and every value
//! decodes to something (fields are mapped onto valid ranges by the executor, not
//! rejected here), so any byte string is a program and small edits to the bytes make
//! small edits to the program. [`Program::encode`] is the exact inverse of decoding
//! for canonical programs, which is how the committed corpus seeds are hand-built and
//! how the runner minimises a crashing input.

use arbitrary::Unstructured;

/// Actions executed per input at most; later bytes are ignored.
pub const MAX_ACTIONS: usize = 64;

/// Reads primitives from fuzz input; past the end every read yields zeroes.
#[derive(Debug)]
pub struct Reader<'a> {
    u: Unstructured<'a>,
}

impl<'a> Reader<'a> {
    pub fn new(data: &'a [u8]) -> Self {
        Reader { u: Unstructured::new(data) }
    }
    pub fn is_empty(&self) -> bool {
        self.u.is_empty()
    }
    fn fill(&mut self, buf: &mut [u8]) {
        // `fill_buffer` zero-pads when the input runs out and never fails.
        let _ = self.u.fill_buffer(buf);
    }
}

/// Writes primitives in the layout [`Reader`] reads them.
#[derive(Debug, Default)]
pub struct Writer {
    pub out: Vec<u8>,
}

/// A value with a fixed byte encoding.
pub trait Codec: Sized {
    fn decode(r: &mut Reader<'_>) -> Self;
    fn encode(&self, w: &mut Writer);
}

macro_rules! int_codec {
    ($($t:ty),*) => {$(
        impl Codec for $t {
            fn decode(r: &mut Reader<'_>) -> Self {
                let mut b = [0u8; size_of::<$t>()];
                r.fill(&mut b);
                <$t>::from_le_bytes(b)
            }
            fn encode(&self, w: &mut Writer) {
                w.out.extend_from_slice(&self.to_le_bytes());
            }
        }
    )*};
}
int_codec!(u8, u16, u32, u64);

impl<const N: usize> Codec for [u8; N] {
    fn decode(r: &mut Reader<'_>) -> Self {
        let mut b = [0u8; N];
        r.fill(&mut b);
        b
    }
    fn encode(&self, w: &mut Writer) {
        w.out.extend_from_slice(self);
    }
}

/// A struct of [`Codec`] fields, encoded in declaration order.
macro_rules! record {
    ($(#[$m:meta])* pub struct $name:ident { $($(#[$fm:meta])* pub $f:ident : $t:ty,)* }) => {
        $(#[$m])*
        #[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
        pub struct $name { $($(#[$fm])* pub $f: $t,)* }
        impl Codec for $name {
            fn decode(r: &mut Reader<'_>) -> Self {
                // Struct expression fields are evaluated in the order written.
                $name { $($f: Codec::decode(r),)* }
            }
            fn encode(&self, w: &mut Writer) {
                $(self.$f.encode(w);)*
            }
        }
    };
}

/// 64 raw bytes: a submission queue entry as it will sit in the ring.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RawSqe(pub [u8; 64]);

impl Default for RawSqe {
    fn default() -> Self {
        RawSqe([0; 64])
    }
}

impl Codec for RawSqe {
    fn decode(r: &mut Reader<'_>) -> Self {
        RawSqe(Codec::decode(r))
    }
    fn encode(&self, w: &mut Writer) {
        self.0.encode(w);
    }
}

record! {
    /// One namespace.
    pub struct NsSpec {
        /// Bit 0: null backend instead of RAM. Bits 1-3: 3..=7 wrap the backend in a
        /// fault rule whose error is EIO, ENOSPC, short, gone or read-only; bits 4-6
        /// (mod 5) pick the operation it hits; bit 7 limits it to blocks 0..64.
        pub kind: u8,
        /// Size: 1 + mib % 8 MiB. Bit 4: a zoned namespace of 256 KiB zones, bit 5
        /// their capacity 192 KiB, bits 6-7 the open limit (0: none; the active
        /// limit one more).
        pub mib: u8,
        /// LBA format: lba_format % 2 (512 B or 4 KiB). Bit 2 (on a namespace that
        /// is not zoned): a metadata store, the format then one with metadata
        /// (bits 3-4 and 0, modulo 6: 512+8, 4096+8, 4096+16, 4096+64, and the
        /// 64-bit guard's 512+16 and 4096+16), bits 5-6 the protection
        /// information type (0: none), bit 7 the information first, bit 1 the
        /// metadata inline (extended LBAs).
        pub lba_format: u8,
    }
}

record! {
    /// Options for a Linux-like bring-up ([`test_kit::MockHost::init`]).
    pub struct InitSpec {
        /// 1 + io_queues % 4.
        pub io_queues: u8,
        /// 2 + queue_size % 63 entries per I/O queue.
        pub queue_size: u8,
        /// 2 + admin_size % 63 entries in the admin queue.
        pub admin_size: u8,
        /// Bit 0: shadow doorbells; bit 1: interrupts.
        pub flags: u8,
    }
}

record! {
    /// The controller and guest the program runs against.
    pub struct Setup {
        /// 1 + ns_count % 3 namespaces from `ns`.
        pub ns_count: u8,
        pub ns: [NsSpec; 3],
        /// 1 + max_io_queues % 16.
        pub max_io_queues: u8,
        /// 1 + msix_vectors % 17.
        pub msix_vectors: u8,
        /// dstrd % 4; bit 4: Flexible Data Placement, with 1 + bits 5-7 reclaim unit
        /// handles of 64 KiB units.
        pub dstrd: u8,
        /// 1 + mdts % 8 (2^n pages: 8 KiB to 1 MiB).
        pub mdts: u8,
        /// CAP.MQES: 1 + mqes_z % 1023.
        pub mqes_z: u16,
        /// aerl_z % 8; bit 7: a controller of a subsystem (CNTLID aerl_z, ANA), and
        /// with bit 6, a namespace pool of 16 MiB (NN 8).
        pub aerl_z: u8,
        /// Bit 0: run `init` before the actions. Bits 2:1: I/O worker threads
        /// (1 or 2; 0 and 3 run the I/O queues inline).
        pub do_init: u8,
        pub init: InitSpec,
    }
}

impl<const N: usize> Codec for [NsSpec; N] {
    fn decode(r: &mut Reader<'_>) -> Self {
        std::array::from_fn(|_| NsSpec::decode(r))
    }
    fn encode(&self, w: &mut Writer) {
        self.iter().for_each(|n| n.encode(w));
    }
}

record! {
    /// How a mostly-valid command is broken: `kind` picks the field (most kinds
    /// mean "leave it valid"), `value` the new contents.
    pub struct Mutation {
        pub kind: u8,
        pub value: u64,
    }
}

record! {
    /// 64 random bytes submitted as an admin command (the host assigns the CID).
    pub struct RawAdmin {
        pub sqe: RawSqe,
    }
}

record! {
    /// 64 random bytes submitted on a host I/O queue.
    pub struct RawIo {
        pub queue: u8,
        pub sqe: RawSqe,
    }
}

record! {
    /// A valid NVM command (Read, Write, Compare, Verify, Write Zeroes, Flush, DSM)
    /// with at most one field mutated.
    pub struct IoCmd {
        pub queue: u8,
        pub op: u8,
        pub nsid: u8,
        pub slba: u32,
        pub nlb: u16,
        /// Buffer offset in the data area, in dwords.
        pub buf: u16,
        /// Bits 0-1: data pointer form (PRP, one SGL data block, an SGL segment, a
        /// segment chain); bit 2: FUA; bits 3-7: how many pieces an SGL splits into.
        pub flags: u8,
        pub mutation: Mutation,
    }
}

record! {
    /// A valid admin command (op picks which), parameters a/b/c, one field mutated.
    pub struct AdminCmd {
        pub op: u8,
        pub a: u32,
        pub b: u32,
        pub c: u32,
        pub mutation: Mutation,
    }
}

record! {
    /// A BAR0 register write: reg picks CC, AQA, ASQ, ACQ, INTMS, INTMC, NSSR, a
    /// read-only register or a random offset; size picks 4, 8, or an odd size.
    pub struct RegWrite {
        pub reg: u8,
        pub size: u8,
        pub value: u64,
    }
}

record! {
    /// A CC sequence: disable, enable, shutdown (normal, abrupt), enable with odd
    /// fields, a Linux-like reset and re-enable, or the mock host's `enable`.
    pub struct CcOp {
        pub op: u8,
        pub value: u32,
    }
}

record! {
    /// A doorbell register write for any queue identifier, with any value.
    pub struct Doorbell {
        pub qid: u16,
        /// Bit 0: CQ head; bit 1: raw qid; bits 2-3: extra offset (misaligned).
        pub kind: u8,
        pub value: u32,
    }
}

record! {
    /// A store into the shadow doorbell or EventIdx buffer.
    pub struct ShadowWrite {
        pub qid: u16,
        /// Bit 0: CQ head slot; bit 1: EventIdx instead of shadow; bit 2: raw value.
        pub which: u8,
        pub value: u32,
    }
}

record! {
    /// Bytes written into an SQ or CQ ring of a host queue.
    pub struct RingWrite {
        pub queue: u8,
        /// Bit 0: CQ instead of SQ.
        pub which: u8,
        pub index: u16,
        pub bytes: [u8; 16],
    }
}

record! {
    /// Random bytes written anywhere in guest memory.
    pub struct Scribble {
        pub addr: u64,
        pub len: u8,
        pub seed: u8,
    }
}

record! {
    /// A change to the controller's guest memory map: remove all of it, punch a
    /// hole, keep a prefix, or restore the full map.
    pub struct MemoryOp {
        pub op: u8,
        pub a: u16,
        pub b: u16,
    }
}

record! {
    /// The host reaps a queue (queue % (I/O queues + 1); 0 = admin), or all.
    pub struct Reap {
        pub queue: u8,
    }
}

record! {
    /// Calls `Controller::process` 1 + n % 8 times; bit 7 toggles EventIdx re-arming.
    pub struct Process {
        pub n: u8,
    }
}

record! {
    /// Advances the controller clock by us % 5000 microseconds.
    pub struct ClockAdvance {
        pub us: u32,
    }
}

record! {
    /// A BAR0 read of any offset and size.
    pub struct ReadReg {
        pub off: u16,
        pub size: u8,
    }
}

record! {
    /// 1 + n % 32 valid commands on one queue before the device runs.
    pub struct Burst {
        pub queue: u8,
        pub n: u8,
        pub op: u8,
        pub seed: u32,
    }
}

record! {
    /// Creates an I/O queue pair the Linux way (mock host helper).
    pub struct CreatePair {
        pub qid: u8,
        pub size: u8,
        pub ien: u8,
    }
}

record! {
    /// Lets the device run and reaps until quiet, then checks nothing is stranded.
    pub struct Drain {
        pub rounds: u8,
    }
}

record! {
    /// The operator sets ANA: group % 34 (0: every group; 33: one the controller
    /// does not have) put in state % 5 of `AnaState::ALL` (refused unless the
    /// controller is of a subsystem).
    pub struct AnaSet {
        pub group: u8,
        pub state: u8,
    }
}

/// One step of a program.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Action {
    AdminRaw(RawAdmin),
    IoRaw(RawIo),
    Io(IoCmd),
    Admin(AdminCmd),
    Reg(RegWrite),
    Cc(CcOp),
    Doorbell(Doorbell),
    Shadow(ShadowWrite),
    Ring(RingWrite),
    Scribble(Scribble),
    Memory(MemoryOp),
    Reap(Reap),
    Process(Process),
    Clock(ClockAdvance),
    Init(InitSpec),
    ReadReg(ReadReg),
    Burst(Burst),
    CreatePair(CreatePair),
    Drain(Drain),
    Ana(AnaSet),
}

/// Action kinds, for statistics.
pub const ACTION_NAMES: [&str; 20] = [
    "admin-raw",
    "io-raw",
    "io",
    "admin",
    "reg",
    "cc",
    "doorbell",
    "shadow",
    "ring",
    "scribble",
    "memory",
    "reap",
    "process",
    "clock",
    "init",
    "read-reg",
    "burst",
    "create-pair",
    "drain",
    "ana",
];

/// Tag byte (mod 32) -> action kind: the data path and the host's own steps get more
/// of the tag space than the rarer, more destructive actions.
const TAGS: [u8; 32] = [
    0, 1, 2, 2, 2, 19, 3, 3, 3, 4, 5, 5, 6, 6, 7, 8, 9, 10, 11, 11, 11, 12, 12, 12, 13, 14, 15, 16, 16, 17,
    18, 18,
];

impl Action {
    /// Index into [`ACTION_NAMES`].
    pub fn kind(&self) -> usize {
        match self {
            Action::AdminRaw(_) => 0,
            Action::IoRaw(_) => 1,
            Action::Io(_) => 2,
            Action::Admin(_) => 3,
            Action::Reg(_) => 4,
            Action::Cc(_) => 5,
            Action::Doorbell(_) => 6,
            Action::Shadow(_) => 7,
            Action::Ring(_) => 8,
            Action::Scribble(_) => 9,
            Action::Memory(_) => 10,
            Action::Reap(_) => 11,
            Action::Process(_) => 12,
            Action::Clock(_) => 13,
            Action::Init(_) => 14,
            Action::ReadReg(_) => 15,
            Action::Burst(_) => 16,
            Action::CreatePair(_) => 17,
            Action::Drain(_) => 18,
            Action::Ana(_) => 19,
        }
    }
}

impl Codec for Action {
    fn decode(r: &mut Reader<'_>) -> Self {
        let tag = u8::decode(r);
        match TAGS[tag as usize % TAGS.len()] {
            0 => Action::AdminRaw(Codec::decode(r)),
            1 => Action::IoRaw(Codec::decode(r)),
            2 => Action::Io(Codec::decode(r)),
            3 => Action::Admin(Codec::decode(r)),
            4 => Action::Reg(Codec::decode(r)),
            5 => Action::Cc(Codec::decode(r)),
            6 => Action::Doorbell(Codec::decode(r)),
            7 => Action::Shadow(Codec::decode(r)),
            8 => Action::Ring(Codec::decode(r)),
            9 => Action::Scribble(Codec::decode(r)),
            10 => Action::Memory(Codec::decode(r)),
            11 => Action::Reap(Codec::decode(r)),
            12 => Action::Process(Codec::decode(r)),
            13 => Action::Clock(Codec::decode(r)),
            14 => Action::Init(Codec::decode(r)),
            15 => Action::ReadReg(Codec::decode(r)),
            16 => Action::Burst(Codec::decode(r)),
            17 => Action::CreatePair(Codec::decode(r)),
            18 => Action::Drain(Codec::decode(r)),
            _ => Action::Ana(Codec::decode(r)),
        }
    }
    fn encode(&self, w: &mut Writer) {
        let kind = self.kind() as u8;
        let tag = TAGS.iter().position(|&k| k == kind).expect("every kind has a tag") as u8;
        tag.encode(w);
        match self {
            Action::AdminRaw(a) => a.encode(w),
            Action::IoRaw(a) => a.encode(w),
            Action::Io(a) => a.encode(w),
            Action::Admin(a) => a.encode(w),
            Action::Reg(a) => a.encode(w),
            Action::Cc(a) => a.encode(w),
            Action::Doorbell(a) => a.encode(w),
            Action::Shadow(a) => a.encode(w),
            Action::Ring(a) => a.encode(w),
            Action::Scribble(a) => a.encode(w),
            Action::Memory(a) => a.encode(w),
            Action::Reap(a) => a.encode(w),
            Action::Process(a) => a.encode(w),
            Action::Clock(a) => a.encode(w),
            Action::Init(a) => a.encode(w),
            Action::ReadReg(a) => a.encode(w),
            Action::Burst(a) => a.encode(w),
            Action::CreatePair(a) => a.encode(w),
            Action::Drain(a) => a.encode(w),
            Action::Ana(a) => a.encode(w),
        }
    }
}

/// A whole fuzz input.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Program {
    pub setup: Setup,
    pub actions: Vec<Action>,
}

impl Program {
    /// Decodes any byte string: the setup, then actions until the input or
    /// [`MAX_ACTIONS`] runs out.
    pub fn decode(data: &[u8]) -> Program {
        let mut r = Reader::new(data);
        let setup = Setup::decode(&mut r);
        let mut actions = Vec::new();
        while !r.is_empty() && actions.len() < MAX_ACTIONS {
            actions.push(Action::decode(&mut r));
        }
        Program { setup, actions }
    }

    /// The bytes that decode to this program.
    pub fn encode(&self) -> Vec<u8> {
        let mut w = Writer::default();
        self.setup.encode(&mut w);
        for a in &self.actions {
            a.encode(&mut w);
        }
        w.out
    }
}

impl Setup {
    /// I/O worker threads to start (0: the I/O queues run inline).
    pub fn workers(&self) -> usize {
        match (self.do_init >> 1) & 3 {
            n @ (1 | 2) => n as usize,
            _ => 0,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn encode_is_the_inverse_of_decode() {
        let p = Program {
            setup: Setup { ns_count: 2, do_init: 1, mdts: 7, ..Default::default() },
            actions: vec![
                Action::Io(IoCmd { queue: 1, op: 1, nlb: 7, ..Default::default() }),
                Action::Reap(Reap { queue: 255 }),
                Action::Doorbell(Doorbell { qid: 3, kind: 1, value: 9 }),
                Action::Drain(Drain { rounds: 4 }),
            ],
        };
        assert_eq!(Program::decode(&p.encode()), p);
    }

    #[test]
    fn any_bytes_decode_and_short_inputs_read_zeroes() {
        assert_eq!(Program::decode(&[]), Program::default());
        let p = Program::decode(&[0xff; 300]);
        assert!(!p.actions.is_empty() && p.actions.len() <= MAX_ACTIONS);
    }
}
