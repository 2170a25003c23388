//! A set of backend queues, one per active namespace: what an engine hands its I/O
//! to, and what the admin side runs its own requests on (Format, the flush at
//! shutdown).
//!
//! A removed namespace's queue is not dropped while requests are out on it: those
//! may still move data into guest memory, so the queue is kept ("retiring") and
//! reaped until they come back. The set counts its changes so an owner sleeping on
//! the queues' notifiers knows when to look at them again.

use std::os::fd::{AsRawFd, RawFd};

use block_backend::{Backend, BackendQueue, Completion};
use guest_mem::GuestMemory;

#[derive(Debug)]
pub(crate) struct BackendSet {
    /// Indexed by nsid - 1; None: inactive NSID, a queue that could not be opened,
    /// or a closed set.
    queues: Vec<Option<Box<dyn BackendQueue>>>,
    /// Per entry of `queues`: it runs requests to their end in `run_now`.
    runs_now: Vec<bool>,
    /// Indices of `queues` that hold a queue, for the loops over them.
    open: Vec<usize>,
    /// Queues of removed namespaces with requests still out.
    retiring: Vec<Box<dyn BackendQueue>>,
    /// Changes whenever the queues, and so their notifiers, change.
    generation: u64,
    /// Opens no queue, now or for namespaces added later.
    closed: bool,
}

impl BackendSet {
    /// A queue on each backend, the namespace of NSID `i + 1` being the `i`-th
    /// (None: inactive).
    pub fn open<'a>(backends: impl Iterator<Item = Option<&'a dyn Backend>>) -> std::io::Result<Self> {
        let queues: Vec<Option<Box<dyn BackendQueue>>> =
            backends.map(|b| b.map(|b| b.open_queue()).transpose()).collect::<Result<_, _>>()?;
        let mut set = BackendSet {
            queues,
            runs_now: Vec::new(),
            open: Vec::new(),
            retiring: Vec::new(),
            generation: 0,
            closed: false,
        };
        set.index();
        Ok(set)
    }

    /// Namespace `nsid`'s queue.
    #[inline]
    pub fn queue(&mut self, nsid: u32) -> Option<&mut Box<dyn BackendQueue>> {
        self.queues.get_mut((nsid as usize).wrapping_sub(1)).and_then(Option::as_mut)
    }

    /// Namespace `nsid`'s queue, if it runs requests to their end in
    /// [`BackendQueue::run_now`].
    #[inline]
    pub fn queue_running_now(&mut self, nsid: u32) -> Option<&mut Box<dyn BackendQueue>> {
        let i = (nsid as usize).wrapping_sub(1);
        if *self.runs_now.get(i)? {
            self.queues[i].as_mut()
        } else {
            None
        }
    }

    /// Opens a queue on `backend` for namespace `nsid`, just added (nothing, if the
    /// set is closed).
    pub fn attach(&mut self, nsid: u32, backend: &dyn Backend) -> std::io::Result<()> {
        if self.closed {
            return Ok(());
        }
        let q = backend.open_queue()?;
        let i = (nsid as usize).saturating_sub(1);
        if i >= self.queues.len() {
            self.queues.resize_with(i + 1, || None);
        }
        self.queues[i] = Some(q);
        self.changed();
        Ok(())
    }

    /// Lets go of namespace `nsid`'s queue, just removed: kept until the requests
    /// still out on it come back.
    pub fn detach(&mut self, nsid: u32) {
        if let Some(q) = self.queues.get_mut((nsid as usize).wrapping_sub(1)).and_then(Option::take) {
            if q.in_flight() > 0 {
                self.retiring.push(q);
            }
            self.changed();
        }
    }

    /// Closes every queue and opens none from now on (the controller's own engine,
    /// once workers own every I/O queue: a backend with a limited number of queues,
    /// nvme://, or a cost per queue, an io_uring ring, spends them on the workers).
    pub fn close(&mut self) {
        self.queues.iter_mut().for_each(|q| *q = None);
        self.closed = true;
        self.changed();
    }

    fn changed(&mut self) {
        self.index();
        self.generation += 1;
    }

    /// Which queues are open, and which of them run requests now.
    fn index(&mut self) {
        self.open = (0..self.queues.len()).filter(|&i| self.queues[i].is_some()).collect();
        self.runs_now = self.queues.iter().map(|q| q.as_ref().is_some_and(|q| q.runs_now())).collect();
    }

    /// Every queue, retiring ones included.
    fn all(&self) -> impl Iterator<Item = &dyn BackendQueue> + '_ {
        self.open.iter().filter_map(|&i| self.queues[i].as_deref()).chain(self.retiring.iter().map(|b| &**b))
    }

    /// Tells every queue the guest memory map changed.
    pub fn memory_changed(&mut self, mem: &GuestMemory) {
        for q in self.queues.iter_mut().flatten().chain(self.retiring.iter_mut()) {
            q.memory_changed(mem);
        }
    }

    /// The descriptors of queues that complete asynchronously (level triggered).
    pub fn notifiers(&self) -> Vec<RawFd> {
        self.all().filter_map(|q| q.notifier().map(|fd| fd.as_raw_fd())).collect()
    }

    /// Changes whenever [`Self::notifiers`] may have changed.
    pub fn generation(&self) -> u64 {
        self.generation
    }

    /// Some queue with requests out has no notifier: only polling finds them.
    pub fn needs_polling(&self) -> bool {
        self.all().any(|q| q.needs_polling())
    }

    /// Some removed namespace's queue still has requests out.
    #[inline]
    pub fn retiring(&self) -> bool {
        !self.retiring.is_empty()
    }

    /// Sends what was submitted and collects what finished into `out`, from every
    /// queue with requests out; drops retiring queues once they have none. True if
    /// anything finished.
    #[inline]
    pub fn reap(&mut self, out: &mut Vec<Completion>) -> bool {
        let mut any = false;
        for &i in &self.open {
            let Some(q) = self.queues[i].as_mut() else { continue };
            if q.in_flight() > 0 {
                q.commit();
                any |= q.reap(out) > 0;
            }
        }
        if !self.retiring.is_empty() {
            any |= self.reap_retiring(out);
        }
        any
    }

    /// [`Self::reap`] of the retiring queues alone.
    pub fn reap_retiring(&mut self, out: &mut Vec<Completion>) -> bool {
        let mut any = false;
        for q in &mut self.retiring {
            any |= q.reap(out) > 0;
        }
        let before = self.retiring.len();
        self.retiring.retain(|q| q.in_flight() > 0);
        if self.retiring.len() != before {
            self.generation += 1;
        }
        any
    }

    /// Asks the queues that may hold request `tag` of namespace `nsid` (its own, and
    /// the retiring ones) to keep it off guest memory. True if none can still touch
    /// it.
    pub fn revoke(&mut self, nsid: u32, tag: u64) -> bool {
        let own = self.queues.get_mut((nsid as usize).wrapping_sub(1)).and_then(Option::as_mut);
        own.into_iter().chain(self.retiring.iter_mut()).all(|q| q.revoke(tag) != Some(false))
    }
}
