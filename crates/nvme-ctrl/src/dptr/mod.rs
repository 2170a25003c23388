//! Data pointers: turning a command's PRP entries or SGL into the list of guest
//! memory segments a transfer covers (Base §4.3). Every fault becomes a
//! [`CommandError`] naming the status the spec gives it.

mod prp;
mod sgl;

pub use prp::prp_segments;
pub use sgl::sgl_segments;

/// Which way data moves, relative to the host.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Direction {
    /// Controller to host memory (Read, Identify, Get Log Page...).
    ToHost,
    /// Host memory to controller (Write, Compare, Set Features data...).
    FromHost,
}
