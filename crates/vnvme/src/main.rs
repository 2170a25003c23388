//! The vnvme command-line program.

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
        /// Namespaces: ram:SIZE, null:SIZE or file:PATH:SIZE, each with an optional
        /// :lba=512 or :lba=4096. Repeat for several namespaces.
        #[arg(long = "ns", default_value = "ram:1G")]
        namespaces: Vec<nsspec::NsSpec>,
        /// I/O worker threads; each owns the queues assigned to it.
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
    Perf {
        /// UNIX socket of the vfio-user server.
        #[arg(long)]
        socket: std::path::PathBuf,
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
        } => {
            if workers == 0 || !(1..=511).contains(&queues) {
                Err("--workers must be at least 1 and --queues 1..=511".to_string())
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
        } => perf::run(perf::PerfArgs {
            socket,
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
        })
        .map_err(|e| e.to_string()),
    };
    match r {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("vnvme: {e}");
            std::process::ExitCode::FAILURE
        }
    }
}
