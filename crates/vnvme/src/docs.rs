//! What the command line says about itself, for a host's shell and man: completion
//! scripts (`vnvme completions SHELL`) and man pages (`vnvme manpages --out DIR`, what
//! the Debian package ships). Both come from the clap definitions, so they can never
//! disagree with `--help`.
use std::io;
use std::path::{Path, PathBuf};

use clap::{Args, Command};
use clap_complete::Shell;

#[derive(Debug, Args)]
pub struct CompletionsArgs {
    /// The shell whose completion script to print on stdout.
    #[arg(value_enum)]
    pub shell: Shell,
}

#[derive(Debug, Args)]
pub struct ManpagesArgs {
    /// The directory to write the pages into (created if missing): vnvme.1 and one
    /// vnvme-COMMAND.1 per command.
    #[arg(long)]
    pub out: PathBuf,
}

/// Prints the completion script for `args.shell`.
pub fn completions(mut cmd: Command, args: CompletionsArgs) -> Result<(), Box<dyn std::error::Error>> {
    let name = cmd.get_name().to_string();
    clap_complete::generate(args.shell, &mut cmd, name, &mut io::stdout());
    Ok(())
}

/// Writes the man pages and prints their paths.
pub fn manpages(cmd: Command, args: ManpagesArgs) -> Result<(), Box<dyn std::error::Error>> {
    let written = write_pages(cmd, &args.out)
        .map_err(|e| format!("writing man pages into {}: {e}", args.out.display()))?;
    for p in written {
        println!("{}", p.display());
    }
    Ok(())
}

/// Section 1 pages for `cmd` and every visible command under it, named the git way
/// (vnvme-serve.1, vnvme-ctl.1), each saying which command line it documents.
fn write_pages(mut cmd: Command, out: &Path) -> io::Result<Vec<PathBuf>> {
    std::fs::create_dir_all(out)?;
    cmd.build();
    let mut written = Vec::new();
    page(&cmd, cmd.get_name(), out, &mut written)?;
    Ok(written)
}

fn page(cmd: &Command, name: &str, out: &Path, written: &mut Vec<PathBuf>) -> io::Result<()> {
    // The page is titled with its file name; the synopsis keeps the words a user
    // types ("vnvme serve"), which clap_mangen takes from the bin name.
    let words = name.replace('-', " ");
    let titled = cmd.clone().name(name.to_string()).bin_name(words);
    let path = out.join(format!("{name}.1"));
    let mut buf = Vec::new();
    clap_mangen::Man::new(titled).render(&mut buf)?;
    replace_page(&path, name, &buf)?;
    written.push(path);
    for sub in cmd.get_subcommands().filter(|s| !s.is_hide_set() && s.get_name() != "help") {
        page(sub, &format!("{name}-{}", sub.get_name()), out, written)?;
    }
    Ok(())
}

