//! The version and the commit this binary was built from (build.rs).

/// The version and the commit, as `--version` and the start-up line print them.
pub const VERSION: &str = concat!(env!("CARGO_PKG_VERSION"), " (commit ", env!("VNVME_COMMIT"), ")");
/// The commit alone.
pub const COMMIT: &str = env!("VNVME_COMMIT");
