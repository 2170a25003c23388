//! `vnvme perf`'s arguments, and the target they name.

use std::path::PathBuf;
use std::time::Duration;

use nvme_ctrl::PollMode;
use nvme_driver::CompletionMode;

use super::knobs::{Doorbells, Workload};
use crate::nsspec::NsSpec;

/// Where the controller is.
#[derive(Debug, Clone)]
pub enum Target {
    /// A vfio-user server on this socket.
    Socket(PathBuf),
    /// A controller in this process with these namespaces, workers and polling.
    InProcess { namespaces: Vec<NsSpec>, workers: usize, poll: PollMode },
}

/// The arguments that choose the [`Target`]: a server's socket, or a controller in
/// this process and its knobs.
#[derive(Debug, Clone, clap::Args)]
pub struct TargetArgs {
    /// UNIX socket of the vfio-user server.
    #[arg(long, required_unless_present = "in_process", conflicts_with = "in_process")]
    pub socket: Option<PathBuf>,
    /// Run the controller in this process (the test kit's in-process transport):
    /// doorbells are function calls (--doorbells trapped or shadow).
    #[arg(long)]
    pub in_process: bool,
    /// --in-process namespaces, as `vnvme serve --ns` takes them [default:
    /// null:64G:lba=4096].
    #[arg(long = "in-process-ns")]
    pub in_process_ns: Vec<NsSpec>,
    /// --in-process: controller I/O worker threads, as `vnvme serve --workers`
    /// [default: 1, whatever the host].
    #[arg(long)]
    pub workers: Option<usize>,
    /// --in-process: how idle workers wait, as `vnvme serve --poll` [default:
    /// adaptive].
    #[arg(long)]
    pub poll: Option<PollMode>,
}

impl TargetArgs {
    /// The target these arguments name, with the in-process defaults filled in;
    /// in-process knobs without `--in-process` are an error.
    pub fn resolve(&self) -> Result<Target, String> {
        let in_process_knobs =
            self.workers.is_some() || self.poll.is_some() || !self.in_process_ns.is_empty();
        match &self.socket {
            Some(_) if in_process_knobs => {
                Err("--workers, --poll and --in-process-ns need --in-process".into())
            }
            Some(s) => Ok(Target::Socket(s.clone())),
            None if !self.in_process => Err("perf needs --socket or --in-process".into()),
            None if self.workers.unwrap_or(1) > 64 => Err("--in-process: --workers must be 0..=64".into()),
            None => Ok(Target::InProcess {
                namespaces: if self.in_process_ns.is_empty() {
                    vec!["null:64G:lba=4096".parse().expect("valid default namespace")]
                } else {
                    self.in_process_ns.clone()
                },
                workers: self.workers.unwrap_or(1),
                poll: self.poll.unwrap_or_default(),
            }),
        }
    }
}

/// `vnvme perf`'s arguments.
#[derive(Debug, Clone, clap::Args)]
pub struct PerfArgs {
    #[command(flatten)]
    pub target: TargetArgs,
    /// randread, randwrite, read, write or randrw.
    #[arg(long, default_value = "randread")]
    pub rw: Workload,
    /// Read percentage for randrw.
    #[arg(long, default_value_t = 70)]
    pub mix: u8,
    /// Check the data: every LBA written carries a header (its LBA and the block's
    /// generation) and a fill derived from both; every read of a block this run
    /// wrote is checked against what was last written there, and at the end every
    /// block written is read back and checked. A block with a command in flight is
    /// neither read nor written again meanwhile. Any mismatch is an error.
    #[arg(long)]
    pub verify: bool,
    /// Block size per I/O (e.g. 4k, 128k).
    #[arg(long, default_value = "4k", value_parser = crate::nsspec::parse_size)]
    pub bs: u64,
    /// Commands in flight per queue.
    #[arg(long, default_value_t = 16)]
    pub qd: u16,
    /// I/O queue pairs, one thread each.
    #[arg(long, default_value_t = 1)]
    pub queues: u16,
    /// How long to run (e.g. 5s, 500ms).
    #[arg(long, default_value = "5s", value_parser = super::knobs::parse_duration)]
    pub runtime: Duration,
    /// How long a command may take before perf gives up on it and reports an error.
    /// Longer than a server's namespace timeout (`timeout=`, 30 s by default), so the
    /// error completion that timeout sends is what perf reports.
    #[arg(long, default_value = "60s", value_parser = super::knobs::parse_duration)]
    pub timeout: Duration,
    /// The namespace to load, by its NSID (1 is the first `--ns` of `vnvme serve`).
    /// `--ns` is an older name for it.
    #[arg(long = "nsid", alias = "ns", default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..))]
    pub nsid: u32,
    /// auto (shadow doorbells if the controller offers them, else the doorbell
    /// page the server maps, as SPDK's target does, else trapped), trapped, shadow
    /// (EventIdx), sync, eventfd or mapped.
    #[arg(long, default_value = "auto")]
    pub doorbells: Doorbells,
    /// poll (spin on the CQ) or irq (sleep on the MSI-X eventfd).
    #[arg(long, default_value = "poll", value_parser = super::knobs::parse_completion)]
    pub completion: CompletionMode,
    /// Print the results and every knob as JSON (for scripts) instead of the lines
    /// for people, which go to stderr; `--json FILE` writes the JSON to FILE and
    /// keeps the lines on stdout.
    #[arg(long, value_name = "FILE", num_args = 0..=1, default_missing_value = "-")]
    pub json: Option<PathBuf>,
    /// The server's --stats-file, read before and after the run.
    #[arg(long)]
    pub server_stats: Option<PathBuf>,
    /// The server's process ID: report its CPU time (/proc/PID/stat utime+stime)
    /// over the run, per I/O.
    #[arg(long)]
    pub server_pid: Option<u32>,
    /// Live-migrate the device (vfio-user migration v2) to the server at this socket
    /// while the load runs, then back to --socket, and so on, every
    /// --migrate-every: this program acts as the VMM (queues pause meanwhile, as
    /// vCPUs would, with their commands in flight). Guest memory is also copied
    /// through the source's DMA log, as to another host, and the copy checked
    /// against the memory (a page the log missed fails the migration). Both servers
    /// must serve the same storage (e.g. the same file). Trapped or shadow doorbells.
    #[arg(long, value_name = "SOCKET")]
    pub migrate_to: Option<PathBuf>,
    /// How often --migrate-to migrates.
    #[arg(long, default_value = "1s", value_parser = super::knobs::parse_duration)]
    pub migrate_every: Duration,
}
