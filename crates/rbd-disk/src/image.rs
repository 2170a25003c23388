//! The cluster connection and the open image a namespace's queues share.

use std::ffi::CString;
use std::io;
use std::ptr;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tracing::{info, warn};

use crate::ffi::{self, ImageT, IoctxT, Lib, RadosT};
use crate::spec::RbdSpec;

/// How long connecting to the monitors and each monitor request may take, unless the
/// configuration says otherwise (librados waits 300 s by default: a start-up that
/// looks hung).
const CONNECT_TIMEOUT_S: &str = "10";

#[derive(Debug)]
pub(crate) struct Image {
    pub(crate) lib: &'static Lib,
    pub(crate) spec: RbdSpec,
    cluster: RadosT,
    ioctx: IoctxT,
    pub(crate) handle: ImageT,
    size: AtomicU64,
    /// Requests handed to librbd and not yet called back, over every queue.
    pub(crate) outstanding: Arc<AtomicUsize>,
    pub(crate) submitted: AtomicU64,
    /// Whether the cluster answers, as the queues see it.
    pub(crate) liveness: Arc<crate::liveness::Liveness>,
}

// The image's asynchronous calls are made from each queue's owner thread, resize
// from the control thread; the rest of Image is atomics and plain data.
// SAFETY: the handles are librados/librbd objects usable from any thread.
unsafe impl Send for Image {}
// SAFETY: as for Send.
unsafe impl Sync for Image {}

fn cstr(what: &str, s: &str) -> io::Result<CString> {
    CString::new(s)
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, format!("{what} holds a NUL byte")))
}

