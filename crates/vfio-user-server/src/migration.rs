//! vfio-user live migration, server side (docs/interop/vfio-user.rst, migration
//! v2): `VFIO_USER_DEVICE_FEATURE` with `MIGRATION` (we offer STOP_COPY) and
//! `MIG_DEVICE_STATE`, and the migration data stream of `VFIO_USER_MIG_DATA_READ`
//! / `_WRITE`.
//!
//! The states and what each arc does here:
//! - RUNNING -> STOP: the controller is quiesced (`nvme_ctrl::state`: it stops
//!   fetching and waits, bounded, for commands in flight). Past the bound the arc
//!   fails with EBUSY and the device keeps running.
//! - STOP -> STOP_COPY: the device's state is serialized ([`MigrationData`],
//!   versioned JSON: config space, MSI-X table, the controller's state) for the
//!   client to read. STOP_COPY -> STOP ends the read.
//! - STOP -> RESUMING: the controller is reset to its power-on state (a new
//!   device for the incoming state); the client writes the stream. RESUMING ->
//!   STOP restores it, quiesced; invalid data fails the arc with EINVAL and the
//!   device goes to ERROR (DEVICE_RESET brings it back to RUNNING).
//! - STOP -> RUNNING: the controller resumes.
//!   Other transitions take the shortest path through STOP. PRE_COPY is not
//!   offered: the state is small (tens of KiB), STOP_COPY moves it at once.
//!
//! DMA logging (DEVICE_FEATURE 6-8) tells a client that copies guest memory to
//! another host which pages the device wrote: completions, read data, EventIdx,
//! whoever wrote them (this process, the kernel for an io_uring read, a
//! downstream device), each marked once the write is over (`guest_mem`'s dirty
//! log, and the controller when a backend request ends). We log every region at
//! 4 KiB and report in whatever power-of-two unit the client asks; a report
//! clears what it reports. Logging goes on across a device reset (a guest that
//! reboots mid-migration still dirties memory) and stops when the client leaves.
//!
//! A client that leaves, or resets the device, puts it back to RUNNING.

use std::time::Duration;

use serde::{Deserialize, Serialize};
use tracing::{info, warn};
use vfio_user::proto::{
    DEVICE_FEATURE_DMA_LOGGING_REPORT, DEVICE_FEATURE_DMA_LOGGING_START, DEVICE_FEATURE_DMA_LOGGING_STOP,
    DEVICE_FEATURE_GET, DEVICE_FEATURE_MASK, DEVICE_FEATURE_MIGRATION, DEVICE_FEATURE_MIG_DEVICE_STATE,
    DEVICE_FEATURE_PROBE, DEVICE_FEATURE_SET, MIGRATION_STOP_COPY,
};
use vfio_user::Message;
use zerocopy::little_endian::{U32, U64};
use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout};

use crate::device::{Device, DeviceError, Reply};
use crate::transfer::{hex, unhex};
pub use crate::transfer::{MigState, MigrationState};

/// Version of [`MigrationData`] this build writes and reads.
pub const MIGRATION_VERSION: u32 = 1;
/// How long RUNNING -> STOP waits for commands in flight.
pub const STOP_LIMIT: Duration = Duration::from_secs(3);
/// The most migration data a client may write (the real stream is tens of KiB).
pub const MAX_STREAM: usize = 16 << 20;

/// Largest bitmap one DMA_LOGGING_REPORT returns (it must fit a reply): 1 MiB less
/// room for the headers covers 32 GiB at 4 KiB; a client asks for more in pieces.
const MAX_BITMAP: u64 = crate::device::MAX_XFER as u64 - 64;

/// The device as migrated: what guest and client can observe that is not in
/// guest memory, nor in descriptors the client sets up again (DMA maps,
/// interrupt eventfds) on the destination.
#[derive(Debug, Serialize, Deserialize)]
pub struct MigrationData {
    pub version: u32,
    /// PCI config space, hex.
    pub config: String,
    /// The MSI-X table and PBA, hex.
    pub bar4: String,
    pub msix_enabled: bool,
    /// The doorbell page's contents (mapped doorbells), hex.
    pub doorbell_page: Option<String>,
    pub controller: nvme_ctrl::ControllerState,
}

