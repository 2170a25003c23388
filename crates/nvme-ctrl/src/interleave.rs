//! Exhaustive exploration of a small model's interleavings (stateless model
//! checking): each execution runs the model from its start, and every choice it
//! makes (which side takes the next step, whether a store leaves a store buffer)
//! comes from [`Choices::choose`]. The first execution takes the first option
//! everywhere; each next one replays the previous choices up to the last point that
//! had an option left, and takes that option. So every sequence of choices the
//! model can make is run exactly once, and a failure comes with the sequence that
//! produced it.
//!
//! The model bounds its own search (how many times it lets one side interrupt the
//! other, say) by offering a single option where it wants none: a choice of one is
//! not recorded.

/// The choices of one execution.
#[derive(Debug)]
pub struct Choices<'a> {
    /// (taken, options) at every point with more than one option, in order.
    path: &'a mut Vec<(usize, usize)>,
    at: usize,
}

impl Choices<'_> {
    /// One of `n` options (`n` ≥ 1).
    pub fn choose(&mut self, n: usize) -> usize {
        assert!(n >= 1, "a choice needs an option");
        if n == 1 {
            return 0;
        }
        let c = match self.path.get(self.at) {
            Some(&(c, m)) => {
                assert_eq!(
                    m, n,
                    "the model is not deterministic: choice {} had {m} options, now {n}",
                    self.at
                );
                c
            }
            None => {
                self.path.push((0, n));
                0
            }
        };
        self.at += 1;
        c
    }

    /// Decides a yes/no choice (false first).
    pub fn flip(&mut self) -> bool {
        self.choose(2) == 1
    }
}

/// What an exploration ran.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Explored {
    /// Executions, one per distinct sequence of choices.
    pub executions: u64,
    /// The most choices one execution made.
    pub deepest: usize,
}

/// A failed execution: the model's message and the options it took.
#[derive(Clone, Debug)]
pub struct Failure {
    pub message: String,
    pub choices: Vec<usize>,
    /// Executions run before this one.
    pub after: u64,
}

impl std::fmt::Display for Failure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} (execution {}, choices {:?})", self.message, self.after + 1, self.choices)
    }
}

/// Runs `model` once for every sequence of choices it can make, up to `limit`
/// executions (a model too big for its bound fails instead of running forever).
pub fn explore(
    limit: u64,
    mut model: impl FnMut(&mut Choices) -> Result<(), String>,
) -> Result<Explored, Failure> {
    let mut path: Vec<(usize, usize)> = Vec::new();
    let mut done = Explored { executions: 0, deepest: 0 };
    loop {
        let mut ch = Choices { path: &mut path, at: 0 };
        let result = model(&mut ch);
        let used = ch.at;
        path.truncate(used);
        if let Err(message) = result {
            return Err(Failure {
                message,
                choices: path.iter().map(|c| c.0).collect(),
                after: done.executions,
            });
        }
        done.executions += 1;
        done.deepest = done.deepest.max(used);
        // The next sequence: the last choice with an option left takes it.
        loop {
            match path.pop() {
                None => return Ok(done),
                Some((c, n)) if c + 1 < n => {
                    path.push((c + 1, n));
                    break;
                }
                Some(_) => {}
            }
        }
        if done.executions >= limit {
            return Err(Failure {
                message: format!("more than {limit} executions: bound the model tighter"),
                choices: Vec::new(),
                after: done.executions,
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_sequence_of_choices_runs_once() {
        let mut seen = std::collections::BTreeSet::new();
        let r = explore(100, |ch| {
            let a = ch.choose(3);
            let b = if a == 1 { ch.choose(2) } else { 0 };
            let c = ch.flip();
            assert!(seen.insert((a, b, c)), "ran twice: {:?}", (a, b, c));
            Ok(())
        })
        .unwrap();
        // a = 0 or 2: 2 × 2; a = 1: 2 × 2.
        assert_eq!(r.executions, 8);
        assert_eq!(seen.len(), 8);
        assert_eq!(r.deepest, 3);
    }

    #[test]
    fn a_failure_names_the_choices_that_led_to_it() {
        let f = explore(100, |ch| {
            let (a, b) = (ch.choose(3), ch.choose(3));
            if (a, b) == (2, 1) {
                return Err("found".into());
            }
            Ok(())
        })
        .unwrap_err();
        assert_eq!(f.choices, [2, 1]);
        assert_eq!(f.after, 7);
        assert!(f.to_string().contains("found"));
    }

    #[test]
    fn a_model_past_its_limit_fails() {
        let f = explore(10, |ch| {
            for _ in 0..8 {
                ch.flip();
            }
            Ok(())
        })
        .unwrap_err();
        assert!(f.message.contains("more than 10"), "{f}");
    }
}