/// Puts `page` at `path`: a new file, renamed into place, so nothing is ever written
/// through what is there. What is there may only be an earlier page of this command
/// (a regular file titled `.TH NAME 1`); anything else (an operator's file, a
/// symlink, a device) is refused and left as it is.
fn replace_page(path: &Path, name: &str, page: &[u8]) -> io::Result<()> {
    use std::io::{Read, Write};
    match std::fs::symlink_metadata(path) {
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => return Err(e),
        Ok(m) => {
            let ours = m.file_type().is_file() && {
                let mut head = Vec::new();
                std::fs::File::open(path)?.take(4096).read_to_end(&mut head)?;
                let title = format!(".TH {name} 1");
                head.windows(title.len()).any(|w| w == title.as_bytes())
            };
            if !ours {
                return Err(io::Error::new(
                    io::ErrorKind::AlreadyExists,
                    format!(
                        "{} is there and is not a vnvme man page (a regular file titled {name}): left alone; \
                         remove it or write the pages into another directory",
                        path.display()
                    ),
                ));
            }
        }
    }
    let tmp = path.with_extension(format!("1.tmp-{}", std::process::id()));
    let mut f = std::fs::OpenOptions::new().write(true).create_new(true).open(&tmp)?;
    let done = f.write_all(page).and_then(|()| std::fs::rename(&tmp, path));
    if done.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    done
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cli() -> Command {
        <crate::Cli as clap::CommandFactory>::command()
    }

    #[test]
    fn every_visible_command_gets_a_page_that_names_it() {
        let dir = std::env::temp_dir().join(format!("vnvme-man-{}", std::process::id()));
        let written = write_pages(cli(), &dir).unwrap();
        let names: Vec<String> =
            written.iter().map(|p| p.file_name().unwrap().to_string_lossy().into_owned()).collect();
        for want in ["vnvme.1", "vnvme-serve.1", "vnvme-ctl.1", "vnvme-perf.1", "vnvme-completions.1"] {
            assert!(names.iter().any(|n| n == want), "{want} missing from {names:?}");
        }
        assert!(!names.iter().any(|n| n.contains("manpages") || n.contains("help")), "{names:?}");
        let serve = std::fs::read_to_string(dir.join("vnvme-serve.1")).unwrap();
        assert!(serve.contains(".TH vnvme-serve 1"), "{}", &serve[..serve.len().min(300)]);
        assert!(serve.contains("vnvme serve") && serve.contains("\\-\\-socket"), "synopsis and options");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn completion_scripts_know_the_commands_and_options() {
        for shell in [Shell::Bash, Shell::Zsh, Shell::Fish] {
            let mut out = Vec::new();
            let mut cmd = cli();
            clap_complete::generate(shell, &mut cmd, "vnvme", &mut out);
            let text = String::from_utf8(out).unwrap();
            assert!(
                text.contains("serve") && (text.contains("--socket") || text.contains("-l socket")),
                "{shell}"
            );
            assert!(text.contains("takeover"), "{shell}");
        }
    }

    #[test]
    fn pages_replace_only_earlier_pages() {
        let dir = std::env::temp_dir().join(format!("vnvme-man-keep-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        // An earlier page is replaced.
        std::fs::write(dir.join("vnvme.1"), ".TH vnvme 1 \"old\"\n").unwrap();
        // What is not a page of ours, or not a regular file, is refused and kept.
        let operators = dir.join("operators.img");
        std::fs::write(&operators, b"an operator's disk").unwrap();
        std::os::unix::fs::symlink(&operators, dir.join("vnvme-serve.1")).unwrap();
        let err = write_pages(cli(), &dir).unwrap_err().to_string();
        assert!(err.contains("vnvme-serve.1") && err.contains("not a vnvme man page"), "{err}");
        assert_eq!(std::fs::read(&operators).unwrap(), b"an operator's disk");
        assert!(std::fs::read_link(dir.join("vnvme-serve.1")).is_ok(), "the link is left as it was");
        let top = std::fs::read_to_string(dir.join("vnvme.1")).unwrap();
        assert!(top.contains(".TH vnvme 1") && !top.contains("\"old\""), "the earlier page was replaced");
        std::fs::remove_file(dir.join("vnvme-serve.1")).unwrap();
        std::fs::write(dir.join("vnvme-ctl.1"), "my notes").unwrap();
        let err = write_pages(cli(), &dir).unwrap_err().to_string();
        assert!(err.contains("vnvme-ctl.1"), "{err}");
        assert_eq!(std::fs::read_to_string(dir.join("vnvme-ctl.1")).unwrap(), "my notes");
        let leftovers: Vec<_> = std::fs::read_dir(&dir)
            .unwrap()
            .filter_map(|e| e.ok()?.file_name().into_string().ok())
            .filter(|n| n.contains(".tmp-"))
            .collect();
        assert!(leftovers.is_empty(), "{leftovers:?}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
