//! A received message, and why one could not be read.

use std::io;
use std::os::fd::OwnedFd;
use std::time::Duration;

use zerocopy::FromBytes;

use crate::proto::{Header, MAX_MESSAGE};

/// Why a message could not be read or was malformed.
#[derive(Debug, thiserror::Error)]
pub enum ProtoError {
    #[error("peer closed the connection")]
    Closed,
    #[error("socket: {0}")]
    Io(#[from] io::Error),
    #[error("message size {0} is outside 16..={MAX_MESSAGE}")]
    BadSize(u32),
    #[error("too many file descriptors ({0})")]
    TooManyFds(usize),
    /// The peer stalled: a message began to arrive and did not complete, or a reply
    /// could not leave (the peer stopped reading), within the connection's deadline.
    #[error("{what} within {limit:?}")]
    Deadline { what: &'static str, limit: Duration },
}

/// A received message.
#[derive(Debug)]
pub struct Message {
    pub header: Header,
    pub payload: Vec<u8>,
    pub fds: Vec<OwnedFd>,
}

impl Message {
    /// The payload read as `T`, if it is at least that long.
    pub fn payload_as<T: FromBytes>(&self) -> Option<T> {
        T::read_from_prefix(&self.payload).ok().map(|(v, _)| v)
    }
}
