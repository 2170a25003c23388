//! The slice of librados' and librbd's C API the backend uses, declared here by hand
//! from `rados/librados.h` and `rbd/librbd.h` (Ceph 15 and later) and resolved at run
//! time with dlopen, so that vnvme builds and runs where librbd is not installed and
//! serves `rbd:` namespaces where it is.
//!
//! Every function is reached through [`Lib`], whose fields are typed function
//! pointers. Calling one is unsafe: the callers in `lib.rs` and `queue.rs` say, at
//! each call, why the pointers they pass are valid for as long as librbd uses them.

use std::ffi::{c_char, c_int, c_void, CStr, CString};
use std::sync::OnceLock;

pub type RadosT = *mut c_void;
pub type IoctxT = *mut c_void;
pub type ImageT = *mut c_void;
pub type CompletionT = *mut c_void;
/// `rbd_callback_t`: called on a librbd thread when an asynchronous request ends.
pub type Callback = unsafe extern "C" fn(c: CompletionT, arg: *mut c_void);

/// The library to load: `VNVME_LIBRBD` (a path) if set, else `librbd.so.1` from the
/// dynamic loader's search path.
pub const LIBRBD_ENV: &str = "VNVME_LIBRBD";
const LIBRBD_DEFAULT: &str = "librbd.so.1";

/// The functions, resolved from librbd and (through its dependencies) librados.
#[derive(Debug)]
pub struct Lib {
    /// Where it was loaded from, and librbd's version ("1.16.0").
    pub path: String,
    pub version: String,
    pub rados_create: unsafe extern "C" fn(*mut RadosT, *const c_char) -> c_int,
    pub rados_conf_read_file: unsafe extern "C" fn(RadosT, *const c_char) -> c_int,
    pub rados_conf_set: unsafe extern "C" fn(RadosT, *const c_char, *const c_char) -> c_int,
    pub rados_conf_get: unsafe extern "C" fn(RadosT, *const c_char, *mut c_char, usize) -> c_int,
    pub rados_conf_parse_env: unsafe extern "C" fn(RadosT, *const c_char) -> c_int,
    pub rados_connect: unsafe extern "C" fn(RadosT) -> c_int,
    pub rados_shutdown: unsafe extern "C" fn(RadosT),
    pub rados_ioctx_create: unsafe extern "C" fn(RadosT, *const c_char, *mut IoctxT) -> c_int,
    pub rados_ioctx_destroy: unsafe extern "C" fn(IoctxT),
    pub rados_ioctx_set_namespace: unsafe extern "C" fn(IoctxT, *const c_char),
    pub rbd_open: unsafe extern "C" fn(IoctxT, *const c_char, *mut ImageT, *const c_char) -> c_int,
    pub rbd_close: unsafe extern "C" fn(ImageT) -> c_int,
    pub rbd_get_size: unsafe extern "C" fn(ImageT, *mut u64) -> c_int,
    pub rbd_resize: unsafe extern "C" fn(ImageT, u64) -> c_int,
    pub rbd_aio_create_completion: unsafe extern "C" fn(*mut c_void, Callback, *mut CompletionT) -> c_int,
    pub rbd_aio_get_return_value: unsafe extern "C" fn(CompletionT) -> isize,
    pub rbd_aio_release: unsafe extern "C" fn(CompletionT),
    pub rbd_aio_read: unsafe extern "C" fn(ImageT, u64, usize, *mut c_char, CompletionT) -> c_int,
    pub rbd_aio_write: unsafe extern "C" fn(ImageT, u64, usize, *const c_char, CompletionT) -> c_int,
    pub rbd_aio_flush: unsafe extern "C" fn(ImageT, CompletionT) -> c_int,
    pub rbd_aio_discard: unsafe extern "C" fn(ImageT, u64, u64, CompletionT) -> c_int,
    /// Ceph 15 (Octopus) and later; None before.
    pub rbd_aio_write_zeroes:
        Option<unsafe extern "C" fn(ImageT, u64, usize, CompletionT, c_int, c_int) -> c_int>,
}

// The fields are plain function pointers into a library that is never unloaded (the
// handle is leaked).
// SAFETY: librados/librbd are thread-safe for the calls made through them.
unsafe impl Send for Lib {}
// SAFETY: as for Send: nothing in Lib is mutable.
unsafe impl Sync for Lib {}

static LIB: OnceLock<Result<Lib, String>> = OnceLock::new();

/// librbd, loaded once per process (the first `rbd:` namespace loads it, before the
/// sandbox starts). The error says which library could not be loaded and how to
/// point at one.
pub fn lib() -> Result<&'static Lib, String> {
    LIB.get_or_init(load).as_ref().map_err(Clone::clone)
}