/// `struct vfio_user_device_feature` (the fixed part).
#[derive(Clone, Copy, Debug, FromBytes, IntoBytes, Immutable, KnownLayout)]
#[repr(C)]
struct FeatureHeader {
    argsz: U32,
    flags: U32,
}

/// `struct vfio_user_mig_data` (the fixed part).
#[derive(Clone, Copy, Debug, FromBytes, IntoBytes, Immutable, KnownLayout)]
#[repr(C)]
struct MigData {
    argsz: U32,
    size: U32,
}

/// `struct vfio_user_device_feature_dma_logging_control` (ranges follow).
#[derive(Clone, Copy, Debug, FromBytes, IntoBytes, Immutable, KnownLayout)]
#[repr(C)]
struct LoggingControl {
    page_size: U64,
    num_ranges: U32,
    reserved: U32,
}

/// `struct vfio_user_device_feature_dma_logging_report` (the bitmap follows in
/// the reply).
#[derive(Clone, Copy, Debug, FromBytes, IntoBytes, Immutable, KnownLayout)]
#[repr(C)]
struct LoggingReport {
    iova: U64,
    length: U64,
    page_size: U64,
}

/// A fixed-size structure at the start of `data`.
fn parse<T: FromBytes>(data: &[u8]) -> Option<T> {
    T::read_from_prefix(data).ok().map(|(t, _)| t)
}

fn invalid(what: impl Into<String>) -> DeviceError {
    DeviceError::Invalid(what.into())
}

