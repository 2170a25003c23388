//! One request in flight: the steps it runs as one SQE at a time (read/write,
//! fsync, fallocate, discard command, chained like a punch then a preallocation),
//! the SQE of the current step, and what each completion means for it (retry,
//! resend the rest after a partial transfer, next step, EOF, done).

use io_uring::{opcode, squeue, types};

use super::buf::{advance, AlignedBuf, IoVec};
use super::limits::{FD_MAIN, MAX_RETRIES};
use super::sys;
use crate::BackendError;

/// One step of a request, one SQE at a time.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Step {
    Read,
    Write {
        flags: i32,
    },
    /// Writes zeroes from the shared zero buffer (Write Zeroes without fallocate).
    WriteZeroBufs,
    Fsync,
    /// `optional`: an EOPNOTSUPP answer is fine (the preallocation after a punch).
    Fallocate {
        mode: i32,
        offset: u64,
        len: u64,
        optional: bool,
    },
    DiscardCmd {
        offset: u64,
        len: u64,
    },
}

/// What the queue keeps for a request in flight, in its slot of the in-flight core
/// (`Requests<Run>`, whose `Pending` holds the tag, the range, the data and the guest
/// memory): the steps, and the bounce buffer. The vectors its SQEs transfer are the
/// queue's, by slot.
#[derive(Debug)]
pub(super) struct Run {
    step: Step,
    pub(super) next: Option<Step>,
    /// Fixed-file index.
    pub(super) fd: u32,
    /// Bytes moved so far by the current read/write step.
    pub(super) done: u64,
    /// The bounce buffer a misaligned transfer goes through (a read is copied out of
    /// it on success).
    pub(super) bounce: Option<AlignedBuf>,
    /// The vectors point into guest memory: the kernel moves the data there itself,
    /// and revoke cannot stop an SQE of it.
    pub(super) zero_copy: bool,
    retries: u8,
}

impl Run {
    /// What the run asks of the kernel for durability: (a write with RWF_DSYNC, an
    /// fdatasync).
    pub(super) fn durability(&self) -> (bool, bool) {
        let dsync = matches!(self.step, Step::Write { flags } if flags & libc::RWF_DSYNC != 0);
        (dsync, matches!(self.step, Step::Fsync))
    }

    pub(super) fn new(step: Step) -> Self {
        Run { step, next: None, fd: FD_MAIN, done: 0, bounce: None, zero_copy: false, retries: 0 }
    }

    /// The SQE of the current step of a request at device offset `offset`, in slot
    /// `idx` (its user data), transferring `iov`.
    pub(super) fn entry(&self, offset: u64, idx: usize, iov: &[IoVec]) -> squeue::Entry {
        let fd = types::Fixed(self.fd);
        let n = iov.len() as u32;
        let iov = iov.as_ptr().cast::<libc::iovec>();
        let off = offset + self.done;
        let e = match self.step {
            Step::Read => opcode::Readv::new(fd, iov, n).offset(off).build(),
            Step::Write { flags } => opcode::Writev::new(fd, iov, n).offset(off).rw_flags(flags).build(),
            Step::WriteZeroBufs => opcode::Writev::new(fd, iov, n).offset(off).build(),
            Step::Fsync => opcode::Fsync::new(fd).flags(types::FsyncFlags::DATASYNC).build(),
            Step::Fallocate { mode, offset, len, .. } => {
                opcode::Fallocate::new(fd, len).offset(offset).mode(mode).build()
            }
            Step::DiscardCmd { offset, len } => {
                let mut cmd = [0u8; 16];
                cmd[..8].copy_from_slice(&len.to_ne_bytes());
                opcode::UringCmd16::new(fd, sys::BLOCK_URING_CMD_DISCARD).addr(Some(offset)).cmd(cmd).build()
            }
        };
        e.user_data(idx as u64)
    }
}

/// What to do with a slot after a completion.
#[derive(Debug)]
pub(super) enum Outcome {
    /// Send the (next part of the) request again.
    Again,
    /// Point the vectors at zeroes for the rest, then send it again.
    MoreZeroes,
    /// A read found the end of the file before its end.
    Eof {
        done: u64,
        len: u64,
    },
    Done(Result<(), BackendError>),
}

impl Run {
    /// Takes in one completion result for a request of `len` bytes whose SQE
    /// transferred `iov` (advanced past what moved, after a partial transfer).
    pub(super) fn on_result(&mut self, len: u64, res: i32, iov: &mut Vec<IoVec>) -> Outcome {
        if res < 0 {
            let errno = -res;
            if matches!(errno, libc::EAGAIN | libc::EINTR) && self.retries < MAX_RETRIES {
                self.retries += 1;
                return Outcome::Again;
            }
            let optional = matches!(self.step, Step::Fallocate { optional: true, .. });
            if !(optional && errno == libc::EOPNOTSUPP) {
                return Outcome::Done(Err(BackendError::from_errno(errno)));
            }
        } else if matches!(self.step, Step::Read | Step::Write { .. } | Step::WriteZeroBufs) {
            let n = (res as u64).min(len - self.done);
            if n == 0 {
                let done = self.done;
                return match self.step {
                    Step::Read => Outcome::Eof { done, len },
                    _ => Outcome::Done(Err(BackendError::Short { done, len })),
                };
            }
            self.done += n;
            if self.done < len {
                // A partial transfer: send the rest.
                advance(iov, n as usize);
                return match (iov.is_empty(), self.step) {
                    (false, _) => Outcome::Again,
                    (true, Step::WriteZeroBufs) => Outcome::MoreZeroes,
                    (true, _) => Outcome::Done(Err(BackendError::Short { done: self.done, len })),
                };
            }
        }
        match self.next.take() {
            Some(next) => {
                self.step = next;
                self.done = 0;
                self.retries = 0;
                Outcome::Again
            }
            None => Outcome::Done(Ok(())),
        }
    }
}