impl Image {
    pub(crate) fn open(lib: &'static Lib, spec: &RbdSpec) -> io::Result<Image> {
        let user = format!("client.{}", spec.id.as_deref().unwrap_or("admin"));
        let fail = |what: String, ret: i32| {
            io::Error::new(
                ffi::errno(ret.into()).kind(),
                format!("{spec}: {what}: {}", ffi::errno(ret.into())),
            )
        };
        let id = spec.id.as_deref().map(|i| cstr("id", i)).transpose()?;
        let mut cluster: RadosT = ptr::null_mut();
        // `id` is NULL (admin) or a NUL-terminated string librados copies.
        // SAFETY: `cluster` is a valid out-pointer; `id` outlives the call.
        let r = unsafe { (lib.rados_create)(&mut cluster, id.as_ref().map_or(ptr::null(), |c| c.as_ptr())) };
        if r < 0 {
            return Err(fail(format!("cannot create a RADOS client for {user}"), r));
        }
        // From here on `guard` shuts the client down if anything fails.
        let mut guard = Partial { lib, cluster, ioctx: ptr::null_mut() };
        let set = |k: &str, v: &str| -> io::Result<i32> {
            let (k, v) = (cstr(k, k)?, cstr(k, v)?);
            // `cluster` was created above and is not yet shut down.
            // SAFETY: `cluster` is live; both strings are NUL-terminated and outlive the call.
            Ok(unsafe { (lib.rados_conf_set)(cluster, k.as_ptr(), v.as_ptr()) })
        };
        // Defaults a configuration file may override.
        set("client_mount_timeout", CONNECT_TIMEOUT_S)?;
        set("rados_mon_op_timeout", CONNECT_TIMEOUT_S)?;
        let conf = spec.conf.as_ref().map(|p| cstr("conf", &p.to_string_lossy())).transpose()?;
        let path = conf.as_ref().map_or(ptr::null(), |c| c.as_ptr());
        // The path is NULL (librados' default search) or NUL-terminated.
        // SAFETY: `cluster` is live; `conf` outlives the call.
        let r = unsafe { (lib.rados_conf_read_file)(cluster, path) };
        if r < 0 {
            let what = match &spec.conf {
                Some(p) => format!("cannot read the Ceph configuration {}", p.display()),
                None => "no Ceph configuration found (give conf=PATH, or set CEPH_CONF)".into(),
            };
            return Err(fail(what, r));
        }
        // SAFETY: `cluster` is live; NULL means the CEPH_ARGS environment variable.
        let r = unsafe { (lib.rados_conf_parse_env)(cluster, ptr::null()) };
        if r < 0 {
            return Err(fail("cannot use CEPH_ARGS".into(), r));
        }
        if let Some(t) = spec.op_timeout {
            // Unless the configuration chose: requests to a cluster that stopped
            // answering fail (ETIMEDOUT) instead of waiting forever.
            let secs = t.as_secs().max(1).to_string();
            for key in ["rados_osd_op_timeout", "rados_mon_op_timeout"] {
                let k = cstr(key, key)?;
                let mut buf = [0 as std::ffi::c_char; 32];
                // `buf` is writable for its length, which is passed.
                // SAFETY: `cluster` is live; `k` is NUL-terminated.
                let r = unsafe { (lib.rados_conf_get)(cluster, k.as_ptr(), buf.as_mut_ptr(), buf.len()) };
                let now = (r == 0).then(|| {
                    // SAFETY: on success librados wrote a NUL-terminated value into `buf`.
                    unsafe { std::ffi::CStr::from_ptr(buf.as_ptr()) }.to_bytes().to_vec()
                });
                let default = match key {
                    "rados_osd_op_timeout" => now.as_deref() == Some(b"0"),
                    _ => now.as_deref() == Some(CONNECT_TIMEOUT_S.as_bytes()),
                };
                if default {
                    set(key, &secs)?;
                }
            }
        }
        if let Some(k) = &spec.keyring {
            let r = set("keyring", &k.to_string_lossy())?;
            if r < 0 {
                return Err(fail(format!("keyring={}", k.display()), r));
            }
        }
        // This blocks for at most client_mount_timeout.
        // SAFETY: `cluster` is live and configured.
        let r = unsafe { (lib.rados_connect)(cluster) };
        if r < 0 {
            let conf =
                spec.conf.as_ref().map_or("the default configuration".into(), |p| p.display().to_string());
            return Err(fail(format!("cannot connect to the Ceph cluster as {user} (with {conf})"), r));
        }
        let pool = cstr("pool", &spec.pool)?;
        let mut ioctx: IoctxT = ptr::null_mut();
        // `cluster` is connected.
        // SAFETY: `pool` is NUL-terminated; `ioctx` is a valid out-pointer.
        let r = unsafe { (lib.rados_ioctx_create)(cluster, pool.as_ptr(), &mut ioctx) };
        if r == -libc::ENOENT {
            return Err(fail(format!("the cluster has no pool named {:?}", spec.pool), r));
        } else if r < 0 {
            return Err(fail(format!("cannot open pool {:?}", spec.pool), r));
        }
        guard.ioctx = ioctx;
        if !spec.namespace.is_empty() {
            let ns = cstr("namespace", &spec.namespace)?;
            // SAFETY: `ioctx` is live; the name is NUL-terminated and copied.
            unsafe { (lib.rados_ioctx_set_namespace)(ioctx, ns.as_ptr()) };
        }
        let name = cstr("image", &spec.image)?;
        let snap = spec.snap.as_deref().map(|s| cstr("snapshot", s)).transpose()?;
        let mut handle: ImageT = ptr::null_mut();
        // The snapshot name may be NULL: the image itself.
        // SAFETY: `ioctx` is live; names NUL-terminated, outliving the call; `handle` an out-pointer.
        let r = unsafe {
            (lib.rbd_open)(
                ioctx,
                name.as_ptr(),
                &mut handle,
                snap.as_ref().map_or(ptr::null(), |c| c.as_ptr()),
            )
        };
        if r == -libc::ENOENT {
            let what = match &spec.snap {
                Some(snap) => format!("no image {:?} with a snapshot {snap:?} in that pool", spec.image),
                None => {
                    format!("no image {:?} in pool {:?} (create it with `rbd create`)", spec.image, spec.pool)
                }
            };
            return Err(fail(what, r));
        } else if r < 0 {
            return Err(fail(format!("cannot open the image as {user}"), r));
        }
        let mut size = 0u64;
        // SAFETY: `handle` was just opened; `size` is a valid out-pointer.
        let r = unsafe { (lib.rbd_get_size)(handle, &mut size) };
        if r < 0 {
            // SAFETY: `handle` is open and nothing else uses it.
            unsafe { (lib.rbd_close)(handle) };
            return Err(fail("cannot read the image's size".into(), r));
        }
        std::mem::forget(guard);
        Ok(Image {
            lib,
            spec: spec.clone(),
            cluster,
            ioctx,
            handle,
            size: AtomicU64::new(size),
            outstanding: Arc::new(AtomicUsize::new(0)),
            submitted: AtomicU64::new(0),
            liveness: Default::default(),
        })
    }

