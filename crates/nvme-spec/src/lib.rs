//! Typed NVMe structures: registers, submission and completion queue entries,
//! status codes, Identify data, log pages, features and Doorbell Buffer Config.
//!
//! Pinned specification versions (every `§` reference in this workspace is to these):
//! - NVM Express Base Specification, Revision 2.1 ("Base")
//! - NVM Express NVM Command Set Specification, Revision 1.1 ("NVM")
//! - NVM Express NVMe over PCIe Transport Specification, Revision 1.1 ("PCIe")
//! - NVM Express Zoned Namespace Command Set Specification, Revision 1.1 ("ZNS")
//!
//! The controller advertises version 1.4 in VS (see [`regs::NVME_VERSION_1_4`]); the
//! structures here are the 2.1 layouts, which are backwards compatible in every field
//! a 1.4 host reads.
//!
//! All multi-byte fields are little-endian in the type (`zerocopy::little_endian`), so
//! code never byte-swaps by hand. Every structure's size is checked at compile time.
#![no_std]
#![forbid(unsafe_code)]

pub mod admin;
pub mod aer;
pub mod ana;
pub mod command;
pub mod completion;
pub mod fdp;
pub mod features;
pub mod identify;
pub mod log;
pub mod nsmgmt;
pub mod nvm;
pub mod opcode;
pub mod pi;
pub mod regs;
pub mod resv;
pub mod sgl;
pub mod status;
pub mod zns;

pub use command::Sqe;
pub use completion::Cqe;
pub use status::Status;

/// Size of a submission queue entry (IOSQES = 6).
pub const SQE_SIZE: usize = 64;
/// Size of a completion queue entry (IOCQES = 4).
pub const CQE_SIZE: usize = 16;
/// The broadcast namespace identifier (Base §3.2.1.2).
pub const NSID_ALL: u32 = 0xffff_ffff;