impl Device {
    /// VFIO_USER_DEVICE_FEATURE.
    pub(crate) fn device_feature(&mut self, msg: &Message) -> Result<Reply, DeviceError> {
        let h: FeatureHeader = msg.payload_as().ok_or_else(|| invalid("DEVICE_FEATURE: short payload"))?;
        let flags = h.flags.get();
        let feature = flags & DEVICE_FEATURE_MASK;
        let (get, set, probe) = (
            flags & DEVICE_FEATURE_GET != 0,
            flags & DEVICE_FEATURE_SET != 0,
            flags & DEVICE_FEATURE_PROBE != 0,
        );
        if get && set && !probe {
            return Err(invalid("DEVICE_FEATURE: GET and SET together without PROBE"));
        }
        let data = &msg.payload[size_of::<FeatureHeader>()..];
        let supported = match feature {
            DEVICE_FEATURE_MIGRATION | DEVICE_FEATURE_DMA_LOGGING_REPORT => !set,
            DEVICE_FEATURE_MIG_DEVICE_STATE => true,
            DEVICE_FEATURE_DMA_LOGGING_START | DEVICE_FEATURE_DMA_LOGGING_STOP => !get,
            _ => false,
        };
        if !supported {
            return Err(DeviceError::Unsupported(msg.header.command.get()));
        }
        if probe {
            return Ok(Reply::Ok(msg.payload.clone(), Vec::new()));
        }
        let reply = |body: &[u8]| {
            let mut v = FeatureHeader { argsz: U32::new((8 + body.len()) as u32), flags: h.flags }
                .as_bytes()
                .to_vec();
            v.extend_from_slice(body);
            Reply::Ok(v, Vec::new())
        };
        match (feature, get) {
            (DEVICE_FEATURE_MIGRATION, true) => Ok(reply(&MIGRATION_STOP_COPY.to_le_bytes())),
            (DEVICE_FEATURE_MIG_DEVICE_STATE, true) => {
                let mut b = (self.mig.state as u32).to_le_bytes().to_vec();
                b.extend_from_slice(&(-1i32).to_le_bytes());
                Ok(reply(&b))
            }
            (DEVICE_FEATURE_MIG_DEVICE_STATE, false) if set => {
                let want = data
                    .get(..4)
                    .map(|b| u32::from_le_bytes(b.try_into().expect("4 bytes")))
                    .ok_or_else(|| invalid("MIG_DEVICE_STATE: no device_state"))?;
                let want = MigState::from_u32(want)
                    .filter(|s| *s != MigState::Error)
                    .ok_or_else(|| invalid(format!("MIG_DEVICE_STATE: no state {want} (or not settable)")))?;
                self.migrate_to(want)?;
                let mut b = (self.mig.state as u32).to_le_bytes().to_vec();
                b.extend_from_slice(&(-1i32).to_le_bytes());
                Ok(reply(&b))
            }
            (DEVICE_FEATURE_DMA_LOGGING_START, false) if set => {
                let c: LoggingControl =
                    parse(data).ok_or_else(|| invalid("DMA_LOGGING_START: short payload"))?;
                let page = c.page_size.get();
                if !page.is_power_of_two() {
                    return Err(invalid(format!(
                        "DMA_LOGGING_START: page size {page} is not a power of two"
                    )));
                }
                let n = c.num_ranges.get() as usize;
                let ranges = data[size_of::<LoggingControl>()..]
                    .get(..n.saturating_mul(16))
                    .ok_or_else(|| invalid(format!("DMA_LOGGING_START: {n} ranges announced, fewer sent")))?;
                for r in ranges.chunks_exact(16) {
                    let iova = u64::from_le_bytes(r[..8].try_into().expect("8"));
                    let len = u64::from_le_bytes(r[8..].try_into().expect("8"));
                    if len == 0 || iova.checked_add(len).is_none() {
                        return Err(invalid(format!(
                            "DMA_LOGGING_START: range {iova:#x}+{len:#x} is invalid"
                        )));
                    }
                }
                // Every region is logged at 4 KiB (ranges are an optimisation the
                // protocol leaves to us); reports come in any unit asked, so the hint
                // is kept, or raised to our granularity.
                let chosen = page.max(guest_mem::DIRTY_PAGE);
                self.dma.start_logging()?;
                info!(page_size = chosen, ranges = n, "DMA logging started");
                let mut b = data[..size_of::<LoggingControl>() + ranges.len()].to_vec();
                b[..8].copy_from_slice(&chosen.to_le_bytes());
                Ok(reply(&b))
            }
            (DEVICE_FEATURE_DMA_LOGGING_STOP, false) if set => {
                if self.dma.logging() {
                    self.dma.stop_logging();
                    info!("DMA logging stopped");
                }
                Ok(reply(data))
            }
            (DEVICE_FEATURE_DMA_LOGGING_REPORT, true) => {
                let r: LoggingReport =
                    parse(data).ok_or_else(|| invalid("DMA_LOGGING_REPORT: short payload"))?;
                if !self.dma.logging() {
                    return Err(invalid("DMA_LOGGING_REPORT: logging is not started"));
                }
                let (iova, len, page) = (r.iova.get(), r.length.get(), r.page_size.get());
                if !page.is_power_of_two() || len == 0 || iova.checked_add(len).is_none() {
                    return Err(invalid(format!(
                        "DMA_LOGGING_REPORT: {iova:#x}+{len:#x} in units of {page} is invalid"
                    )));
                }
                let bytes = len.div_ceil(page).div_ceil(64) * 8;
                if bytes > MAX_BITMAP {
                    return Err(DeviceError::NoSpace(format!(
                        "DMA_LOGGING_REPORT: a bitmap of {bytes} bytes (at most {MAX_BITMAP}; ask in pieces)"
                    )));
                }
                let want = (size_of::<FeatureHeader>() + size_of::<LoggingReport>()) as u64 + bytes;
                if u64::from(h.argsz.get()) < want {
                    return Err(invalid(format!(
                        "DMA_LOGGING_REPORT: argsz {} is less than the {want} bytes of the reply",
                        h.argsz.get()
                    )));
                }
                let bitmap = self.dma.report(iova, len, page)?;
                let mut b = r.as_bytes().to_vec();
                for w in bitmap {
                    b.extend_from_slice(&w.to_le_bytes());
                }
                Ok(reply(&b))
            }
            _ => Err(invalid("DEVICE_FEATURE: give GET, SET or PROBE")),
        }
    }

