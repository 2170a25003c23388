//! Fuzzing what a migration source (or a process handing over) controls: a saved
//! controller state ([`ControllerState`]) from a live controller (queues, shadow
//! doorbells, an outstanding AER, counters), with one to three of its fields
//! mutated (a number set to an edge or a random value, a flag flipped, a string
//! replaced, an array entry dropped, repeated or added, a field emptied), restored
//! into a new controller.
//!
//! Checked: nothing panics; a refused state leaves the controller new (the good
//! state then restores into it); an accepted one runs (the controller processes
//! and is reset) and leaves, after the reset, a controller the good state restores
//! into. That is the restore's promise: all or nothing, and a reset is power-on.
//! A quarter of the runs stand in for a crashed controller instead, with the
//! mutated state's CC and ANA states (what a keeper's journal carries).

use std::sync::{Arc, OnceLock};

use arbitrary::Unstructured;
use block_backend::RamBackend;
use guest_mem::GuestMemory;
use nvme_ctrl::{Controller, ControllerConfig, ControllerState, NamespaceConfig};
use serde_json::Value;
use test_kit::{InitOptions, MockHost};

/// What state runs did, summed.
#[derive(Clone, Debug, Default)]
pub struct StateStats {
    pub runs: u64,
    /// Mutations that no longer read as a state (JSON of the wrong shape).
    pub not_a_state: u64,
    pub refused: u64,
    pub accepted: u64,
    /// Runs that stood in for a crashed controller with the state's CC and ANA.
    pub stand_ins: u64,
}

impl StateStats {
    pub fn line(&self) -> String {
        format!(
            "{} runs: {} states refused, {} accepted and run, {} stand-ins after a crash, {} not read as a state",
            self.runs, self.refused, self.accepted, self.stand_ins, self.not_a_state
        )
    }
}

/// The source: a controller with I/O queues, shadow doorbells and an AER, and its
/// saved state. Built once.
struct Source {
    cfg: fn() -> ControllerConfig,
    mem: GuestMemory,
    irq: Arc<test_kit::CountingIrq>,
    good: ControllerState,
    json: Value,
}

fn source() -> &'static Source {
    static SOURCE: OnceLock<Source> = OnceLock::new();
    SOURCE.get_or_init(|| {
        fn cfg() -> ControllerConfig {
            static RAM: OnceLock<RamBackend> = OnceLock::new();
            let ram = RAM.get_or_init(|| RamBackend::new(1 << 20)).clone();
            ControllerConfig {
                namespaces: vec![NamespaceConfig::new(Arc::new(ram), 0)],
                ..Default::default()
            }
        }
        let mut h = MockHost::new(cfg(), 16 << 20);
        h.init(InitOptions { io_queues: 2, shadow_doorbells: true, ..Default::default() }).expect("bring-up");
        h.submit_aer();
        h.process();
        h.ctrl.quiesce(std::time::Duration::from_secs(1)).expect("quiesce");
        let good = h.ctrl.save_state();
        let json = serde_json::to_value(&good).expect("a state is JSON");
        Source { cfg, mem: h.mem.clone(), irq: h.irq.clone(), good, json }
    })
}

/// A value to put somewhere: mostly an edge of its kind.
fn number(u: &mut Unstructured, old: &Value) -> Value {
    let n = old.as_u64().unwrap_or(0);
    let v: u64 = match u.int_in_range(0..=9).unwrap_or(0) {
        0 => 0,
        1 => n.wrapping_add(1),
        2 => n.wrapping_sub(1),
        3 => u64::MAX,
        4 => u32::MAX as u64,
        5 => u16::MAX as u64 + 1,
        6 => n.wrapping_mul(2),
        7 => 1 << u.int_in_range(0..=63).unwrap_or(0),
        8 => n / 2,
        _ => u.arbitrary().unwrap_or(0),
    };
    Value::from(v)
}

