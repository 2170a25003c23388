//! Running a fetched I/O command: QoS first, then the command on its [`Io`](super::Io),
//! then its completion (the engine's: the command itself never posts one).

use nvme_spec::opcode::NvmOpcode;
use nvme_spec::Sqe;
use tracing::debug;

use super::{describe, IoEngine, Origin};
use crate::io::{error_slba, Started};
use crate::stats::OpClass;

impl IoEngine {
    /// Runs one I/O command fetched from SQ `sqid`.
    #[inline]
    pub(crate) fn execute(&mut self, sqid: u16, sqe: &Sqe) {
        if self.qos_admits(sqid, sqe) {
            self.run(sqid, sqe);
        }
    }

    /// Runs a command QoS let through (inlined: the frame it would add is a tenth
    /// of the cost of the rest of a command's way through the engine).
    #[inline(always)]
    pub(crate) fn run(&mut self, sqid: u16, sqe: &Sqe) {
        let status = match self.io.start(sqid, sqe) {
            Ok(Started::Pending) => return,
            Ok(Started::Ran { status, result, slba }) => {
                return self.complete_wide(Origin::of(sqid, sqe, slba), status, result);
            }
            Ok(Started::Done(status)) => {
                self.complete(Origin::of(sqid, sqe, 0), status, 0);
                status
            }
            Err(e) => {
                debug!(target: "vnvme::guest", sqid, "{}: {e}", describe(NvmOpcode(sqe.opcode()), sqe));
                self.complete(Origin::of(sqid, sqe, error_slba(sqe)), e.status(), 0);
                e.status()
            }
        };
        // Finished without a backend: counted with no latency to speak of.
        self.io.count_ns(sqe.nsid.get(), OpClass::of(sqe.opcode()), 0, 0, status.is_success());
    }
}
