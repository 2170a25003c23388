//! `vnvme serve --restart-on-crash`: the serving process SIGKILLed under a
//! connected client, and a stand-in started by the keeper on that same connection.
//! The client (a host over vfio-user) sees no hang-up: its next register read is
//! answered by the stand-in, which reports Controller Fatal Status; after a reset
//! the host brings the controller up again in the memory it mapped before the
//! crash, and reads what it wrote. Also: a death with no client, a stop of the
//! keeper, and a process that keeps dying.

mod common;

use std::path::Path;
use std::time::{Duration, Instant};

use common::nvme_host::NvmeOverVfioUser;
use common::{Server, TIMEOUT};
use nvme_spec::regs::{offset, Csts};

/// The serving process: the keeper's child.
fn serving_pid(keeper: u32) -> Option<u32> {
    let children = std::fs::read_to_string(format!("/proc/{keeper}/task/{keeper}/children")).ok()?;
    children.split_whitespace().next()?.parse().ok()
}

/// Waits for the keeper's serving process, other than `not` (bounded).
fn wait_serving(s: &Kept, not: Option<u32>) -> u32 {
    let deadline = Instant::now() + TIMEOUT;
    loop {
        if let Some(p) = serving_pid(s.pid()).filter(|&p| Some(p) != not) {
            return p;
        }
        assert!(Instant::now() < deadline, "no serving process under the keeper:\n{}", s.log());
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// `vnvme ctl --json` on `control`, answered by a process other than `not`
/// (retried, bounded, until it is).
fn ctl_of_another(s: &Kept, control: &Path, not: u32, args: &[&str]) -> serde_json::Value {
    let deadline = Instant::now() + TIMEOUT;
    loop {
        let pid = std::process::Command::new(env!("CARGO_BIN_EXE_vnvme"))
            .args(["ctl", "--json", "--control"])
            .arg(control)
            .arg("ctrl.info")
            .output()
            .ok()
            .and_then(|o| serde_json::from_slice::<serde_json::Value>(&o.stdout).ok())
            .and_then(|v| v["pid"].as_u64());
        if pid.is_some_and(|p| p != not as u64) {
            let out = std::process::Command::new(env!("CARGO_BIN_EXE_vnvme"))
                .args(["ctl", "--json", "--control"])
                .arg(control)
                .args(args)
                .output()
                .unwrap();
            return serde_json::from_slice(&out.stdout)
                .unwrap_or_else(|e| panic!("{args:?}: {e}: {}", String::from_utf8_lossy(&out.stderr)));
        }
        assert!(Instant::now() < deadline, "no answer from a process other than {not}:\n{}", s.log());
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn kill9(pid: u32) {
    let pid = rustix::process::Pid::from_raw(pid as i32).expect("a pid");
    rustix::process::kill_process(pid, rustix::process::Signal::KILL).expect("SIGKILL the serving process");
}

/// A server under its keeper; dropped, the serving process goes too (a keeper
/// killed leaves it serving), and any other process a test names.
struct Kept {
    server: Server,
    also: Vec<u32>,
}

impl std::ops::Deref for Kept {
    type Target = Server;
    fn deref(&self) -> &Server {
        &self.server
    }
}

impl std::ops::DerefMut for Kept {
    fn deref_mut(&mut self) -> &mut Server {
        &mut self.server
    }
}

impl Drop for Kept {
    fn drop(&mut self) {
        // The keeper first, so that it starts no stand-in for what is killed next.
        let serving = serving_pid(self.server.pid());
        self.server.kill_hard();
        for p in serving.into_iter().chain(self.also.iter().copied()) {
            if let Some(pid) = rustix::process::Pid::from_raw(p as i32) {
                let _ = rustix::process::kill_process(pid, rustix::process::Signal::KILL);
            }
        }
    }
}

fn kept(dir: &Path, extra: &[&str]) -> Kept {
    kept_env(dir, extra, &[])
}

/// [`kept`], with variables added to the processes' environment.
fn kept_env(dir: &Path, extra: &[&str], env: &[(String, String)]) -> Kept {
    let img = dir.join("d.img");
    let ns = format!("file:{}:16M", img.display());
    let mut args = vec!["--ns", ns.as_str(), "--restart-on-crash"];
    args.extend_from_slice(extra);
    Kept { server: Server::start_in_env(dir, "s", &args, env).owning_dir(), also: Vec::new() }
}

fn page(seed: u8) -> Vec<u8> {
    (0..4096u32).map(|i| (i as u8).wrapping_mul(13) ^ seed).collect()
}

fn write_page(h: &mut NvmeOverVfioUser, lba: u64, data: &[u8]) {
    h.write_page(lba, data)
}

fn read_page(h: &mut NvmeOverVfioUser, lba: u64) -> Vec<u8> {
    h.read_page(lba)
}

/// Kills the serving process `first` under the connected host `h`, waits for the
/// stand-in, and has the host do what Linux does: find Controller Fatal Status and
/// bring the controller up again.
fn crash_and_reset(s: &Kept, h: &mut NvmeOverVfioUser, first: u32) {
    kill9(first);
    wait_serving(s, Some(first));
    assert_eq!(h.read32(offset::CSTS) & Csts::CFS, Csts::CFS, "{}", s.log());
    h.bring_up(8, false);
}

fn crash_under_a_client(extra: &[&str]) {
    let dir = common::temp_dir("restart");
    let mut s = kept(&dir, extra);
    let first = wait_serving(&s, None);
    let mut h = NvmeOverVfioUser::new(s.client());
    h.bring_up(8, false);
    let a = page(1);
    write_page(&mut h, 64, &a);
    // An Asynchronous Event Request outstanding, as a host keeps one.
    let aer = h.admin_submit(nvme_spec::Sqe::with_opcode(nvme_spec::opcode::admin::ASYNC_EVENT_REQUEST));
    // The keeper has the client's connection and memory before the crash.
    assert!(s.log_shows("client connected"), "{}", s.log());

    kill9(first);
    let second = wait_serving(&s, Some(first));
    assert_ne!(first, second);
    // The stand-in tells the host at once, through that request: Error Status,
    // Persistent Internal Error, log page 01h (a host resets on it).
    let c = h.admin_wait();
    assert_eq!((c.cid.get(), c.dw0.get()), (aer, 0x0001_0300), "{:?}\n{}", c, s.log());
    assert!(c.status().is_success());
    // The same connection: the stand-in answers, and says it is not the
    // controller the host enabled.
    let csts = h.read32(offset::CSTS);
    assert_eq!(
        csts & (Csts::RDY | Csts::CFS),
        Csts::RDY | Csts::CFS,
        "CSTS after the crash: {csts:#x}\n{}",
        s.log()
    );
    // The host resets it and brings it up again, in the memory it mapped before
    // (the stand-in has it from the keeper: no DMA_MAP since).
    h.bring_up(8, false);
    assert_eq!(read_page(&mut h, 64), a, "a page written before the crash");
    let b = page(2);
    write_page(&mut h, 72, &b);
    assert_eq!(read_page(&mut h, 72), b, "a page written through the stand-in");
    s.assert_alive();
    let log = s.log();
    assert!(
        log.contains(&format!("the serving process (pid {first}) was killed by signal 9 (SIGKILL)")),
        "{log}"
    );
    assert!(log.contains("standing in for a serving process that died (the client stays connected"), "{log}");
    assert!(log.contains("standing in for a controller whose process died"), "{log}");
    assert!(
        log.contains(&format!("told the host through its Asynchronous Event Request (CID {aer})")),
        "{log}"
    );
    // The client leaves; the stand-in serves the next one as any server does.
    drop(h);
    let mut h = NvmeOverVfioUser::new(s.client());
    h.bring_up(8, false);
    assert_eq!(read_page(&mut h, 72), b);
}

#[test]
fn a_serving_process_killed_under_its_client_is_stood_in_for_inline() {
    crash_under_a_client(&["--workers", "0"]);
}

#[test]
fn a_serving_process_killed_under_its_client_is_stood_in_for_with_a_worker() {
    crash_under_a_client(&["--workers", "1"]);
}

#[test]
fn a_serving_process_killed_under_eventfd_doorbells_is_stood_in_for() {
    crash_under_a_client(&["--doorbells", "eventfd", "--workers", "1"]);
}

#[test]
fn a_serving_process_killed_under_mapped_doorbells_is_stood_in_for() {
    crash_under_a_client(&["--doorbells", "mapped", "--workers", "1"]);
}

#[test]
fn a_serving_process_killed_with_no_client_is_restarted() {
    let dir = common::temp_dir("restart");
    let control = dir.join("c.sock");
    let s = kept(&dir, &["--control", control.to_str().unwrap()]);
    let first = wait_serving(&s, None);
    let mut s = s;
    let mut h = NvmeOverVfioUser::new(s.client());
    h.bring_up(8, false);
    let a = page(3);
    write_page(&mut h, 8, &a);
    drop(h);
    // Gone from the keeper's journal before the kill: the next client is new. The
    // device thread journals the departure as it resets the device, before it
    // runs the next job: a ctrl.info saying no client comes after it.
    let deadline = Instant::now() + TIMEOUT;
    while ctl_of_another(&s, &control, 0, &["ctrl.info"])["client_connected"] != false {
        assert!(Instant::now() < deadline, "the client never left:\n{}", s.log());
        std::thread::sleep(Duration::from_millis(20));
    }
    kill9(first);
    wait_serving(&s, Some(first));
    assert!(s.log_shows("no client was connected"), "{}", s.log());
    // The stand-in says whose it is, and how many came before it.
    let info = ctl_of_another(&s, &control, first, &["ctrl.info"]);
    assert_eq!(info["keeper"], serde_json::json!({ "pid": s.pid(), "restarts": 1 }), "{info}");
    let mut h = NvmeOverVfioUser::new(s.client());
    assert_eq!(h.read32(offset::CSTS) & Csts::CFS, 0, "a new client finds no fatal status");
    h.bring_up(8, false);
    assert_eq!(read_page(&mut h, 8), a);
}

#[test]
fn the_keeper_passes_a_stop_on_and_exits_0() {
    let dir = common::temp_dir("restart");
    let mut s = kept(&dir, &[]);
    let serving = wait_serving(&s, None);
    s.signal(libc::SIGTERM);
    let st = s.wait_exit().unwrap_or_else(|| panic!("the keeper did not stop:\n{}", s.log()));
    assert!(st.success(), "{st}\n{}", s.log());
    assert!(!Path::new(&format!("/proc/{serving}")).exists(), "the serving process outlived its keeper");
    assert!(!s.socket.exists(), "the socket file stays after a stop");
}

#[test]
fn the_keeper_gives_up_on_a_process_that_keeps_dying() {
    let dir = common::temp_dir("restart");
    let mut s = kept(&dir, &[]);
    let mut pid = wait_serving(&s, None);
    // One more death than the keeper restarts within its window.
    for _ in 0..6 {
        // Each stand-in has journaled (it serves) before it is killed.
        let deadline = Instant::now() + TIMEOUT;
        while !s.log().contains(&format!("(pid {pid})")) {
            assert!(Instant::now() < deadline, "pid {pid} never started:\n{}", s.log());
            std::thread::sleep(Duration::from_millis(10));
        }
        std::thread::sleep(Duration::from_millis(200));
        kill9(pid);
        let deadline = Instant::now() + TIMEOUT;
        loop {
            match serving_pid(s.pid()) {
                Some(p) if p != pid => {
                    pid = p;
                    break;
                }
                _ if s.child_exited() => break,
                _ => {}
            }
            assert!(Instant::now() < deadline, "neither a new serving process nor an exit:\n{}", s.log());
            std::thread::sleep(Duration::from_millis(10));
        }
    }
    let st = s.wait_exit().unwrap_or_else(|| panic!("the keeper did not give up:\n{}", s.log()));
    assert!(!st.success(), "{st}");
    assert!(s.log().contains("was restarted 5 times in 60s: giving up"), "{}", s.log());
}

#[test]
fn an_operators_ana_state_outlives_a_crash() {
    // A path the operator took out of service stays so: a stand-in that came back
    // optimized would draw the guest's I/O to a path under maintenance.
    let dir = common::temp_dir("restart");
    let control = dir.join("c.sock");
    let img = dir.join("d2.img");
    let ns2 = format!("file:{}:4M:ana=2", img.display());
    let mut s = kept(&dir, &["--ns", &ns2, "--cntlid", "2", "--control", control.to_str().unwrap()]);
    let first = wait_serving(&s, None);
    let mut h = NvmeOverVfioUser::new(s.client());
    h.bring_up(8, false);
    let set = ctl_of_another(&s, &control, 0, &["ana.set", "inaccessible", "2"]);
    assert_eq!(set["changed"], serde_json::json!([2]), "{set}");
    kill9(first);
    let get = ctl_of_another(&s, &control, first, &["ana.get"]);
    assert_eq!(
        get["groups"],
        serde_json::json!([
            {"group": 1, "state": "optimized", "nsids": [1]},
            {"group": 2, "state": "inaccessible", "nsids": [2]},
        ]),
        "{get}\n{}",
        s.log()
    );
    // The host resets the stand-in and finds the path as the operator left it.
    assert_eq!(h.read32(offset::CSTS) & Csts::CFS, Csts::CFS);
    h.bring_up(8, false);
    h.nsid = 2;
    h.mem.write(NvmeOverVfioUser::slot(0), &page(4)).unwrap();
    h.queue_rw(true, 0, 0);
    h.ring_io(false);
    let c = h.reap_io(1);
    assert_eq!(
        c[0].status().code(),
        nvme_spec::Status::ASYMMETRIC_ACCESS_INACCESSIBLE,
        "{:?}",
        c[0].status()
    );
}

#[test]
fn an_operators_namespaces_qos_and_ram_data_outlive_a_crash() {
    // What the operator changed through the control socket, and what a RAM
    // namespace holds, are the stand-in's too: a namespace that vanished with a
    // crash would fail the guest's I/O to it, a limit that vanished would let a
    // noisy neighbour loose.
    let dir = common::temp_dir("restart");
    let control = dir.join("c.sock");
    let mut s = kept(&dir, &["--ns", "ram:4M", "--control", control.to_str().unwrap()]);
    let first = wait_serving(&s, None);
    let added = ctl_of_another(&s, &control, 0, &["ns.add", "ram:8M:lba=4096", "5"]);
    assert_eq!(added["nsid"], 5, "{added}");
    ctl_of_another(&s, &control, 0, &["ns.resize", "5", "12M"]);
    assert_eq!(ctl_of_another(&s, &control, 0, &["ns.add", "ram:1M"])["nsid"], 3);
    ctl_of_another(&s, &control, 0, &["ns.remove", "3"]);
    ctl_of_another(&s, &control, 0, &["qos.set", "group=gold", "iops=50000"]);
    ctl_of_another(&s, &control, 0, &["qos.set", "2", "group=gold"]);
    ctl_of_another(&s, &control, 0, &["qos.set", "5", "bps=900M"]);
    let mut h = NvmeOverVfioUser::new(s.client());
    h.bring_up(8, false);
    h.nsid = 2;
    write_page(&mut h, 64, &page(5));
    h.nsid = 5;
    h.lba_size = 4096;
    write_page(&mut h, 2900, &page(6)); // past the first 8 MiB: the resize is kept

    kill9(first);
    let list = ctl_of_another(&s, &control, first, &["ns.list"]);
    let shape: Vec<(u64, u64, String)> = list["namespaces"]
        .as_array()
        .unwrap()
        .iter()
        .map(|n| {
            (n["nsid"].as_u64().unwrap(), n["size"].as_u64().unwrap(), n["spec"].as_str().unwrap().into())
        })
        .collect();
    assert_eq!(
        shape,
        [
            (1, 16 << 20, format!("file:{}:16M", dir.join("d.img").display())),
            (2, 4 << 20, "ram:4M".to_string()),
            (5, 12 << 20, "ram:8M:lba=4096".to_string())
        ],
        "{list}\n{}",
        s.log()
    );
    let qos = ctl_of_another(&s, &control, first, &["qos.get"]);
    let limits: Vec<(u64, String)> = qos["namespaces"]
        .as_array()
        .unwrap()
        .iter()
        .map(|n| (n["nsid"].as_u64().unwrap(), n["group"].as_str().unwrap_or("").to_string()))
        .collect();
    assert_eq!(limits, [(1, String::new()), (2, "gold".to_string()), (5, "ns5".to_string())], "{qos}");
    assert_eq!(qos["namespaces"][1]["limits"]["iops"]["rate"], 50000, "{qos}");
    assert_eq!(qos["namespaces"][2]["limits"]["bps"]["rate"], 900u64 << 20, "{qos}");
    assert_eq!(qos["groups"][0]["group"], "gold", "the named group, for the next namespace to join: {qos}");

    // The host resets the stand-in and reads what it wrote to both RAM namespaces.
    assert_eq!(h.read32(offset::CSTS) & Csts::CFS, Csts::CFS);
    h.bring_up(8, false);
    h.lba_size = 4096;
    assert_eq!(read_page(&mut h, 2900), page(6), "namespace 5 (ns.add, resized) after the crash");
    h.nsid = 2;
    h.lba_size = 512;
    assert_eq!(read_page(&mut h, 64), page(5), "namespace 2 (RAM) after the crash");
}

#[test]
fn under_user_a_stand_in_opens_what_ns_add_added_with_that_users_rights() {
    // The stand-in opens namespaces before it drops to --user: one added with
    // ns.add by a process running as nobody is opened with nobody's rights, so a
    // file nobody can no longer open stays shut (the journal may come from a
    // process a hostile VMM took over).
    use std::os::unix::fs::{chown, PermissionsExt};
    let Ok(Some(nobody)) = nix::unistd::User::from_name("nobody") else {
        test_util::skip("no user named nobody on this machine");
        return;
    };
    let (uid, gid) = (Some(nobody.uid.as_raw()), Some(nobody.gid.as_raw()));
    let dir = common::temp_dir("restart");
    chown(&dir, uid, gid).unwrap();
    let roots = common::temp_dir("restart-root");
    std::fs::set_permissions(&roots, std::fs::Permissions::from_mode(0o755)).unwrap();
    let control = roots.join("c.sock");
    let [open, shut] = ["open.img", "shut.img"].map(|f| {
        let p = dir.join(f);
        std::fs::File::create(&p).unwrap().set_len(4 << 20).unwrap();
        chown(&p, uid, gid).unwrap();
        p
    });
    let mut s = kept(&dir, &["--user", "nobody", "--control", control.to_str().unwrap()]);
    let first = wait_serving(&s, None);
    for p in [&open, &shut] {
        let added = ctl_of_another(&s, &control, 0, &["ns.add", &format!("file:{}", p.display())]);
        assert!(added["nsid"].is_u64(), "{added}\n{}", s.log());
    }
    // The file nobody had is root's alone now.
    chown(&shut, Some(0), Some(0)).unwrap();
    std::fs::set_permissions(&shut, std::fs::Permissions::from_mode(0o600)).unwrap();
    let mut h = NvmeOverVfioUser::new(s.client());
    h.bring_up(8, false);
    h.nsid = 2;
    write_page(&mut h, 5, &page(12));
    kill9(first);
    let list = ctl_of_another(&s, &control, first, &["ns.list"]);
    let nsids: Vec<u64> =
        list["namespaces"].as_array().unwrap().iter().map(|n| n["nsid"].as_u64().unwrap()).collect();
    assert_eq!(nsids, [1, 2], "{list}\n{}", s.log());
    assert!(s.log().contains("served before the crash, cannot be opened again"), "{}", s.log());
    h.bring_up(8, false);
    h.nsid = 2;
    assert_eq!(read_page(&mut h, 5), page(12), "the namespace nobody could open, after the crash");
    let _ = std::fs::remove_dir_all(&roots);
}

#[test]
fn a_ram_namespace_keeps_its_data_through_a_crash() {
    // Its memory is journaled from the start (the keeper holds it), not only
    // once an operator changes something.
    let dir = common::temp_dir("restart");
    let mut s = kept(&dir, &["--ns", "ram:4M"]);
    let first = wait_serving(&s, None);
    let mut h = NvmeOverVfioUser::new(s.client());
    h.bring_up(8, false);
    h.nsid = 2;
    write_page(&mut h, 8, &page(7));
    crash_and_reset(&s, &mut h, first);
    assert_eq!(read_page(&mut h, 8), page(7), "{}", s.log());
}

#[test]
fn the_format_a_host_chose_outlives_a_crash() {
    // The data is laid out in the format the host chose; a stand-in back in the
    // --ns format would show it in blocks the host never wrote.
    let dir = common::temp_dir("restart");
    let mut s = kept(&dir, &["--ns", "ram:4M"]);
    let first = wait_serving(&s, None);
    let mut h = NvmeOverVfioUser::new(s.client());
    h.bring_up(8, false);
    let mut format = nvme_spec::Sqe::with_opcode(nvme_spec::opcode::admin::FORMAT_NVM);
    (format.nsid, format.cdw10) = (2.into(), 1.into()); // LBAF 1: 4 KiB blocks, no erase
    assert!(h.admin(format).status().is_success());
    (h.nsid, h.lba_size) = (2, 4096);
    write_page(&mut h, 3, &page(10));
    crash_and_reset(&s, &mut h, first);
    let mut id = nvme_spec::Sqe::with_opcode(nvme_spec::opcode::admin::IDENTIFY);
    id.nsid = 2.into();
    id.set_prps(NvmeOverVfioUser::slot(2), 0);
    assert!(h.admin(id).status().is_success());
    let mut ns = vec![0u8; 4096];
    h.mem.read(NvmeOverVfioUser::slot(2), &mut ns).unwrap();
    assert_eq!(ns[26] & 0xf, 1, "FLBAS after the crash\n{}", s.log());
    (h.nsid, h.lba_size) = (2, 4096);
    assert_eq!(read_page(&mut h, 3), page(10));
}

#[test]
fn a_zoned_ram_namespace_starts_over_empty_after_a_crash() {
    // Its write pointers died with the process: its data, kept, would sit under
    // zones the stand-in reports empty. It starts over zeroed instead.
    let dir = common::temp_dir("restart");
    let mut s = kept(&dir, &["--ns", "ram:8M:zoned=1M"]);
    let first = wait_serving(&s, None);
    let mut h = NvmeOverVfioUser::new(s.client());
    h.bring_up(8, false);
    h.nsid = 2;
    write_page(&mut h, 0, &page(8));
    assert_eq!(read_page(&mut h, 0), page(8));
    crash_and_reset(&s, &mut h, first);
    assert_eq!(read_page(&mut h, 0), vec![0u8; 4096], "{}", s.log());
    write_page(&mut h, 0, &page(9));
    assert_eq!(read_page(&mut h, 0), page(9), "zone 0 written again from its start");
}

#[test]
fn a_killed_keeper_is_seen_at_once_and_the_process_serves_on() {
    // Nothing would stand in for the process now: the operator hears of it when it
    // happens, not at the next crash.
    let dir = common::temp_dir("restart");
    let control = dir.join("c.sock");
    let mut s = kept(&dir, &["--control", control.to_str().unwrap()]);
    let serving = wait_serving(&s, None);
    s.also.push(serving);
    let mut h = NvmeOverVfioUser::new(s.client());
    h.bring_up(8, false);
    let info = ctl_of_another(&s, &control, 0, &["ctrl.info"]);
    assert_eq!(info.get("keeper_lost"), None, "{info}");
    kill9(s.pid());
    let deadline = Instant::now() + TIMEOUT;
    while !s.log().contains("the keeper is gone") {
        assert!(Instant::now() < deadline, "the serving process did not see its keeper go:\n{}", s.log());
        std::thread::sleep(Duration::from_millis(20));
    }
    let info = ctl_of_another(&s, &control, 0, &["ctrl.info"]);
    assert_eq!((info["keeper_lost"].clone(), info["pid"].clone()), (true.into(), serving.into()), "{info}");
    write_page(&mut h, 16, &page(11));
    assert_eq!(read_page(&mut h, 16), page(11), "the process serves on");
}

#[test]
fn an_upgrade_under_a_keeper_leaves_the_new_process_kept() {
    let dir = common::temp_dir("restart");
    let control = dir.join("c.sock");
    let mut s = kept(&dir, &["--control", control.to_str().unwrap()]);
    let first = wait_serving(&s, None);
    let mut h = NvmeOverVfioUser::new(s.client());
    h.bring_up(8, false);
    let a = page(5);
    write_page(&mut h, 16, &a);
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_vnvme"))
        .args(["ctl", "--json", "--control"])
        .arg(&control)
        .arg("upgrade")
        .output()
        .unwrap();
    let r: serde_json::Value = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("upgrade: {e}: {}\n{}", String::from_utf8_lossy(&out.stderr), s.log()));
    let new = r["new_pid"].as_u64().unwrap() as u32;
    s.also.push(new);
    assert_ne!(new, first);
    // The keeper watches the upgraded process, which knows it.
    assert!(s.log_shows(&format!("vnvme keeper: watching pid {new} now")), "{}", s.log());
    let info = ctl_of_another(&s, &control, first, &["ctrl.info"]);
    assert_eq!(info["keeper"]["pid"], s.pid(), "{info}");
    write_page(&mut h, 24, &a);
    // Killed, the upgraded process is stood in for like any other.
    kill9(new);
    let standin = wait_serving(&s, None);
    s.also.push(standin);
    assert!(s.log_shows(&format!("the serving process (pid {new}) died; starting another")), "{}", s.log());
    assert_eq!(h.read32(offset::CSTS) & Csts::CFS, Csts::CFS, "{}", s.log());
    h.bring_up(8, false);
    assert_eq!(read_page(&mut h, 16), a);
    assert_eq!(read_page(&mut h, 24), a);
    s.assert_alive();
}

/// The next message on `conn` (bounded by the test's timeout), which must be the
/// successful reply to `id`.
fn reply_to(conn: &mut vfio_user::Connection, id: u16, s: &Kept) -> vfio_user::Message {
    conn.stream().set_read_timeout(Some(TIMEOUT)).unwrap();
    let m = conn.recv().unwrap_or_else(|e| panic!("no reply to message {id:#x}: {e}\n{}", s.log()));
    let f = vfio_user::MsgFlags(m.header.flags.get());
    assert!(f.is_reply() && m.header.msg_id.get() == id, "{:?}\n{}", m.header, s.log());
    assert!(!f.is_error(), "message {id:#x} refused: errno {}\n{}", m.header.error.get(), s.log());
    m
}

/// The serving process dies the moment it has read a DMA_MAP (fault injection:
/// the second one, after the host's own), with a register read sent right after
/// it: neither is answered when it dies. The stand-in answers both, on the same
/// connection: the DMA_MAP with the memory its descriptor names (the keeper had
/// the descriptor before the message was handled), so the region is there to
/// unmap, and the read with the stand-in's Controller Fatal Status.
#[test]
fn requests_the_dead_process_had_read_are_answered_by_the_stand_in() {
    use common::protocol::{access, DMA_MAP, READ};
    use std::os::fd::AsRawFd;
    use zerocopy::IntoBytes;

    if !common::fault_injection() {
        return;
    }
    let dir = common::temp_dir("restart");
    let env = [("VNVME_TEST_DIE_ON".to_string(), format!("{DMA_MAP}:2"))];
    let mut s = kept_env(&dir, &[], &env);
    let first = wait_serving(&s, None);
    let mut h = NvmeOverVfioUser::new(s.client());
    h.bring_up(8, false);
    let a = page(1);
    write_page(&mut h, 64, &a);

    const IOVA2: u64 = 0x8000_0000;
    let more = test_util::memfd::memfd_named("restart-second-region", 1 << 20);
    let map = vfio_user::proto::DmaMap {
        argsz: 32.into(),
        flags: (vfio_user::proto::DMA_MAP_FLAG_READ | vfio_user::proto::DMA_MAP_FLAG_WRITE).into(),
        offset: 0.into(),
        address: IOVA2.into(),
        size: (1u64 << 20).into(),
    };
    let conn = h.client.connection();
    let cmd = vfio_user::MsgFlags::COMMAND;
    conn.send(common::header(0x7001, DMA_MAP, cmd), &[map.as_bytes()], &[more.as_raw_fd()]).unwrap();
    let csts = access(vfio_user::proto::REGION_BAR0, offset::CSTS, 4);
    conn.send(common::header(0x7002, READ, cmd), &[csts.as_bytes()], &[]).unwrap();

    reply_to(conn, 0x7001, &s);
    let r = reply_to(conn, 0x7002, &s);
    let v = u32::from_le_bytes(r.payload[16..20].try_into().unwrap());
    assert_eq!(v & Csts::CFS, Csts::CFS, "CSTS from the stand-in: {v:#x}\n{}", s.log());
    let second = wait_serving(&s, None);
    assert_ne!(first, second, "answered by the process that was to die:\n{}", s.log());
    assert!(s.log_shows("dying on purpose at this message"), "{}", s.log());
    // The stand-in mapped the memory the DMA_MAP's descriptor names (not a region
    // without memory, as the message alone would make), and unmaps it.
    let maps = std::fs::read_to_string(format!("/proc/{second}/maps")).unwrap();
    assert!(maps.contains("memfd:restart-second-region"), "{maps}\n{}", s.log());
    h.client.dma_unmap(IOVA2, 1 << 20).unwrap_or_else(|e| panic!("{e}\n{}", s.log()));
    h.bring_up(8, false);
    assert_eq!(read_page(&mut h, 64), a);
}

/// The serving process is killed with half a message read: the stand-in is handed
/// that half and reads the rest, instead of taking the rest for a message of its
/// own (out of step, the client was then dropped).
#[test]
fn a_message_half_read_when_the_process_died_is_finished_by_the_stand_in() {
    use common::protocol::{access, READ};
    use zerocopy::IntoBytes;

    let dir = common::temp_dir("restart");
    let mut s = kept(&dir, &[]);
    let first = wait_serving(&s, None);
    let mut h = NvmeOverVfioUser::new(s.client());
    h.bring_up(8, false);
    let mut msg = common::header(0x7003, READ, vfio_user::MsgFlags::COMMAND);
    let csts = access(vfio_user::proto::REGION_BAR0, offset::CSTS, 4);
    msg.size.set((vfio_user::proto::HEADER_SIZE + csts.as_bytes().len()) as u32);
    let bytes = [msg.as_bytes(), csts.as_bytes()].concat();
    let conn = h.client.connection();
    conn.send_bytes(&bytes[..10], &[]).unwrap();
    // Read by the serving process (it waits for the rest, its deadline running).
    let deadline = Instant::now() + TIMEOUT;
    while !socket_drained(conn.stream()) {
        assert!(Instant::now() < deadline, "the half message was not read");
        std::thread::sleep(Duration::from_millis(5));
    }
    kill9(first);
    wait_serving(&s, Some(first));
    conn.send_bytes(&bytes[10..], &[]).unwrap();
    let r = reply_to(conn, 0x7003, &s);
    let v = u32::from_le_bytes(r.payload[16..20].try_into().unwrap());
    assert_eq!(v & Csts::CFS, Csts::CFS, "CSTS from the stand-in: {v:#x}\n{}", s.log());
    h.bring_up(8, false);
    h.write_read_verify(8, 2, 3);
}

/// Whether the peer has read everything sent on `s` (the send queue is empty).
fn socket_drained(s: &std::os::unix::net::UnixStream) -> bool {
    let mut n: libc::c_int = 0;
    // SAFETY: SIOCOUTQ writes one int through the pointer, which is live.
    let r = unsafe { libc::ioctl(std::os::fd::AsRawFd::as_raw_fd(s), libc::TIOCOUTQ, &mut n) };
    r == 0 && n == 0
}

/// A message that crashes every process that reads it (fault injection: whoever
/// reads message 0x7004 aborts), with a register read behind it. The first stand-in
/// is handed it and dies on it too; the keeper then hands the next one what
/// follows it: the register read is answered, the poison message goes unanswered
/// (as before a stand-in answered what the dead process had read), and the keeper
/// does not give up.
#[test]
fn a_message_that_kills_every_process_is_not_handed_to_a_stand_in_twice() {
    use common::protocol::{access, READ};
    use zerocopy::IntoBytes;

    if !common::fault_injection() {
        return;
    }
    let dir = common::temp_dir("restart");
    let env = [("VNVME_TEST_DIE_ON".to_string(), format!("id:{}", 0x7004))];
    let mut s = kept_env(&dir, &[], &env);
    let first = wait_serving(&s, None);
    let mut h = NvmeOverVfioUser::new(s.client());
    h.bring_up(8, false);
    let conn = h.client.connection();
    let cmd = vfio_user::MsgFlags::COMMAND;
    let csts = access(vfio_user::proto::REGION_BAR0, offset::CSTS, 4);
    conn.send(common::header(0x7004, READ, cmd), &[csts.as_bytes()], &[]).unwrap();
    conn.send(common::header(0x7005, READ, cmd), &[csts.as_bytes()], &[]).unwrap();
    // The next message is the reply to the register read behind it.
    let r = reply_to(conn, 0x7005, &s);
    let v = u32::from_le_bytes(r.payload[16..20].try_into().unwrap());
    assert_eq!(v & Csts::CFS, Csts::CFS, "CSTS from the stand-in: {v:#x}\n{}", s.log());
    let third = wait_serving(&s, Some(first));
    s.assert_alive();
    let log = s.log();
    assert_eq!(log.matches("dying on purpose at this message").count(), 2, "{log}");
    assert!(log.contains("a stand-in died on the first message it was handed"), "{log}");
    assert!(!log.contains("giving up"), "{log}");
    h.bring_up(8, false);
    h.write_read_verify(8, 2, 5);
    assert_eq!(wait_serving(&s, None), third, "no death since:\n{}", s.log());
}
