//! The vnvme command-line program.

mod demo;
mod nsspec;

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
        /// UNIX socket path to listen on.
        #[arg(long)]
        socket: Option<std::path::PathBuf>,
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
}

fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::new(&cli.log))
        .with_writer(std::io::stderr)
        .init();
    let r = match cli.cmd {
        Cmd::Serve { .. } => Err("`vnvme serve` (vfio-user) is not yet implemented: it lands with the \
                                  vfio-user issue. Try `vnvme demo` to see the controller run in-process."
            .to_string()),
        Cmd::Demo { namespaces, queues, commands, no_shadow } => {
            demo::run(&namespaces, queues, commands, !no_shadow).map_err(|e| e.to_string())
        }
    };
    match r {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("vnvme: {e}");
            std::process::ExitCode::FAILURE
        }
    }
}
