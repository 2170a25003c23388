//! Guest memory moved the way a VMM moves it to another host during a live
//! migration: logging on (the source server's DMA log for what the device writes,
//! vfio-user `DMA_LOGGING_START` / `REPORT` / `STOP`; this process's own log, as
//! KVM's for vCPUs, for what the driver writes), a full copy while everything runs,
//! and, once the queues are paused and the device stopped, the pages either log
//! reports written since.
//!
//! Here both servers share one host's memory, so the copy is not needed to run on;
//! it is made to check the logs: with nothing writing any more, every difference
//! between the copy and the memory is a write a log missed, and the migration fails
//! naming it.

use std::io;
use std::os::fd::{AsFd, OwnedFd};
use std::sync::Arc;

use guest_mem::Mapping;

use vfio_user::client::{Client, ClientError};
use vfio_user::proto::{
    DEVICE_FEATURE_DMA_LOGGING_REPORT, DEVICE_FEATURE_DMA_LOGGING_START, DEVICE_FEATURE_DMA_LOGGING_STOP,
    DEVICE_FEATURE_GET, DEVICE_FEATURE_PROBE, DEVICE_FEATURE_SET,
};
use vfio_user::Command;

/// The unit we ask the log in.
pub const PAGE: u64 = 4096;
/// Bytes of guest memory one report covers (a 256 KiB bitmap).
const REPORT_SPAN: u64 = PAGE * 8 * (256 << 10);

fn feature(flags: u32, data: &[u8], reply_room: usize) -> Vec<u8> {
    let mut v = ((8 + data.len() + reply_room) as u32).to_le_bytes().to_vec();
    v.extend_from_slice(&flags.to_le_bytes());
    v.extend_from_slice(data);
    v
}

fn err(e: ClientError) -> io::Error {
    io::Error::other(e)
}

/// Whether the server logs DMA (PROBE of START with SET).
pub fn offered(c: &mut Client) -> bool {
    c.request(
        Command::DeviceFeature,
        &[&feature(DEVICE_FEATURE_PROBE | DEVICE_FEATURE_SET | DEVICE_FEATURE_DMA_LOGGING_START, &[], 0)],
        &[],
    )
    .is_ok()
}

/// DMA_LOGGING_START of everything, at [`PAGE`].
pub fn start(c: &mut Client) -> io::Result<()> {
    let mut d = PAGE.to_le_bytes().to_vec();
    d.extend_from_slice(&0u32.to_le_bytes()); // no ranges: log everything
    d.extend_from_slice(&0u32.to_le_bytes());
    c.request(
        Command::DeviceFeature,
        &[&feature(DEVICE_FEATURE_SET | DEVICE_FEATURE_DMA_LOGGING_START, &d, 0)],
        &[],
    )
    .map_err(err)?;
    Ok(())
}

pub fn stop(c: &mut Client) -> io::Result<()> {
    c.request(
        Command::DeviceFeature,
        &[&feature(DEVICE_FEATURE_SET | DEVICE_FEATURE_DMA_LOGGING_STOP, &[], 0)],
        &[],
    )
    .map_err(err)?;
    Ok(())
}

/// The offsets (from `iova`) of the pages of `[iova, iova + len)` written since the
/// last report, in pieces the server's replies can carry.
pub fn report(c: &mut Client, iova: u64, len: u64, out: &mut Vec<u64>) -> io::Result<()> {
    let mut at = 0;
    while at < len {
        let n = (len - at).min(REPORT_SPAN);
        let mut d = (iova + at).to_le_bytes().to_vec();
        d.extend_from_slice(&n.to_le_bytes());
        d.extend_from_slice(&PAGE.to_le_bytes());
        let words = n.div_ceil(PAGE).div_ceil(64) as usize;
        let r = c
            .request(
                Command::DeviceFeature,
                &[&feature(DEVICE_FEATURE_GET | DEVICE_FEATURE_DMA_LOGGING_REPORT, &d, words * 8)],
                &[],
            )
            .map_err(err)?;
        let bitmap = r
            .payload
            .get(8 + 24..8 + 24 + words * 8)
            .ok_or_else(|| io::Error::other("short DMA_LOGGING_REPORT reply"))?;
        for (w, b) in bitmap.chunks_exact(8).enumerate() {
            let mut bits = u64::from_le_bytes(b.try_into().expect("8"));
            while bits != 0 {
                let i = w as u64 * 64 + bits.trailing_zeros() as u64;
                out.push(at + i * PAGE);
                bits &= bits - 1;
            }
        }
        at += n;
    }
    Ok(())
}

