//! The safe layer over librbd's asynchronous calls: a request handed to librbd owns
//! its buffer and a reference to its queue's inbox (a boxed [`Call`], the callback's
//! argument). librbd's callback, on a librbd thread, takes the box back, so a buffer
//! lives exactly as long as librbd may use it, even if the queue is gone by then;
//! the result goes into the inbox and the inbox's eventfd is written. Nothing above
//! this module touches a raw pointer.

use std::ffi::c_void;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};

use block_backend::BackendError;

use crate::ffi::{self, CompletionT, Lib};
use crate::image::Image;

/// A result librbd handed back.
#[derive(Debug)]
pub(crate) struct Finished {
    /// The queue's slot the request came from.
    pub slot: usize,
    /// librbd's return value (negative: an errno).
    pub ret: isize,
    /// The request's buffer, back from librbd.
    pub buf: Vec<u8>,
}

/// Where librbd's callbacks leave results for the queue's owner.
#[derive(Debug)]
pub(crate) struct Inbox {
    pub done: Mutex<Vec<Finished>>,
    /// Readable while results wait: the queue's notifier (an eventfd).
    pub event: std::os::fd::OwnedFd,
}

/// One call librbd holds: the callback's argument.
#[derive(Debug)]
struct Call {
    lib: &'static Lib,
    inbox: Arc<Inbox>,
    outstanding: Arc<std::sync::atomic::AtomicUsize>,
    slot: usize,
    buf: Vec<u8>,
}

/// librbd's completion callback.
///
/// # Safety
/// Called by librbd, once per completion, with the argument given to
/// rbd_aio_create_completion: a `Box<Call>` leaked by [`submit`].
unsafe extern "C" fn on_complete(c: CompletionT, arg: *mut c_void) {
    // Taking the box back frees it at the end of this function.
    // SAFETY: `arg` is the Box<Call> leaked for this completion, handed back once.
    let call = unsafe { Box::from_raw(arg.cast::<Call>()) };
    // librbd allows both calls in the callback.
    // SAFETY: `c` is this callback's completion, released once, after its value is read.
    let ret = unsafe {
        let r = (call.lib.rbd_aio_get_return_value)(c);
        (call.lib.rbd_aio_release)(c);
        r
    };
    let Call { inbox, outstanding, slot, buf, .. } = *call;
    inbox.done.lock().unwrap_or_else(|p| p.into_inner()).push(Finished { slot, ret, buf });
    outstanding.fetch_sub(1, Ordering::Release);
    // A full counter still means readable: nothing is lost.
    let _ = rustix::io::write(&inbox.event, &1u64.to_ne_bytes());
}

/// What to ask librbd for. Reads fill the buffer handed over, writes send it.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Aio {
    Read { offset: u64 },
    Write { offset: u64 },
    Flush,
    Discard { offset: u64, len: u64 },
    WriteZeroes { offset: u64, len: u64 },
}

/// Hands `aio` for the queue's slot `slot` to librbd, with `buf` (a read's room or a
/// write's data, its whole length moved). Its result arrives in `inbox`. Err: librbd
/// did not take it, and the buffer comes back.
pub(crate) fn submit(
    image: &Image,
    inbox: &Arc<Inbox>,
    slot: usize,
    aio: Aio,
    buf: Vec<u8>,
) -> Result<(), (BackendError, Vec<u8>)> {
    let lib = image.lib;
    let call =
        Box::new(Call { lib, inbox: inbox.clone(), outstanding: image.outstanding.clone(), slot, buf });
    let (data, len) = (call.buf.as_ptr(), call.buf.len());
    let arg = Box::into_raw(call);
    let mut c: CompletionT = std::ptr::null_mut();
    // `on_complete` takes `arg` back, once.
    // SAFETY: `arg` is a leaked Box<Call>; `c` is a valid out-pointer.
    let r = unsafe { (lib.rbd_aio_create_completion)(arg.cast(), on_complete, &mut c) };
    if r < 0 {
        // SAFETY: librbd did not take `arg` (no completion exists): ours again.
        let call = unsafe { Box::from_raw(arg) };
        return Err((ffi::errno(r.into()).into(), call.buf));
    }
    image.outstanding.fetch_add(1, Ordering::Relaxed);
    let h = image.handle;
    // `h` is open while `image` lives (and left open by Image::drop while requests
    // are outstanding). `data` points into the boxed Call's buffer of `len` bytes,
    // allocated and unmoved until `on_complete` frees it, touched by nothing else
    // meanwhile. `c` is the completion just created.
    // SAFETY: image and buffer outlive the request; `c` is given to exactly one call.
    let r = unsafe {
        match aio {
            Aio::Read { offset } => (lib.rbd_aio_read)(h, offset, len, data.cast_mut().cast(), c),
            Aio::Write { offset } => (lib.rbd_aio_write)(h, offset, len, data.cast(), c),
            Aio::Flush => (lib.rbd_aio_flush)(h, c),
            Aio::Discard { offset, len } => (lib.rbd_aio_discard)(h, offset, len, c),
            Aio::WriteZeroes { offset, len } => match lib.rbd_aio_write_zeroes {
                Some(f) => f(h, offset, len as usize, c, 0, 0),
                None => -libc::EOPNOTSUPP,
            },
        }
    };
    if r < 0 {
        // librbd refused the request: the callback will not run.
        image.outstanding.fetch_sub(1, Ordering::Relaxed);
        // SAFETY: the completion was not handed to librbd, and `arg` is ours again.
        unsafe { (lib.rbd_aio_release)(c) };
        // SAFETY: as above: librbd holds no reference to `arg`.
        let call = unsafe { Box::from_raw(arg) };
        return Err((ffi::errno(r.into()).into(), call.buf));
    }
    image.submitted.fetch_add(1, Ordering::Relaxed);
    Ok(())
}
