//! The wire between the ranks of a plan on the CPU: the only state ranks share. It holds the
//! boundaries' send slots (`tx`, the sender's buffer a copy reads, as peer memory would be),
//! how far each event has been recorded, and the deposit area of the tensor-parallel
//! collectives. Everything else a rank touches is its own.
//!
//! Every operation exists in a blocking form (pipelined arm: one thread per rank, waiting on
//! a condvar) and a non-blocking form (serial arm: one thread steps the ranks in plan order
//! and moves on from a rank that would wait). A rank that fails poisons the wire so that no
//! other rank waits forever.

use std::collections::BTreeMap;
use std::sync::{Condvar, Mutex, MutexGuard};

use anyhow::{anyhow, bail, Result};

/// What a boundary slot holds.
#[derive(Debug, Clone, PartialEq)]
pub enum Payload {
    /// The residual stream.
    Hidden(Vec<f32>),
    /// A sampled token.
    Token(u32),
}

/// Contributions to one collective (one all-reduce or one logits gather).
#[derive(Debug)]
struct Collective {
    parts: Vec<Option<Vec<f32>>>,
    /// Ranks that still have to take the parts; the entry is dropped at zero.
    takers_left: usize,
}

#[derive(Debug, Default)]
struct State {
    /// Per event: how many decode steps have recorded it (records come in step order).
    recorded: BTreeMap<String, u64>,
    /// Per boundary: its send slots.
    tx: BTreeMap<u32, Vec<Option<Payload>>>,
    /// Per (group, collective sequence number).
    collectives: BTreeMap<(u32, u64), Collective>,
    failure: Option<String>,
}

/// Shared state between ranks, behind one lock.
#[derive(Debug, Default)]
pub struct Wire {
    state: Mutex<State>,
    changed: Condvar,
}

impl Wire {
    /// A wire with `slots` empty send slots for each `(boundary, slots)`.
    pub fn new(boundaries: impl IntoIterator<Item = (u32, u32)>) -> Wire {
        let tx = boundaries
            .into_iter()
            .map(|(b, slots)| (b, vec![None; slots as usize]))
            .collect();
        Wire {
            state: Mutex::new(State {
                tx,
                ..State::default()
            }),
            changed: Condvar::new(),
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // A rank that panicked while holding the lock left consistent data (every update is
        // a single insert), so the poison flag carries no information here.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Runs `ready` under the lock until it yields a value; without `block`, gives up at once
    /// (returns `None`) when it does not.
    fn until<T>(
        &self,
        block: bool,
        mut ready: impl FnMut(&mut State) -> Result<Option<T>>,
    ) -> Result<Option<T>> {
        let mut state = self.lock();
        loop {
            if let Some(why) = &state.failure {
                bail!("stopped because another rank failed: {why}");
            }
            if let Some(value) = ready(&mut state)? {
                self.changed.notify_all();
                return Ok(Some(value));
            }
            if !block {
                return Ok(None);
            }
            state = self.changed.wait(state).unwrap_or_else(|e| e.into_inner());
        }
    }

    /// Marks `event` recorded for decode step `step`.
    pub fn record(&self, event: &str, step: u64) -> Result<()> {
        self.until(true, |s| {
            s.recorded.insert(event.to_string(), step + 1);
            Ok(Some(()))
        })
        .map(drop)
    }

    /// Whether `event` has been recorded for decode step `step` (waiting for it when `block`).
    pub fn wait(&self, event: &str, step: u64, block: bool) -> Result<bool> {
        let done = self.until(block, |s| {
            Ok(s.recorded
                .get(event)
                .is_some_and(|&n| n > step)
                .then_some(()))
        })?;
        Ok(done.is_some())
    }

    /// Writes `payload` into slot `slot` of boundary `boundary`'s send buffer.
    pub fn send(&self, boundary: u32, slot: u32, payload: Payload) -> Result<()> {
        self.until(true, |s| {
            let slots =
                s.tx.get_mut(&boundary)
                    .ok_or_else(|| anyhow!("boundary {boundary} is not declared"))?;
            slots[slot as usize] = Some(payload.clone());
            Ok(Some(()))
        })
        .map(drop)
    }

    /// A copy of slot `slot` of boundary `boundary`'s send buffer (`None` before any send).
    pub fn read_slot(&self, boundary: u32, slot: u32) -> Result<Option<Payload>> {
        let mut state = self.lock();
        let slots = state
            .tx
            .get_mut(&boundary)
            .ok_or_else(|| anyhow!("boundary {boundary} is not declared"))?;
        Ok(slots[slot as usize].clone())
    }

    /// Deposits member `index`'s part of collective `seq` of `group` (of `members` ranks), to
    /// be taken by `takers` ranks.
    pub fn contribute(
        &self,
        group: u32,
        seq: u64,
        index: usize,
        members: usize,
        takers: usize,
        part: Vec<f32>,
    ) -> Result<()> {
        let mut part = Some(part);
        self.until(true, |s| {
            let c = s
                .collectives
                .entry((group, seq))
                .or_insert_with(|| Collective {
                    parts: vec![None; members],
                    takers_left: takers,
                });
            c.parts[index] = part.take();
            Ok(Some(()))
        })
        .map(drop)
    }

    /// All parts of collective `seq` of `group`, once every member has contributed.
    pub fn collect(&self, group: u32, seq: u64, block: bool) -> Result<Option<Vec<Vec<f32>>>> {
        self.until(block, |s| {
            let Some(c) = s.collectives.get_mut(&(group, seq)) else {
                return Ok(None);
            };
            if c.parts.iter().any(Option::is_none) {
                return Ok(None);
            }
            let parts = c
                .parts
                .iter()
                .map(|p| p.clone().expect("invariant: checked above"))
                .collect();
            c.takers_left -= 1;
            if c.takers_left == 0 {
                s.collectives.remove(&(group, seq));
            }
            Ok(Some(parts))
        })
    }

    /// Stops every rank waiting on the wire; they fail naming `why`.
    pub fn fail(&self, why: &str) {
        let mut state = self.lock();
        state.failure.get_or_insert_with(|| why.to_string());
        self.changed.notify_all();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn waits_see_records_of_their_step() {
        let wire = Wire::new([(0, 2)]);
        assert!(!wire.wait("b0.ready", 0, false).unwrap());
        wire.record("b0.ready", 0).unwrap();
        assert!(wire.wait("b0.ready", 0, false).unwrap());
        assert!(!wire.wait("b0.ready", 1, false).unwrap());
    }

    #[test]
    fn collectives_complete_once_all_contributed() {
        let wire = Wire::new([]);
        wire.contribute(0, 0, 1, 2, 2, vec![2.0]).unwrap();
        assert!(wire.collect(0, 0, false).unwrap().is_none());
        wire.contribute(0, 0, 0, 2, 2, vec![1.0]).unwrap();
        assert_eq!(
            wire.collect(0, 0, false).unwrap().unwrap(),
            vec![vec![1.0], vec![2.0]]
        );
        assert!(wire.collect(0, 0, true).unwrap().is_some());
        assert!(wire.collect(0, 0, false).unwrap().is_none());
    }

    #[test]
    fn a_failure_releases_waiters() {
        let wire = std::sync::Arc::new(Wire::new([]));
        let waiter = {
            let wire = wire.clone();
            std::thread::spawn(move || wire.wait("never", 0, true))
        };
        wire.fail("rank 1 broke");
        let err = waiter.join().unwrap().unwrap_err().to_string();
        assert!(err.contains("rank 1 broke"), "{err}");
    }
}
