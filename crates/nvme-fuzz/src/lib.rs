//! Structured fuzzing of the controller: input bytes decode to a program of admin and
//! I/O commands (random, or valid with one field mutated), BAR0 register and doorbell
//! writes, shadow doorbell and ring scribbles, guest memory map changes, reaps and
//! device runs, executed against a controller driven by the mock host; invariants are
//! checked after every step.
//!
//! - [`run_one`] is the fuzz target: the libFuzzer harness in `fuzz/` and the stable
//!   runner (`cargo run --release -p nvme-fuzz --bin fuzz-run`) both call it.
//! - [`program`] says what the bytes mean (and encodes programs back to bytes, for
//!   hand-built corpus seeds), [`exec`] what is run and checked.
//! - [`vfio::run_vfio_one`] is the second target: vfio-user message sequences with
//!   descriptors of every kind, fed to the vfio-user server in process.
//! - [`state::run_state_counted`] is the third: saved controller states mutated
//!   field by field, restored (all or nothing) into a new controller.
//! - A panic anywhere is a bug found: in the controller, or an invariant it broke.
#![forbid(unsafe_code)]

mod cmds;
pub mod exec;
pub mod gen;
pub mod guard;
pub mod program;
pub mod seeds;
pub mod state;
pub mod vfio;

use std::sync::atomic::{AtomicBool, Ordering};

pub use exec::Stats;

static EXPLORE_KNOWN_BUGS: AtomicBool = AtomicBool::new(false);

/// Lets programs take paths that reach controller bugs already reported and not yet
/// fixed (`corpus/known-bugs/README.md`, empty today). Off by default, so that a run
/// (and CI) fails only on something new.
pub fn set_explore_known_bugs(on: bool) {
    EXPLORE_KNOWN_BUGS.store(on, Ordering::Relaxed);
}

pub fn explore_known_bugs() -> bool {
    EXPLORE_KNOWN_BUGS.load(Ordering::Relaxed)
}
pub use program::Program;

/// Decodes `data` as a [`Program`] and runs it. Panics when the controller panics or
/// breaks an invariant.
pub fn run_one(data: &[u8]) {
    run_one_counted(data, &mut Stats::default());
}

/// As [`run_one`], adding what the run did to `stats`.
pub fn run_one_counted(data: &[u8], stats: &mut Stats) {
    exec::run_program(&Program::decode(data), stats);
}
