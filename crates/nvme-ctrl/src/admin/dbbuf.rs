//! Doorbell Buffer Config (Base §5.2.5): where shadow doorbells start.

use nvme_spec::admin::DoorbellBufferConfig;
use nvme_spec::Sqe;
use tracing::info;

use super::{done, Admin, AdminDone};
use crate::doorbell::ShadowBuffers;
use crate::error::{CmdResult, CommandError};

impl Admin<'_> {
    /// Both buffers must be memory-page aligned (Invalid Field in Command otherwise),
    /// distinct, and inside guest memory. On success every existing queue is attached
    /// (see `IoEngine::attach_shadow`); queues created later attach at creation.
    pub(crate) fn doorbell_buffer_config(&mut self, sqe: &Sqe) -> CmdResult<AdminDone> {
        let c = DoorbellBufferConfig(sqe);
        let (shadow, eventidx) = (c.shadow_doorbell(), c.eventidx());
        let page = self.page_size();
        if shadow % page != 0 || eventidx % page != 0 {
            return Err(CommandError::InvalidField("Doorbell Buffer Config buffers must be page aligned"));
        }
        if shadow == eventidx {
            return Err(CommandError::InvalidField("shadow doorbell and EventIdx buffers are the same page"));
        }
        let need = ShadowBuffers::required_len(self.cfg.max_io_queues, self.cfg.dstrd);
        if self.engine.io.mem.check_range(shadow, need).is_err()
            || self.engine.io.mem.check_range(eventidx, need).is_err()
        {
            return Err(CommandError::InvalidField(
                "Doorbell Buffer Config buffers are outside guest memory",
            ));
        }
        self.runtime.attach_shadow(self.engine, ShadowBuffers { shadow, eventidx, dstrd: self.cfg.dstrd });
        info!(
            shadow = format_args!("{shadow:#x}"),
            eventidx = format_args!("{eventidx:#x}"),
            "shadow doorbells enabled"
        );
        done()
    }
}
