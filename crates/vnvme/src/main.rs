//! The vnvme command-line program.
#![forbid(unsafe_code)]

mod demo;
mod identify;
mod nsspec;
mod perf;
mod serve;

use clap::{Parser, Subcommand};

/// vnvme: a fast, correct emulated NVMe controller for virtual machines.
#[derive(Debug, Parser)]
#[command(version, about, long_about = None)]
struct Cli {
    /// Log filter (tracing EnvFilter syntax), e.g. "info" or "vnvme::guest=debug".
    #[arg(long, global = true, env = "VNVME_LOG", default_value = "warn")]
    log: String,
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Debug, Subcommand)]
enum Cmd {
    /// Serve a controller to a VMM over vfio-user (QEMU -device vfio-user-pci,
    /// Cloud Hypervisor --user-device).
    Serve {
        /// UNIX socket path to listen on (a stale socket file is replaced).
        #[arg(long)]
        socket: std::path::PathBuf,
        /// A namespace (repeat for several): ram:SIZE, null:SIZE, file:PATH[:SIZE] or nvme://...
        ///
        /// ram:SIZE          RAM, allocated on first write
        /// null:SIZE         reads return zeroes, writes are dropped
        /// file:PATH[:SIZE]  a regular file (created or extended to SIZE) or a block
        ///                   device; io_uring with O_DIRECT when the file system allows
        ///                   it, pread/pwrite on tmpfs and ramfs
        /// nvme:///path/to/vfio-user.sock?ns=1, nvme://0000:01:00.0?ns=1
        ///                   a namespace of another NVMe controller through the
        ///                   userspace driver; query options ns, queues (at least
        ///                   workers + 1), depth, doorbells (default: eventfd when
        ///                   offered, else trapped), poll, timeout
        ///
        /// Options after the kind, each as :NAME=VALUE:
        ///   lba=512|4096             LBA size (default 512, or the backend's block size)
        ///   direct=auto|on|off       file: O_DIRECT
        ///   engine=auto|uring|sync   file: io_uring or pread/pwrite
        ///   fault=OP/ERROR[/lba=START+COUNT][/after=N][/count=N]
        ///                            inject failures (repeatable); OP read, write, flush,
        ///                            discard or any; ERROR eio, enospc, short, gone, rofs
        ///
        /// Examples: ram:1G  file:disk.img:8G:lba=4096  ram:64M:fault=read/eio/lba=2048+8
        #[arg(long = "ns", default_value = "ram:1G", verbatim_doc_comment)]
        namespaces: Vec<nsspec::NsSpec>,
        /// I/O worker threads; each owns the queues assigned to it. 0: inline, the
        /// server's own thread runs every queue between messages (one thread hop less:
        /// the lowest latency at low queue depth on small hosts, no parallelism).
        #[arg(long, default_value_t = 1)]
        workers: usize,
        /// How idle workers wait: off (sleep until a doorbell), adaptive (spin for an
        /// adapting budget, then sleep), always (spin).
        #[arg(long, default_value = "adaptive")]
        poll: nvme_ctrl::PollMode,
        /// Most I/O queue pairs the controller offers (MSI-X vectors = this + 1).
        #[arg(long, default_value_t = 64)]
        queues: u16,
        /// Controller serial number.
        #[arg(long, default_value = "VNVME0001")]
        serial: String,
        /// PCI vendor:device ID in hex.
        #[arg(long, default_value = "1b36:0010", value_parser = serve::parse_pci_id)]
        pci_id: (u16, u16),
        /// Exit after the first client disconnects.
        #[arg(long)]
        once: bool,
        /// Write the controller's counters (JSON) here twice a second and at exit.
        #[arg(long)]
        stats_file: Option<std::path::PathBuf>,
        /// How doorbell writes arrive: trapped (REGION_WRITE messages), eventfd (IO FDs
        /// offered for I/O queue doorbells; needs a guest using shadow doorbells) or
        /// mapped (doorbell page mapped into the guest; workers poll it).
        #[arg(long, default_value = "trapped")]
        doorbells: vfio_user_server::DoorbellMode,
        /// Do not offer Doorbell Buffer Config (OACS bit 8), so the guest writes every
        /// doorbell register: the baseline for measuring what shadow doorbells save.
        #[arg(long)]
        no_shadow_doorbells: bool,
    },
    /// Run the controller in this process against a built-in host that drives it
    /// the way Linux's nvme driver does, and show it working: bring-up, Identify,
    /// shadow doorbells, a write/read/verify pass and the doorbell counters.
    Demo {
        /// Namespaces: KIND:SIZE[:lba=512|4096], e.g. ram:64M or null:1G:lba=4096.
        #[arg(long = "ns", default_value = "ram:64M")]
        namespaces: Vec<nsspec::NsSpec>,
        /// I/O queue pairs.
        #[arg(long, default_value_t = 4)]
        queues: u16,
        /// Commands to run per queue depth.
        #[arg(long, default_value_t = 20_000)]
        commands: u32,
        /// Do not use shadow doorbells.
        #[arg(long)]
        no_shadow: bool,
    },
    /// Connect to a vfio-user NVMe device with the userspace driver and print what
    /// Identify says: controller, capabilities, namespaces.
    Identify {
        /// UNIX socket of the vfio-user server (e.g. `vnvme serve --socket`).
        #[arg(long)]
        socket: std::path::PathBuf,
    },
    /// Load generator: drive a vfio-user NVMe device with the userspace driver and
    /// report IOPS, bandwidth, latency percentiles, CPU per I/O and doorbell counters.
    /// With --in-process, drive a controller in this process instead (no socket, no
    /// server process): the ceiling for a vfio-user transport.
    Perf {
        /// UNIX socket of the vfio-user server.
        #[arg(long, required_unless_present = "in_process", conflicts_with = "in_process")]
        socket: Option<std::path::PathBuf>,
        /// Run the controller in this process (the driver's in-process transport):
        /// doorbells are function calls (--doorbells trapped or shadow).
        #[arg(long)]
        in_process: bool,
        /// --in-process namespaces, as `vnvme serve --ns` takes them [default:
        /// null:64G:lba=4096].
        #[arg(long = "in-process-ns")]
        in_process_ns: Vec<nsspec::NsSpec>,
        /// --in-process: controller I/O worker threads, as `vnvme serve --workers`
        /// [default: 1].
        #[arg(long)]
        workers: Option<usize>,
        /// --in-process: how idle workers wait, as `vnvme serve --poll` [default:
        /// adaptive].
        #[arg(long)]
        poll: Option<nvme_ctrl::PollMode>,
        /// randread, randwrite, read, write or randrw.
        #[arg(long, default_value = "randread")]
        rw: perf::Workload,
        /// Read percentage for randrw.
        #[arg(long, default_value_t = 70)]
        mix: u8,
        /// Block size per I/O (e.g. 4k, 128k).
        #[arg(long, default_value = "4k", value_parser = nsspec::parse_size)]
        bs: u64,
        /// Commands in flight per queue.
        #[arg(long, default_value_t = 16)]
        qd: u16,
        /// I/O queue pairs, one thread each.
        #[arg(long, default_value_t = 1)]
        queues: u16,
        /// How long to run (e.g. 5s, 500ms).
        #[arg(long, default_value = "5s", value_parser = perf::parse_duration)]
        runtime: std::time::Duration,
        /// Namespace ID.
        #[arg(long = "ns", default_value_t = 1)]
        nsid: u32,
        /// trapped, shadow (EventIdx), sync, eventfd or mapped.
        #[arg(long, default_value = "shadow")]
        doorbells: perf::Doorbells,
        /// poll (spin on the CQ) or irq (sleep on the MSI-X eventfd).
        #[arg(long, default_value = "poll", value_parser = perf::parse_completion)]
        completion: nvme_driver::CompletionMode,
        /// Write the results and every knob as JSON here.
        #[arg(long)]
        json: Option<std::path::PathBuf>,
        /// The server's --stats-file, read before and after the run.
        #[arg(long)]
        server_stats: Option<std::path::PathBuf>,
        /// The server's process ID: report its CPU time (/proc/PID/stat utime+stime)
        /// over the run, per I/O.
        #[arg(long)]
        server_pid: Option<u32>,
    },
}

fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::new(&cli.log))
        .with_writer(std::io::stderr)
        .init();
    let r = match cli.cmd {
        Cmd::Serve {
            socket,
            namespaces,
            workers,
            poll,
            queues,
            serial,
            pci_id,
            once,
            stats_file,
            doorbells,
            no_shadow_doorbells,
        } => {
            if !(1..=511).contains(&queues) {
                Err("--queues must be 1..=511".to_string())
            } else if workers > 64 {
                Err("--workers must be 0..=64".to_string())
            } else {
                serve::run(serve::ServeArgs {
                    socket,
                    namespaces,
                    workers,
                    poll,
                    queues,
                    serial,
                    pci_id,
                    once,
                    stats_file,
                    doorbells,
                    no_shadow_doorbells,
                })
                .map_err(|e| e.to_string())
            }
        }
        Cmd::Demo { namespaces, queues, commands, no_shadow } => {
            demo::run(&namespaces, queues, commands, !no_shadow).map_err(|e| e.to_string())
        }
        Cmd::Identify { socket } => identify::run(&socket).map_err(|e| e.to_string()),
        Cmd::Perf {
            socket,
            in_process,
            in_process_ns,
            workers,
            poll,
            rw,
            mix,
            bs,
            qd,
            queues,
            runtime,
            nsid,
            doorbells,
            completion,
            json,
            server_stats,
            server_pid,
        } => perf::run(perf::PerfArgs {
            target: match socket {
                Some(_) if workers.is_some() || poll.is_some() || !in_process_ns.is_empty() => {
                    return fail("--workers, --poll and --in-process-ns need --in-process")
                }
                Some(s) => perf::Target::Socket(s),
                None if !in_process => return fail("perf needs --socket or --in-process"),
                None if workers.unwrap_or(1) > 64 => return fail("--in-process: --workers must be 0..=64"),
                None => perf::Target::InProcess {
                    namespaces: if in_process_ns.is_empty() {
                        vec!["null:64G:lba=4096".parse().expect("valid default namespace")]
                    } else {
                        in_process_ns
                    },
                    workers: workers.unwrap_or(1),
                    poll: poll.unwrap_or_default(),
                },
            },
            rw,
            mix,
            bs,
            qd,
            queues,
            runtime,
            nsid,
            doorbells,
            completion,
            json,
            server_stats,
            server_pid,
        })
        .map_err(|e| e.to_string()),
    };
    match r {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => fail(&e),
    }
}

fn fail(e: &str) -> std::process::ExitCode {
    eprintln!("vnvme: {e}");
    std::process::ExitCode::FAILURE
}