    /// Moves to `want` through STOP (the only interior state this device needs).
    fn migrate_to(&mut self, want: MigState) -> Result<(), DeviceError> {
        use MigState::*;
        if self.mig.state == Error {
            return Err(invalid("the device is in the ERROR migration state: reset it"));
        }
        let from = self.mig.state;
        if from == want {
            return Ok(());
        }
        if from != Stop && want != Stop {
            self.arc(Stop)?;
        }
        self.arc(want)?;
        info!(%from, to = %want, "migration state changed");
        Ok(())
    }

    /// One direct arc from the current state.
    fn arc(&mut self, to: MigState) -> Result<(), DeviceError> {
        use MigState::*;
        match (self.mig.state, to) {
            (Running, Stop) => {
                self.ctrl.quiesce(STOP_LIMIT).map_err(|e| DeviceError::Busy(format!("cannot stop: {e}")))?;
            }
            (Stop, Running) => self.ctrl.resume(),
            (Stop, StopCopy) => {
                let data = MigrationData {
                    version: MIGRATION_VERSION,
                    config: hex(self.config.bytes()),
                    bar4: hex(&self.bar4),
                    msix_enabled: self.config.msix_enabled(),
                    doorbell_page: self.page.as_ref().map(|p| {
                        let mut b = vec![0u8; crate::doorbells::DOORBELL_PAGE_LEN as usize];
                        let _ = p.mem.read(crate::doorbells::DOORBELL_PAGE, &mut b);
                        hex(&b)
                    }),
                    controller: self.ctrl.save_state(),
                };
                self.mig.out = serde_json::to_vec(&data).map_err(|e| invalid(e.to_string()))?;
                self.mig.read = 0;
            }
            (StopCopy, Stop) => {
                self.mig.out = Vec::new();
                self.mig.read = 0;
            }
            (Stop, Resuming) => {
                // A new device for the incoming state; stopped until it arrives.
                self.power_on();
                self.ctrl.quiesce(STOP_LIMIT).map_err(|e| DeviceError::Busy(e.to_string()))?;
                self.mig.inbuf = Vec::new();
            }
            (Resuming, Stop) => {
                let buf = std::mem::take(&mut self.mig.inbuf);
                if let Err(e) = self.load(&buf) {
                    warn!("migration data refused: {e}");
                    self.power_on();
                    self.mig.state = Error;
                    return Err(invalid(format!("migration data refused: {e}")));
                }
            }
            (from, to) => {
                return Err(invalid(format!("no migration arc {from:?} -> {to:?}")));
            }
        }
        self.mig.state = to;
        Ok(())
    }