    pub(crate) fn size(&self) -> u64 {
        self.size.load(Ordering::Relaxed)
    }

    pub(crate) fn resize(&self, bytes: u64) -> io::Result<()> {
        if self.spec.snap.is_some() {
            return Err(io::Error::new(io::ErrorKind::Unsupported, "a snapshot cannot be resized"));
        }
        // librbd serialises a resize against the image's I/O itself.
        // SAFETY: `handle` is open for the life of `self`.
        let r = unsafe { (self.lib.rbd_resize)(self.handle, bytes) };
        if r < 0 {
            return Err(io::Error::new(
                ffi::errno(r.into()).kind(),
                format!("{}: resize: {}", self.spec, ffi::errno(r.into())),
            ));
        }
        self.size.store(bytes, Ordering::Relaxed);
        Ok(())
    }

    pub(crate) fn stats_line(&self) -> String {
        format!(
            "librbd: {} requests sent, {} in flight",
            self.submitted.load(Ordering::Relaxed),
            self.outstanding.load(Ordering::Relaxed)
        )
    }
}

impl Drop for Image {
    fn drop(&mut self) {
        let left = self.outstanding.load(Ordering::Acquire);
        if left > 0 {
            // Closing waits for them, maybe forever (a cluster gone): leave the image
            // open instead. Their buffers belong to their callbacks, not to us.
            warn!(target: "vnvme::backend", "{}: {left} librbd requests never ended; the image is left open", self.spec);
            return;
        }
        // Closing releases the image's lock and watch, which needs the cluster: one
        // that stopped answering makes it wait until librados gives up (the hold).
        if self.liveness.closed_gone() {
            info!(target: "vnvme::backend", "{}: closing the image while the cluster is gone (librados gives up after {})",
                self.spec,
                self.spec.op_timeout.map_or("rados_osd_op_timeout".into(), |t| format!("{} s", t.as_secs())));
        }
        let t0 = Instant::now();
        // This is the last reference: no queue holds the image any more.
        // SAFETY: nothing is in flight; each handle is closed once, innermost first.
        unsafe {
            (self.lib.rbd_close)(self.handle);
            (self.lib.rados_ioctx_destroy)(self.ioctx);
            (self.lib.rados_shutdown)(self.cluster);
        }
        let took = t0.elapsed();
        if took >= Duration::from_secs(2) {
            warn!(target: "vnvme::backend", "{}: closing the image took {:.1} s (the cluster did not answer)", self.spec, took.as_secs_f64());
        }
    }
}

/// A client being set up: shut down if setting it up fails.
struct Partial {
    lib: &'static Lib,
    cluster: RadosT,
    ioctx: IoctxT,
}

impl Drop for Partial {
    fn drop(&mut self) {
        // Only reached on a failed open: the handles were created above.
        // SAFETY: no image is open on them, and nothing else has them.
        unsafe {
            if !self.ioctx.is_null() {
                (self.lib.rados_ioctx_destroy)(self.ioctx);
            }
            (self.lib.rados_shutdown)(self.cluster);
        }
    }
}