/// Whether librbd is already loaded (so an `rbd:` namespace can be added later
/// without loading code, which the sandbox forbids).
pub fn loaded() -> bool {
    LIB.get().is_some_and(Result::is_ok)
}

fn dlerror() -> String {
    // dlerror returns NULL or a NUL-terminated string owned by the loader, valid
    // until the next dl* call on this thread.
    // SAFETY: no arguments; the string is copied at once, below.
    let p = unsafe { libc::dlerror() };
    if p.is_null() {
        "unknown error".into()
    } else {
        // SAFETY: non-NULL and NUL-terminated (above).
        unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
    }
}

fn load() -> Result<Lib, String> {
    let path = std::env::var(LIBRBD_ENV).unwrap_or_else(|_| LIBRBD_DEFAULT.into());
    let c = CString::new(path.clone()).map_err(|_| format!("{LIBRBD_ENV} holds a NUL byte"))?;
    // Loading runs the library's initialisers, which is what librbd expects of any
    // process that links it.
    // SAFETY: `c` is a valid NUL-terminated path.
    let h = unsafe { libc::dlopen(c.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL) };
    if h.is_null() {
        return Err(format!(
            "cannot load {path} ({}): install librbd1 (Debian, Ubuntu) or librbd (Fedora), or set \
             {LIBRBD_ENV} to the library's path",
            dlerror()
        ));
    }
    // Resolves `name` in librbd and its dependencies (librados) as a function
    // pointer of type T. The handle is never closed, so the pointers stay valid.
    fn sym<T: Copy>(h: *mut c_void, name: &str) -> Result<T, String> {
        assert_eq!(std::mem::size_of::<T>(), std::mem::size_of::<*mut c_void>());
        let c = CString::new(name).expect("symbol names have no NUL");
        // SAFETY: `h` is a live handle from dlopen and `c` a NUL-terminated name.
        let p = unsafe { libc::dlsym(h, c.as_ptr()) };
        if p.is_null() {
            return Err(format!("librbd has no {name} ({}): Ceph 15 or later is needed", dlerror()));
        }
        // T is one of the function pointer types above, pointer-sized (checked).
        // SAFETY: the symbol is the function the header declares with T's signature.
        Ok(unsafe { std::mem::transmute_copy::<*mut c_void, T>(&p) })
    }
    let version: unsafe extern "C" fn(*mut c_int, *mut c_int, *mut c_int) = sym(h, "rbd_version")?;
    let (mut a, mut b, mut e) = (0, 0, 0);
    // SAFETY: three valid out-pointers to c_int.
    unsafe { version(&mut a, &mut b, &mut e) };
    Ok(Lib {
        path,
        version: format!("{a}.{b}.{e}"),
        rados_create: sym(h, "rados_create")?,
        rados_conf_read_file: sym(h, "rados_conf_read_file")?,
        rados_conf_set: sym(h, "rados_conf_set")?,
        rados_conf_get: sym(h, "rados_conf_get")?,
        rados_conf_parse_env: sym(h, "rados_conf_parse_env")?,
        rados_connect: sym(h, "rados_connect")?,
        rados_shutdown: sym(h, "rados_shutdown")?,
        rados_ioctx_create: sym(h, "rados_ioctx_create")?,
        rados_ioctx_destroy: sym(h, "rados_ioctx_destroy")?,
        rados_ioctx_set_namespace: sym(h, "rados_ioctx_set_namespace")?,
        rbd_open: sym(h, "rbd_open")?,
        rbd_close: sym(h, "rbd_close")?,
        rbd_get_size: sym(h, "rbd_get_size")?,
        rbd_resize: sym(h, "rbd_resize")?,
        rbd_aio_create_completion: sym(h, "rbd_aio_create_completion")?,
        rbd_aio_get_return_value: sym(h, "rbd_aio_get_return_value")?,
        rbd_aio_release: sym(h, "rbd_aio_release")?,
        rbd_aio_read: sym(h, "rbd_aio_read")?,
        rbd_aio_write: sym(h, "rbd_aio_write")?,
        rbd_aio_flush: sym(h, "rbd_aio_flush")?,
        rbd_aio_discard: sym(h, "rbd_aio_discard")?,
        rbd_aio_write_zeroes: sym(h, "rbd_aio_write_zeroes").ok(),
    })
}

/// A negative errno from librados/librbd as an io::Error.
pub fn errno(ret: i64) -> std::io::Error {
    std::io::Error::from_raw_os_error(ret.unsigned_abs().min(i32::MAX as u64) as i32)
}
