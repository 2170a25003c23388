//! Raw vfio-user protocol helpers shared by the `server_*` tests: command numbers,
//! region access headers, and the errno of an error reply.

use vfio_user::client::ClientError;
use vfio_user::proto::RegionAccess;
use vfio_user::Command;
use zerocopy::little_endian::{U32, U64};

pub const VERSION: u16 = Command::Version as u16;
pub const GET_INFO: u16 = Command::DeviceGetInfo as u16;
pub const REGION_INFO: u16 = Command::DeviceGetRegionInfo as u16;
pub const SET_IRQS: u16 = Command::DeviceSetIrqs as u16;
pub const READ: u16 = Command::RegionRead as u16;
pub const WRITE: u16 = Command::RegionWrite as u16;
pub const DMA_MAP: u16 = Command::DmaMap as u16;
pub const DMA_UNMAP: u16 = Command::DmaUnmap as u16;

pub fn access(region: u32, offset: u64, count: u32) -> RegionAccess {
    RegionAccess { offset: U64::new(offset), region: U32::new(region), count: U32::new(count) }
}

pub fn server_errno(e: ClientError) -> u32 {
    match e {
        ClientError::Server { errno, .. } => errno,
        other => panic!("expected an error reply, got {other}"),
    }
}
