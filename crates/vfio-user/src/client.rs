//! A vfio-user client: what the userspace NVMe driver's vfio-user transport and the
//! server's cross-process tests use to talk to a server.

use std::io;
use std::os::fd::{AsRawFd, BorrowedFd, OwnedFd, RawFd};
use std::os::unix::net::UnixStream;
use std::path::Path;

use zerocopy::little_endian::{U16, U32, U64};
use zerocopy::{FromBytes, IntoBytes};

use crate::proto::*;
use crate::socket::{Connection, ProtoError};
use crate::version::{self, Capabilities};

/// Why a client request failed.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error("{0}")]
    Proto(#[from] ProtoError),
    #[error("socket: {0}")]
    Io(#[from] io::Error),
    #[error("server answered {cmd:?} with errno {errno} ({})", io::Error::from_raw_os_error(*errno as i32))]
    Server { cmd: Command, errno: u32 },
    #[error("malformed reply to {0:?}: {1}")]
    BadReply(Command, String),
}

/// A connected client.
#[derive(Debug)]
pub struct Client {
    conn: Connection,
    next_id: u16,
    pub server_caps: Capabilities,
}

impl Client {
    /// Connects and negotiates the protocol version.
    pub fn connect(path: &Path) -> Result<Self, ClientError> {
        Self::from_stream(UnixStream::connect(path)?)
    }

    pub fn from_stream(s: UnixStream) -> Result<Self, ClientError> {
        let mut c = Client { conn: Connection::new(s), next_id: 0, server_caps: Capabilities::default() };
        let caps = Capabilities {
            max_msg_fds: Some(16),
            max_data_xfer_size: Some(1 << 20),
            max_dma_maps: Some(65535),
            pgsizes: Some(4096),
            migration: None,
        };
        let reply =
            c.request(Command::Version, &[&version::encode(version::MAJOR, version::MINOR, &caps)], &[])?;
        let (major, _minor, sc) =
            version::decode(&reply.payload).map_err(|e| ClientError::BadReply(Command::Version, e))?;
        if major != version::MAJOR {
            return Err(ClientError::BadReply(Command::Version, format!("major {major}")));
        }
        c.server_caps = sc;
        Ok(c)
    }

    /// Sends a command and waits for its reply.
    pub fn request(
        &mut self,
        cmd: Command,
        parts: &[&[u8]],
        fds: &[BorrowedFd<'_>],
    ) -> Result<crate::Message, ClientError> {
        let raw: Vec<i32> = fds.iter().map(|f| f.as_raw_fd()).collect();
        self.request_raw(cmd, parts, &raw)
    }

    /// [`Client::request`] with descriptors given as raw numbers (they are only
    /// passed to the kernel, which checks them; an invalid one fails the send).
    pub fn request_raw(
        &mut self,
        cmd: Command,
        parts: &[&[u8]],
        fds: &[RawFd],
    ) -> Result<crate::Message, ClientError> {
        let id = self.send(cmd, parts, fds, false)?;
        let m = self.conn.recv()?;
        let f = MsgFlags(m.header.flags.get());
        if !f.is_reply() || m.header.msg_id.get() != id {
            return Err(ClientError::BadReply(cmd, format!("unexpected message {:?}", m.header)));
        }
        if f.is_error() {
            return Err(ClientError::Server { cmd, errno: m.header.error.get() });
        }
        Ok(m)
    }

    fn send(
        &mut self,
        cmd: Command,
        parts: &[&[u8]],
        fds: &[RawFd],
        no_reply: bool,
    ) -> Result<u16, ClientError> {
        let id = self.next_id;
        self.next_id = self.next_id.wrapping_add(1);
        let flags = MsgFlags::COMMAND | if no_reply { MsgFlags::NO_REPLY } else { 0 };
        let h = Header {
            msg_id: U16::new(id),
            command: U16::new(cmd as u16),
            flags: U32::new(flags),
            ..Default::default()
        };
        self.conn.send(h, parts, fds)?;
        Ok(id)
    }

    pub fn device_info(&mut self) -> Result<DeviceInfo, ClientError> {
        let req = DeviceInfo { argsz: U32::new(16), ..Default::default() };
        let r = self.request(Command::DeviceGetInfo, &[req.as_bytes()], &[])?;
        r.payload_as().ok_or_else(|| ClientError::BadReply(Command::DeviceGetInfo, "short".into()))
    }

    /// Region info and, if the region is mappable, its file descriptor.
    pub fn region_info(&mut self, index: u32) -> Result<(RegionInfo, Vec<u8>, Option<OwnedFd>), ClientError> {
        let mut argsz = 32u32;
        loop {
            let req = RegionInfo { argsz: U32::new(argsz), index: U32::new(index), ..Default::default() };
            let r = self.request(Command::DeviceGetRegionInfo, &[req.as_bytes()], &[])?;
            let info: RegionInfo = r
                .payload_as()
                .ok_or_else(|| ClientError::BadReply(Command::DeviceGetRegionInfo, "short".into()))?;
            if info.argsz.get() > argsz && argsz == 32 {
                argsz = info.argsz.get();
                continue;
            }
            let caps = r.payload.get(32..).unwrap_or_default().to_vec();
            return Ok((info, caps, r.fds.into_iter().next()));
        }
    }

    pub fn irq_info(&mut self, index: u32) -> Result<IrqInfo, ClientError> {
        let req = IrqInfo { argsz: U32::new(16), index: U32::new(index), ..Default::default() };
        let r = self.request(Command::DeviceGetIrqInfo, &[req.as_bytes()], &[])?;
        r.payload_as().ok_or_else(|| ClientError::BadReply(Command::DeviceGetIrqInfo, "short".into()))
    }

    /// Installs eventfds for `index` vectors `start..start+fds.len()`.
    pub fn set_irq_eventfds<F: AsRawFd>(
        &mut self,
        index: u32,
        start: u32,
        fds: &[F],
    ) -> Result<(), ClientError> {
        let s = SetIrqs {
            argsz: U32::new(20),
            flags: U32::new(IRQ_SET_DATA_EVENTFD | IRQ_SET_ACTION_TRIGGER),
            index: U32::new(index),
            start: U32::new(start),
            count: U32::new(fds.len() as u32),
        };
        for chunk_start in (0..fds.len()).step_by(16) {
            let chunk = &fds[chunk_start..(chunk_start + 16).min(fds.len())];
            let mut s = s;
            s.start.set(start + chunk_start as u32);
            s.count.set(chunk.len() as u32);
            let raw: Vec<RawFd> = chunk.iter().map(|f| f.as_raw_fd()).collect();
            self.request_raw(Command::DeviceSetIrqs, &[s.as_bytes()], &raw)?;
        }
        Ok(())
    }

    /// Shares `[iova, iova+size)` backed by `fd` at `offset`.
    pub fn dma_map(
        &mut self,
        iova: u64,
        size: u64,
        fd: Option<BorrowedFd<'_>>,
        offset: u64,
    ) -> Result<(), ClientError> {
        let m = DmaMap {
            argsz: U32::new(32),
            flags: U32::new(DMA_MAP_FLAG_READ | DMA_MAP_FLAG_WRITE),
            offset: U64::new(offset),
            address: U64::new(iova),
            size: U64::new(size),
        };
        let fds: Vec<BorrowedFd<'_>> = fd.into_iter().collect();
        self.request(Command::DmaMap, &[m.as_bytes()], &fds)?;
        Ok(())
    }

    pub fn dma_unmap(&mut self, iova: u64, size: u64) -> Result<(), ClientError> {
        let u = DmaUnmap {
            argsz: U32::new(24),
            flags: U32::new(0),
            address: U64::new(iova),
            size: U64::new(size),
        };
        self.request(Command::DmaUnmap, &[u.as_bytes()], &[])?;
        Ok(())
    }

    pub fn region_read(&mut self, region: u32, offset: u64, buf: &mut [u8]) -> Result<(), ClientError> {
        let a = RegionAccess {
            offset: U64::new(offset),
            region: U32::new(region),
            count: U32::new(buf.len() as u32),
        };
        let r = self.request(Command::RegionRead, &[a.as_bytes()], &[])?;
        let data = r
            .payload
            .get(16..16 + buf.len())
            .ok_or_else(|| ClientError::BadReply(Command::RegionRead, "short data".into()))?;
        buf.copy_from_slice(data);
        Ok(())
    }

    /// A region write that waits for the server's reply.
    pub fn region_write(&mut self, region: u32, offset: u64, data: &[u8]) -> Result<(), ClientError> {
        let a = RegionAccess {
            offset: U64::new(offset),
            region: U32::new(region),
            count: U32::new(data.len() as u32),
        };
        self.request(Command::RegionWrite, &[a.as_bytes(), data], &[])?;
        Ok(())
    }

    /// A posted region write (No_reply): the server handles it in order, answers nothing.
    pub fn region_write_posted(&mut self, region: u32, offset: u64, data: &[u8]) -> Result<(), ClientError> {
        let a = RegionAccess {
            offset: U64::new(offset),
            region: U32::new(region),
            count: U32::new(data.len() as u32),
        };
        self.send(Command::RegionWrite, &[a.as_bytes(), data], &[], true)?;
        Ok(())
    }

    pub fn reset(&mut self) -> Result<(), ClientError> {
        self.request(Command::DeviceReset, &[], &[])?;
        Ok(())
    }

    /// The raw connection (for tests that send malformed messages).
    pub fn connection(&mut self) -> &mut Connection {
        &mut self.conn
    }

    pub fn read_u32(&mut self, region: u32, offset: u64) -> Result<u32, ClientError> {
        let mut b = [0u8; 4];
        self.region_read(region, offset, &mut b)?;
        Ok(u32::from_le_bytes(b))
    }

    /// A reply payload read as `T`.
    pub fn parse<T: FromBytes>(b: &[u8]) -> Option<T> {
        T::read_from_prefix(b).ok().map(|(v, _)| v)
    }
}
