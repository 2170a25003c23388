//! The version and the commit this binary was built from (build.rs).

/// What a test build adds after the commit: it obeys the tests' fault injection
/// variables (VNVME_TEST_*), which no served build may, and says so wherever it
/// names itself.
#[cfg(feature = "fault-injection")]
macro_rules! test_build {
    () => {
        ", with fault injection: a test build, not for serving"
    };
}
#[cfg(not(feature = "fault-injection"))]
macro_rules! test_build {
    () => {
        ""
    };
}

/// The version and the commit, as `--version` and the start-up line print them.
pub const VERSION: &str =
    concat!(env!("CARGO_PKG_VERSION"), " (commit ", env!("VNVME_COMMIT"), test_build!(), ")");
/// The commit alone.
pub const COMMIT: &str = env!("VNVME_COMMIT");