/// What a migration's memory copy did.
#[derive(Clone, Copy, Debug, Default)]
pub struct CopyReport {
    /// Bytes of the full copy, made while everything ran.
    pub full_bytes: u64,
    /// Pages copied again because the server's DMA log reported them.
    pub device_pages: u64,
    /// Pages copied again because this process's log reported them.
    pub cpu_pages: u64,
    /// Time spent comparing the copy with the memory (not part of the downtime a
    /// real migration has).
    pub check: std::time::Duration,
}

/// A copy of the client's DMA memory (`(iova, size, fd, offset)` per region), as the
/// destination host would hold it.
#[derive(Debug)]
pub struct GuestCopy {
    regions: Vec<(u64, Vec<u8>)>,
    /// This process's own mappings of the regions it allocated, by IOVA, logging.
    local: Vec<(u64, Arc<Mapping>)>,
    pub report: CopyReport,
}

fn read_region(fd: &OwnedFd, off: u64, buf: &mut [u8]) -> io::Result<()> {
    let mut done = 0;
    while done < buf.len() {
        let n = rustix::io::pread(fd.as_fd(), &mut buf[done..], off + done as u64)?;
        if n == 0 {
            return Err(io::Error::other("DMA memory shorter than its mapping"));
        }
        done += n;
    }
    Ok(())
}

impl GuestCopy {
    /// Logging on in `local` (the server's must be on already), then the full copy.
    pub fn start(maps: &[(u64, u64, OwnedFd, u64)], local: Vec<(u64, Arc<Mapping>)>) -> io::Result<Self> {
        for (_, m) in &local {
            m.start_dirty_log().map_err(io::Error::other)?;
        }
        let mut regions = Vec::with_capacity(maps.len());
        let mut full_bytes = 0;
        for (iova, size, fd, off) in maps {
            let mut b = vec![0u8; *size as usize];
            read_region(fd, *off, &mut b)?;
            regions.push((*iova, b));
            full_bytes += size;
        }
        Ok(GuestCopy { regions, local, report: CopyReport { full_bytes, ..Default::default() } })
    }

    /// Once nothing writes any more: copies again what both logs report, stops
    /// them, and compares the copy with the memory. Fails naming the first page a
    /// log missed.
    pub fn finish(&mut self, c: &mut Client, maps: &[(u64, u64, OwnedFd, u64)]) -> io::Result<()> {
        let mut pages = Vec::new();
        for ((iova, size, fd, off), (_, copy)) in maps.iter().zip(&mut self.regions) {
            pages.clear();
            report(c, *iova, *size, &mut pages)?;
            self.report.device_pages += pages.len() as u64;
            if let Some((_, m)) = self.local.iter().find(|(a, _)| a == iova) {
                let before = pages.len();
                m.take_dirty(0, m.len(), |p| pages.push(p));
                self.report.cpu_pages += (pages.len() - before) as u64;
            }
            for &p in &pages {
                let end = (p + PAGE).min(*size);
                read_region(fd, off + p, &mut copy[p as usize..end as usize])?;
            }
        }
        self.stop_local();
        let t = std::time::Instant::now();
        let diff = self.differences(maps)?;
        self.report.check = t.elapsed();
        match diff.first() {
            None => Ok(()),
            Some(first) => Err(io::Error::other(format!(
                "{} page(s) were written after the full copy and reported by neither the server's DMA log \
                 nor this process's (first at IOVA {first:#x})",
                diff.len()
            ))),
        }
    }

    /// Stops this process's log (the server's is the caller's).
    pub fn stop_local(&self) {
        for (_, m) in &self.local {
            m.stop_dirty_log();
        }
    }

    /// The pages where the copy and the memory differ, as IOVAs.
    fn differences(&self, maps: &[(u64, u64, OwnedFd, u64)]) -> io::Result<Vec<u64>> {
        let mut diff = Vec::new();
        let mut now = Vec::new();
        for ((iova, size, fd, off), (_, copy)) in maps.iter().zip(&self.regions) {
            now.resize(*size as usize, 0);
            read_region(fd, *off, &mut now)?;
            for (i, (a, b)) in copy.chunks(PAGE as usize).zip(now.chunks(PAGE as usize)).enumerate() {
                if a != b {
                    diff.push(iova + i as u64 * PAGE);
                }
            }
        }
        Ok(diff)
    }
}

impl Drop for GuestCopy {
    fn drop(&mut self) {
        self.stop_local();
    }
}