/// Changes one leaf (or one array) somewhere under `v`, as `u` says.
fn mutate(u: &mut Unstructured, v: &mut Value) {
    match v {
        Value::Object(m) if !m.is_empty() && u.ratio(7, 8).unwrap_or(false) => {
            let i = u.choose_index(m.len()).unwrap_or(0);
            let key = m.keys().nth(i).cloned().expect("in range");
            mutate(u, m.get_mut(&key).expect("present"));
        }
        Value::Array(a) => match u.int_in_range(0..=5).unwrap_or(0) {
            0 if !a.is_empty() => {
                let i = u.choose_index(a.len()).unwrap_or(0);
                a.remove(i);
            }
            1 if !a.is_empty() => {
                let i = u.choose_index(a.len()).unwrap_or(0);
                let e = a[i].clone();
                a.push(e);
            }
            2 => a.clear(),
            3 if !a.is_empty() => {
                let e = a[u.choose_index(a.len()).unwrap_or(0)].clone();
                a.insert(0, e);
            }
            _ if !a.is_empty() => {
                let i = u.choose_index(a.len()).unwrap_or(0);
                mutate(u, &mut a[i]);
            }
            _ => {}
        },
        Value::Number(_) => *v = number(u, v),
        Value::Bool(b) => *b = !*b,
        Value::String(s) => {
            *s = match u.int_in_range(0..=4).unwrap_or(0) {
                0 => String::new(),
                1 => ["disabled", "ready", "shut-down", "fatal", "running"][u.choose_index(5).unwrap_or(0)]
                    .into(),
                2 => "zz".repeat(s.len() / 2),
                3 => format!("{s}00"),
                _ => s.chars().rev().collect(),
            }
        }
        Value::Null => *v = number(u, v),
        Value::Object(_) => *v = Value::Null,
    }
}

/// Decodes `data` as up to three mutations of the source's state and restores the
/// result. Panics on a finding.
pub fn run_state_counted(data: &[u8], stats: &mut StateStats) {
    let src = source();
    let mut u = Unstructured::new(data);
    stats.runs += 1;
    let mut v = src.json.clone();
    for _ in 0..1 + u.int_in_range(0..=2).unwrap_or(0) {
        mutate(&mut u, &mut v);
    }
    let Ok(state) = serde_json::from_value::<ControllerState>(v) else {
        stats.not_a_state += 1;
        return;
    };
    let mut c = Controller::new((src.cfg)(), src.mem.clone(), src.irq.clone()).expect("controller");
    // A process standing in after a crash (`--restart-on-crash`) takes only CC,
    // the ANA states and the namespaces' formats from what its keeper journaled:
    // those, as mutated (the formats made up from the input).
    if u.ratio(1, 4).unwrap_or(false) {
        stats.stand_ins += 1;
        let admin = nvme_ctrl::AdminQueues { aqa: state.regs.aqa, asq: state.regs.asq, acq: state.regs.acq };
        let formats: Vec<(u32, nvme_ctrl::FormatState)> = (0..u.int_in_range(0..=3).unwrap_or(0))
            .map(|_| {
                let nsid = u.int_in_range(0..=4).unwrap_or(1);
                let f = nvme_ctrl::FormatState {
                    lbaf: u.arbitrary().unwrap_or(0),
                    dps: u.arbitrary().unwrap_or(0),
                    extended: u.arbitrary().unwrap_or(false),
                };
                (nsid, f)
            })
            .collect();
        c.restore_formats(&formats);
        c.stand_in_after_crash(state.regs.cc, Some(admin), Some(&state.ana));
        for _ in 0..4 {
            c.process();
        }
        c.device_reset();
        c.restore_state(&src.good)
            .unwrap_or_else(|e| panic!("a reset after a stand-in is not power-on: {e}"));
        return;
    }
    match c.restore_state(&state) {
        Err(_) => {
            stats.refused += 1;
            c.restore_state(&src.good)
                .unwrap_or_else(|e| panic!("a refused state left the controller changed: {e}"));
        }
        Ok(()) => {
            stats.accepted += 1;
            c.resume();
            for _ in 0..4 {
                c.process();
            }
            c.device_reset();
            c.restore_state(&src.good)
                .unwrap_or_else(|e| panic!("a reset after an accepted state is not power-on: {e}"));
        }
    }
}
