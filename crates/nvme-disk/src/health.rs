//! Health: a dead downstream fails everything, and wakes whoever waits.
//!
//! The downstream is declared dead once, with the reason, by whoever notices first:
//! a queue whose transport fails, or the [`Watcher`] thread, which sees a vfio-user
//! server hang up at once and polls CSTS once a second while requests are in flight
//! (Controller Fatal Status, a device that reads all ones). Declaring it writes every
//! queue's interrupt eventfd, so an owner asleep on its notifier wakes, finds the
//! backend dead and fails its requests with `NotReady` rather than hang.

use std::io;
use std::os::fd::OwnedFd;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::thread::JoinHandle;
use std::time::Duration;

use nvme_driver::{new_eventfd, DeviceHandle};
use rustix::event::{poll, PollFd, PollFlags, Timespec};
use tracing::warn;

use crate::lock;

/// Whether the downstream is still usable, shared by the backend, its queues and the
/// watcher.
#[derive(Debug, Default)]
pub(crate) struct Health {
    dead: OnceLock<String>,
    /// Duplicates of every queue's interrupt eventfd, to wake sleeping owners.
    pub(crate) wakers: Mutex<Vec<OwnedFd>>,
    /// Queues with requests in flight (the watcher checks CSTS only then).
    pub(crate) busy: AtomicUsize,
}

impl Health {
    /// Why the downstream is unusable, once it is.
    pub(crate) fn dead(&self) -> Option<&str> {
        self.dead.get().map(String::as_str)
    }

    /// Records why the downstream is unusable (the first reason wins) and wakes
    /// every queue.
    pub(crate) fn declare_dead(&self, why: String) {
        if self.dead.set(why).is_ok() {
            warn!("nvme backend: downstream controller unusable: {}", self.dead().unwrap_or_default());
            for fd in lock(&self.wakers).iter() {
                let _ = rustix::io::write(fd, &1u64.to_ne_bytes());
            }
        }
    }
}

/// The thread that notices a downstream that went away while nobody talks to it.
#[derive(Debug)]
pub(crate) struct Watcher {
    stop: OwnedFd,
    thread: Option<JoinHandle<()>>,
}

impl Watcher {
    pub(crate) fn spawn(device: DeviceHandle, health: Arc<Health>) -> io::Result<Self> {
        let stop = new_eventfd()?;
        let stop2 = stop.try_clone()?;
        let hangup = device.hangup_fd()?;
        let thread = std::thread::Builder::new()
            .name("nvme-backend-watch".into())
            .spawn(move || watch(device, hangup, stop2, health))?;
        Ok(Watcher { stop, thread: Some(thread) })
    }
}

impl Drop for Watcher {
    fn drop(&mut self) {
        let _ = rustix::io::write(&self.stop, &1u64.to_ne_bytes());
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn watch(device: DeviceHandle, hangup: Option<OwnedFd>, stop: OwnedFd, health: Arc<Health>) {
    let tick = Timespec { tv_sec: 1, tv_nsec: 0 };
    while health.dead().is_none() {
        let mut fds = vec![PollFd::new(&stop, PollFlags::IN)];
        if let Some(h) = &hangup {
            fds.push(PollFd::new(h, PollFlags::RDHUP));
        }
        if let Err(e) = poll(&mut fds, Some(&tick)) {
            if e != rustix::io::Errno::INTR {
                warn!("nvme backend watcher: poll: {e}");
                std::thread::sleep(Duration::from_secs(1));
            }
            continue;
        }
        if !fds[0].revents().is_empty() {
            return;
        }
        let gone = PollFlags::HUP | PollFlags::RDHUP | PollFlags::ERR;
        if fds.get(1).is_some_and(|f| f.revents().intersects(gone)) {
            health.declare_dead("the vfio-user server closed the connection".into());
            return;
        }
        drop(fds);
        if health.busy.load(Ordering::SeqCst) > 0 {
            match device.csts() {
                Err(e) => health.declare_dead(format!("transport: {e}")),
                Ok(c) if c.0 == u32::MAX => {
                    health.declare_dead("the device is gone (CSTS reads all ones)".into())
                }
                Ok(c) if c.cfs() => health.declare_dead(format!("Controller Fatal Status (CSTS {:#x})", c.0)),
                Ok(_) => {}
            }
        }
    }
}
