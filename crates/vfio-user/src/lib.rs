//! The vfio-user protocol as QEMU documents it (docs/interop/vfio-user.rst): message
//! layouts, the version handshake, and framing over a UNIX stream socket with file
//! descriptors passed as SCM_RIGHTS. Used by the server (`vfio-user-server`) and by
//! the client transport of the userspace NVMe driver.
//!
//! Everything received is untrusted: every length is checked before it is used, and a
//! malformed message is an error for the caller to answer, never a panic.

pub mod client;
pub mod message;
pub mod proto;
pub mod rx;
pub mod socket;
pub mod version;

pub use proto::{Command, Header, MsgFlags};
pub use socket::{Connection, Message, ProtoError};