    /// RESUMING -> STOP: the stream into this (power-on, stopped) device.
    fn load(&mut self, buf: &[u8]) -> Result<(), String> {
        let mut d: MigrationData =
            serde_json::from_slice(buf).map_err(|e| format!("not migration data: {e}"))?;
        if d.version != MIGRATION_VERSION {
            return Err(format!(
                "migration data version {}, this build reads {MIGRATION_VERSION}",
                d.version
            ));
        }
        let config = unhex(&d.config).map_err(|e| e.to_string())?;
        let bar4 = unhex(&d.bar4).map_err(|e| e.to_string())?;
        if bar4.len() != self.bar4.len() {
            return Err(format!("MSI-X table of {} bytes, this device has {}", bar4.len(), self.bar4.len()));
        }
        self.config.check_restore(&config)?;
        let mut check = self.config.clone();
        check.restore(&config)?;
        if check.msix_enabled() != d.msix_enabled {
            return Err(
                "MSI-X enabled in the stream but not in its config space, or the other way round".into()
            );
        }
        let page = match (&d.doorbell_page, &self.page) {
            (Some(h), Some(_)) => Some(unhex(h).map_err(|e| e.to_string())?),
            _ => None,
        };
        if page.as_ref().is_some_and(|b| b.len() as u64 != crate::doorbells::DOORBELL_PAGE_LEN) {
            return Err("a doorbell page of the wrong size".into());
        }
        // The source's clock is not ours: keep the ages (since creation, since reset).
        let now = self.ctrl.clock_now_ns();
        let age = |t: u64| now.saturating_sub(d.controller.clock_ns.saturating_sub(t));
        d.controller.admin.created_ns = age(d.controller.admin.created_ns);
        d.controller.admin.reset_ns = age(d.controller.admin.reset_ns);
        d.controller.clock_ns = now;
        // Everything is checked; the controller's restore is all or nothing, and
        // what follows it cannot fail (a failure here is reset by the caller).
        if let (Some(b), Some(p)) = (page, &self.page) {
            p.mem.write(crate::doorbells::DOORBELL_PAGE, &b).map_err(|e| e.to_string())?;
        }
        self.ctrl.restore_state(&d.controller).map_err(|e| e.to_string())?;
        self.config.restore(&config)?;
        self.bar4 = bar4;
        self.irqs.set_msix_enabled(d.msix_enabled);
        Ok(())
    }

    /// VFIO_USER_MIG_DATA_READ.
    pub(crate) fn mig_data_read(&mut self, msg: &Message) -> Result<Reply, DeviceError> {
        let r: MigData = msg.payload_as().ok_or_else(|| invalid("MIG_DATA_READ: short payload"))?;
        if self.mig.state != MigState::StopCopy {
            return Err(invalid(format!("MIG_DATA_READ in state {}", self.mig.state)));
        }
        let want = r.size.get() as usize;
        if want > crate::device::MAX_XFER as usize {
            return Err(invalid(format!(
                "MIG_DATA_READ of {want} bytes (at most {})",
                crate::device::MAX_XFER
            )));
        }
        let chunk = &self.mig.out[self.mig.read..][..want.min(self.mig.out.len() - self.mig.read)];
        let mut v = MigData { argsz: U32::new((8 + chunk.len()) as u32), size: U32::new(chunk.len() as u32) }
            .as_bytes()
            .to_vec();
        v.extend_from_slice(chunk);
        self.mig.read += chunk.len();
        Ok(Reply::Ok(v, Vec::new()))
    }

    /// VFIO_USER_MIG_DATA_WRITE.
    pub(crate) fn mig_data_write(&mut self, msg: &Message) -> Result<Reply, DeviceError> {
        let r: MigData = msg.payload_as().ok_or_else(|| invalid("MIG_DATA_WRITE: short payload"))?;
        if self.mig.state != MigState::Resuming {
            return Err(invalid(format!("MIG_DATA_WRITE in state {}", self.mig.state)));
        }
        let data = msg.payload[size_of::<MigData>()..]
            .get(..r.size.get() as usize)
            .ok_or_else(|| invalid("MIG_DATA_WRITE: payload shorter than size"))?;
        if self.mig.inbuf.len() + data.len() > MAX_STREAM {
            return Err(DeviceError::NoSpace(format!("migration data over {MAX_STREAM} bytes")));
        }
        self.mig.inbuf.extend_from_slice(data);
        Ok(Reply::Ok(Vec::new(), Vec::new()))
    }

    /// A reset or a client leaving: back to RUNNING, whatever the migration state.
    pub(crate) fn migration_reset(&mut self) {
        if self.mig.state != MigState::Running {
            info!(from = %self.mig.state, "migration state back to RUNNING (reset)");
            self.mig = MigrationState::default();
            self.ctrl.resume();
        }
    }
}
