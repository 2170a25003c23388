//! What every test shares, with no workspace crate under it (so the lowest crates
//! dev-depend on it without a cycle, and nothing shipped links it):
//!
//! - one seeded generator, [`Rng`], and the data [`pattern`] built on it, so a
//!   failure reproduces from its seed;
//! - [`memfd`](mod@memfd) files sealed against shrinking (what a VMM hands a
//!   vfio-user device as memory);
//! - [`skip`]: a test that cannot check what it is about here says so, loudly and
//!   once, where scripts/test.sh counts it;
//! - a [`watchdog`] that ends a call that would otherwise hang a test run forever.
#![forbid(unsafe_code)]

pub mod memfd;
mod rng;
mod skip;
mod watchdog;

pub use rng::{pattern, Rng};
pub use skip::skip;
pub use watchdog::{bounded, watchdog, watchdog_for, Watchdog, WATCHDOG_LIMIT};
