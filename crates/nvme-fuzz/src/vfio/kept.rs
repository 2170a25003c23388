//! A socket session under a keeper: the device journals to a thread that takes
//! and drops each entry, and its client's connection keeps what it receives in
//! memory a keeper would hold (`vfio_user::rx`). Checked after a session that ended
//! with the client's hang-up: that memory holds nothing the server read whole and
//! did not answer (only the start of a message the client never finished).

use std::io::Read;
use std::os::linux::net::SocketAddrExt;
use std::os::unix::net::{SocketAddr, UnixListener, UnixStream};
use std::sync::atomic::{AtomicU64, Ordering};

use vfio_user::proto::{Header, HEADER_SIZE};
use vfio_user_server::keeper::Journal;
use vfio_user_server::Device;
use zerocopy::FromBytes;

/// The keeper's end of the journal, read and dropped on a thread (its descriptors
/// closed as they come) until the device's end closes.
pub(super) struct Keeper {
    reader: Option<std::thread::JoinHandle<()>>,
}

impl Keeper {
    /// Has `dev` journal to a new keeper thread, its connections keeping what they
    /// receive.
    pub(super) fn attach(dev: &mut Device) -> Keeper {
        static N: AtomicU64 = AtomicU64::new(0);
        let name = format!("nvme-fuzz-keeper-{}-{}", std::process::id(), N.fetch_add(1, Ordering::Relaxed));
        let listener =
            UnixListener::bind_addr(&SocketAddr::from_abstract_name(name.as_bytes()).expect("name"))
                .expect("the keeper's listener");
        let (ours, theirs) = UnixStream::pair().expect("socketpair");
        let reader = std::thread::Builder::new()
            .name("fuzz-keeper".into())
            .spawn(move || {
                let mut theirs = theirs;
                let mut buf = vec![0u8; 64 << 10];
                while matches!(theirs.read(&mut buf), Ok(n) if n > 0) {}
            })
            .expect("spawn the keeper thread");
        dev.prepare_keeping().expect("the receive memory");
        dev.keep_with(Journal::new(ours, &listener).expect("a journal"));
        Keeper { reader: Some(reader) }
    }

    /// After a session that ended with the client's hang-up: what the memory holds
    /// unanswered is at most the start of one message.
    pub(super) fn check(dev: &Device) {
        let fd = dev.kept_memory().expect("kept memory");
        let (_, left) = vfio_user::rx::unanswered(fd, 0).expect("the kept memory's header adds up");
        if let Ok((h, _)) = Header::read_from_prefix(&left) {
            let size = h.size.get() as usize;
            assert!(
                size > left.len() || size < HEADER_SIZE,
                "the session ended with a whole message of {size} bytes kept unanswered ({} bytes kept)",
                left.len()
            );
        }
    }

    /// Waits for the keeper thread (the device, and so its journal, dropped first).
    pub(super) fn join(mut self) {
        if let Some(r) = self.reader.take() {
            let _ = r.join();
        }
    }
}
