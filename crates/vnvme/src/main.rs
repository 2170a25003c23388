//! The vnvme command-line program.
#![forbid(unsafe_code)]

mod control;
mod ctl;
mod demo;
mod docs;
mod endpoint;
mod fdpspec;
mod handed;
mod identify;
mod inspect;
mod keeper;
mod logging;
mod metaspec;
mod metrics;
mod nsspec;
mod perf;
mod sandbox;
mod serve;
mod signals;
mod stats_file;
mod units;
mod unix_socket;
mod upgrade;
mod version;
mod zonespec;

use clap::{Parser, Subcommand};

use logging::LogFormat;

use version::VERSION;

/// vnvme: a fast, correct emulated NVMe controller for virtual machines.
#[derive(Debug, Parser)]
#[command(
    version = VERSION,
    about,
    long_about = "An emulated NVMe controller for virtual machines that runs as its own process \
        and plugs into the VMM over vfio-user (QEMU -device vfio-user-pci, Cloud Hypervisor \
        --user-device). Namespaces on RAM, files and block devices (io_uring), another NVMe \
        controller (nvme://), NBD exports and Ceph RBD images; shadow doorbells, a control \
        socket, Prometheus metrics, live upgrade and migration. One `vnvme serve` per VM \
        (the vnvme@.service template runs one per /etc/vnvme/NAME.conf)."
)]
struct Cli {
    /// Log filter (tracing EnvFilter syntax), e.g. "info" or "vnvme::guest=debug".
    /// A running server's filter can be changed with `vnvme ctl log.set`.
    #[arg(long, global = true, env = "VNVME_LOG", default_value = "warn")]
    log: String,
    /// Log line format on stderr: text (colours only when stderr is a terminal) or
    /// json (one object per line, for journald or a log shipper).
    #[arg(long, global = true, env = "VNVME_LOG_FORMAT", value_enum, default_value = "text")]
    log_format: LogFormat,
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Debug, Subcommand)]
enum Cmd {
    /// Serve an emulated NVMe controller to a VMM over vfio-user.
    ///
    /// The VMM connects to --socket (QEMU -device vfio-user-pci, Cloud Hypervisor
    /// --user-device). SIGTERM, SIGINT or SIGQUIT (systemctl stop, Ctrl-C) stops it
    /// cleanly: the client's session ends as if it had disconnected, the summary
    /// line and the stats file are written, its socket files removed, exit 0.
    /// SIGUSR1 logs the counters; SIGHUP and the rest are logged and ignored
    /// (docs/USAGE.md, "Signals").
    Serve(serve::ServeArgs),
    /// Show the controller working against a built-in host, in this process.
    ///
    /// The host drives it the way Linux's nvme driver does: bring-up, Identify,
    /// shadow doorbells, a write/read/verify pass and the doorbell counters.
    Demo(demo::DemoArgs),
    /// Print what a vfio-user NVMe device's Identify says.
    ///
    /// Connects with the userspace driver and prints the controller, its
    /// capabilities and namespaces. It is a client like a VMM: a server started with
    /// --once exits after it.
    Identify(identify::IdentifyArgs),
    /// Look into the files a namespace keeps beside its data.
    ///
    /// Reads a zone state file, or checks a namespace's protection information
    /// against its data, with the code the server reads them with. Only reads, and
    /// refuses files a running server writes.
    Inspect(inspect::InspectArgs),
    /// Load generator for a vfio-user NVMe device.
    ///
    /// Drives the device with the userspace driver and reports IOPS, bandwidth,
    /// latency percentiles, CPU per I/O and doorbell counters. With --in-process,
    /// drives a controller in this process instead (no socket, no server process):
    /// the ceiling for a vfio-user transport.
    Perf(perf::PerfArgs),
    /// Talk to a running server's control socket.
    ///
    /// The socket of `vnvme serve --control PATH`: read its state and counters, add,
    /// remove and resize namespaces, set QoS limits and the log filter
    /// (docs/CONTROL.md has every method with examples).
    Ctl(ctl::CtlArgs),
    /// Take over a running server's device, guest connection included.
    ///
    /// What `vnvme ctl upgrade` starts (docs/UPGRADE.md). Serves with the running
    /// server's arguments once it has let go; if anything fails first, it serves on.
    Takeover(upgrade::TakeoverArgs),
    /// Print a shell completion script on stdout.
    ///
    /// For example `vnvme completions bash > /etc/bash_completion.d/vnvme` (the
    /// Debian package installs the bash, zsh and fish ones already).
    Completions(docs::CompletionsArgs),
    /// Write the man pages (vnvme.1, vnvme-serve.1, ...) into a directory.
    ///
    /// How the package build makes them.
    #[command(hide = true)]
    Manpages(docs::ManpagesArgs),
}

/// `vnvme serve`'s arguments from a whole command line (a server handed over
/// carries the command line it was first started with).
pub fn parse_serve(argv: &[String]) -> Result<serve::ServeArgs, String> {
    match Cli::try_parse_from(argv) {
        Ok(Cli { cmd: Cmd::Serve(a), .. }) => Ok(a),
        Ok(_) => Err(format!("{argv:?} is not a vnvme serve command line")),
        Err(e) => Err(format!("the running server's arguments {argv:?}: {e}")),
    }
}

fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    logging::init(&cli.log, cli.log_format);
    let r = match cli.cmd {
        Cmd::Serve(a) => serve::run(a),
        Cmd::Demo(a) => demo::run(a),
        Cmd::Identify(a) => identify::run(a),
        Cmd::Inspect(a) => inspect::run(a),
        Cmd::Perf(a) => perf::run(a),
        Cmd::Ctl(a) => ctl::run(a),
        Cmd::Takeover(a) => serve::takeover(a, parse_serve),
        Cmd::Completions(a) => docs::completions(<Cli as clap::CommandFactory>::command(), a),
        Cmd::Manpages(a) => docs::manpages(<Cli as clap::CommandFactory>::command(), a),
    };
    match r {
        Ok(()) => std::process::ExitCode::SUCCESS,
        // A run stopped by a signal, its results out: the shell's status for it.
        Err(e) if e.is::<perf::Interrupted>() => {
            logging::say_at(tracing::Level::WARN, format!("vnvme perf: {e}"));
            std::process::ExitCode::from(e.downcast_ref::<perf::Interrupted>().map_or(1, |i| i.code))
        }
        Err(e) => {
            logging::say_at(tracing::Level::ERROR, format!("vnvme: {e}"));
            std::process::ExitCode::FAILURE
        }
    }
}

#[cfg(test)]
mod tests {
    use clap::CommandFactory;

    use super::*;

    #[test]
    fn cli_is_consistent() {
        Cli::command().debug_assert();
    }
}
