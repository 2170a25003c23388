//! The version and the commit this binary was built from (build.rs).

/// The version and the commit, as `--version` and the start-up line print them.
#[cfg(not(feature = "fault-injection"))]
pub const VERSION: &str = concat!(env!("CARGO_PKG_VERSION"), " (commit ", env!("VNVME_COMMIT"), ")");
/// A test build says so wherever it names itself: it obeys the tests' fault
/// injection variables (VNVME_TEST_*), which no served build may.
#[cfg(feature = "fault-injection")]
pub const VERSION: &str = concat!(
    env!("CARGO_PKG_VERSION"),
    " (commit ",
    env!("VNVME_COMMIT"),
    ", with fault injection: a test build, not for serving)"
);
/// The commit alone.
pub const COMMIT: &str = env!("VNVME_COMMIT");
