//! Inputs for the stable runner: a seeded PRNG, fresh random programs, and
//! mutations of corpus entries at the byte and at the action level.

use crate::program::{Action, Codec, Program, Reader, Setup, MAX_ACTIONS};

pub use test_util::Rng;

/// FNV-1a, for naming crash files after their contents.
pub fn fnv1a(data: &[u8]) -> u64 {
    data.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, &b| (h ^ b as u64).wrapping_mul(0x100_0000_01b3))
}

/// A fresh random input: random bytes are always a valid program.
pub fn random_input(rng: &mut Rng) -> Vec<u8> {
    let max = 1 + rng.below(1500);
    let len = 24 + rng.below(max) as usize;
    let mut v = vec![0u8; len];
    rng.fill(&mut v);
    v
}

/// A fresh random program: half "chaos" (every action kind, raw bytes), half
/// "clean" (a Linux-like bring-up, then mostly valid commands, reaps and drains, so
/// the completion and drain invariants stay armed for longer).
pub fn random_program(rng: &mut Rng) -> Vec<u8> {
    if rng.below(2) == 0 {
        return random_input(rng);
    }
    let mut bytes = [0u8; 96];
    rng.fill(&mut bytes);
    let mut setup = Setup::decode(&mut Reader::new(&bytes));
    if rng.below(8) != 0 {
        // Bring-up, and I/O on 0, 1 or 2 workers.
        setup.do_init = 1 | (rng.below(3) as u8) << 1;
    }
    let n = 1 + rng.below(MAX_ACTIONS as u64) as usize;
    let mut actions = Vec::with_capacity(n);
    // A few raw actions now and then still mix chaos into clean runs.
    let chaos = rng.below(4) == 0;
    while actions.len() < n {
        rng.fill(&mut bytes);
        let mut a = Action::decode(&mut Reader::new(&bytes));
        if (chaos && rng.below(16) == 0) || make_clean(&mut a, rng) {
            actions.push(a);
        }
    }
    Program { setup, actions }.encode()
}

/// Turns `a` into an action that keeps host and controller in agreement, or false.
fn make_clean(a: &mut Action, rng: &mut Rng) -> bool {
    let keep_mutation = rng.below(8) == 0;
    match a {
        Action::Io(c) if !keep_mutation => c.mutation.kind %= 12,
        Action::Admin(c) => {
            // No wild DBBUF; deletes and mutations taint, so keep them rare.
            if c.op % 15 == 11 || (matches!(c.op % 15, 6 | 7) && rng.below(4) != 0) {
                c.op = 0;
            }
            if !keep_mutation {
                c.mutation.kind %= 12;
            }
        }
        Action::Doorbell(d) => d.kind |= 0x10,
        Action::Shadow(s) => s.which |= 2,
        Action::Cc(c) => c.op = [2, 3, 5, 7][c.op as usize % 4],
        Action::Memory(_) => return rng.below(4) == 0,
        Action::Reg(r) => r.reg = 4 + r.reg % 4,
        // A path out of service refuses all I/O: bring it back as often.
        Action::Ana(a) if rng.below(2) == 0 => a.state = 0,
        Action::AdminRaw(_) | Action::IoRaw(_) | Action::Ring(_) | Action::Scribble(_) => return false,
        _ => {}
    }
    true
}

/// A mutated copy of `base`, sometimes spliced with `other`.
pub fn mutate(rng: &mut Rng, base: &[u8], other: &[u8]) -> Vec<u8> {
    let mut v = base.to_vec();
    for _ in 0..1 + rng.below(4) {
        match rng.below(9) {
            0 | 1 => {
                // Flip a few bytes.
                for _ in 0..1 + rng.below(8) {
                    if !v.is_empty() {
                        let i = rng.below(v.len() as u64) as usize;
                        v[i] ^= 1 << rng.below(8);
                    }
                }
            }
            2 => {
                // Overwrite a range with random bytes.
                if !v.is_empty() {
                    let i = rng.below(v.len() as u64) as usize;
                    let n = (1 + rng.below(32) as usize).min(v.len() - i);
                    rng.fill(&mut v[i..i + n]);
                }
            }
            3 => {
                // Append random actions' worth of bytes.
                let mut tail = vec![0u8; 1 + rng.below(200) as usize];
                rng.fill(&mut tail);
                v.extend_from_slice(&tail);
            }
            4 => {
                // Splice: a prefix of this input and a suffix of another.
                let i = rng.below(v.len() as u64 + 1) as usize;
                let j = rng.below(other.len() as u64 + 1) as usize;
                v.truncate(i);
                v.extend_from_slice(&other[j..]);
            }
            5 => {
                let i = rng.below(v.len() as u64 + 1) as usize;
                v.truncate(i.max(24));
            }
            _ => v = mutate_actions(rng, &v, other),
        }
    }
    v
}

/// Action-level edits: drop, duplicate, swap, or borrow an action from `other`.
fn mutate_actions(rng: &mut Rng, base: &[u8], other: &[u8]) -> Vec<u8> {
    let mut p = Program::decode(base);
    let o = Program::decode(other);
    let n = p.actions.len();
    match rng.below(5) {
        0 if n > 0 => {
            p.actions.remove(rng.below(n as u64) as usize);
        }
        1 if n > 0 && n < MAX_ACTIONS => {
            let i = rng.below(n as u64) as usize;
            let a = p.actions[i];
            p.actions.insert(rng.below(n as u64 + 1) as usize, a);
        }
        2 if n > 1 => {
            let (i, j) = (rng.below(n as u64) as usize, rng.below(n as u64) as usize);
            p.actions.swap(i, j);
        }
        3 if !o.actions.is_empty() && n < MAX_ACTIONS => {
            let a = o.actions[rng.below(o.actions.len() as u64) as usize];
            p.actions.insert(rng.below(n as u64 + 1) as usize, a);
        }
        _ => p.setup = if rng.below(2) == 0 { o.setup } else { p.setup },
    }
    p.encode()
}
