//! The wire between the ranks of a plan on the CPU: the only state ranks share. It holds the
//! boundaries' send slots (`tx`, the sender's buffer a copy reads, as peer memory would be),
//! how far each event has been recorded, and the deposit area of the tensor-parallel
//! collectives. Everything else a rank touches is its own.
//!
//! Every operation exists in a blocking form (pipelined arm: one thread per rank, waiting on
//! a condvar) and a non-blocking form (serial arm: one thread steps the ranks in plan order
//! and moves on from a rank that would wait). A rank that fails poisons the wire so that no
//! other rank waits forever.
//!
//! With one process per device (`crate::dist`), the ranks of other processes are reached
//! through the wire's `Remote`, and the ranks never know: a record goes to the processes that
//! wait on the event, a slot write straight into the receiving process's copy of the send
//! slots (the receiver only reads it after the `ready` record that follows it on the same
//! connection), a collective part to every process holding a taker. What other processes
//! send lands in this wire's state exactly as a local rank's operation would, so the event
//! binding, the slot rules and the tree combine are the in-process ones, bit for bit.

use std::collections::BTreeMap;
use std::sync::mpsc::Sender;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};

use anyhow::{anyhow, bail, Result};

pub use crate::dist::Payload;
use crate::dist::{Body, Deliver, Link, Part, Routes, Takers};
use crate::engine::StepOutput;

/// The other processes of the world, as one engine's wire reaches them.
pub struct Remote {
    /// The engine's connection to its peers in the other processes.
    pub link: Link,
    /// Where this process's records, slots and parts go.
    pub routes: Routes,
    /// The engine's output channel: a process without the readback rank takes each step's
    /// token from the readback process through it, and learns of the world's failure.
    pub outputs: Sender<Result<StepOutput>>,
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
    /// Messages taken from other processes, for a serial arm waiting for them.
    generation: u64,
    failure: Option<String>,
}

/// Shared state between ranks, behind one lock.
#[derive(Default)]
pub struct Wire {
    state: Mutex<State>,
    changed: Condvar,
    remote: Option<Remote>,
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
            remote: None,
        }
    }

    /// A wire whose ranks reach the other processes through `remote`, attached to its link.
    pub fn connected(
        boundaries: impl IntoIterator<Item = (u32, u32)>,
        remote: Remote,
    ) -> Arc<Wire> {
        let wire = Arc::new(Wire {
            remote: Some(remote),
            ..Wire::new(boundaries)
        });
        let remote = wire.remote.as_ref().expect("invariant: set above");
        remote
            .link
            .attach(Arc::downgrade(&wire) as std::sync::Weak<dyn Deliver>);
        wire
    }

    /// Whether some ranks of the plan run in other processes.
    pub fn is_remote(&self) -> bool {
        self.remote.is_some()
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // A rank that panicked while holding the lock left consistent data (every update is
        // a single insert), so the poison flag carries no information here.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Fails when another rank has failed.
    fn check(&self) -> Result<()> {
        match &self.lock().failure {
            Some(why) => bail!("stopped because another rank failed: {why}"),
            None => Ok(()),
        }
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

    /// Marks `event` recorded for decode step `step`, here and in the processes waiting on it.
    pub fn record(&self, event: &str, step: u64) -> Result<()> {
        self.until(true, |s| {
            s.recorded.insert(event.to_string(), step + 1);
            Ok(Some(()))
        })?;
        if let Some(r) = &self.remote {
            for &p in r.routes.waiters(event) {
                let event = event.to_string();
                r.link.send(p, Body::Record { event, step })?;
            }
        }
        Ok(())
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

    /// Writes `payload` into slot `slot` of boundary `boundary`'s send buffer (in the
    /// receiver's process when that is another).
    pub fn send(&self, boundary: u32, slot: u32, payload: Payload) -> Result<()> {
        if let Some(r) = &self.remote {
            if let Some(p) = r.routes.remote_receiver(boundary) {
                self.check()?;
                let body = Body::Slot {
                    boundary,
                    slot,
                    payload,
                };
                return r.link.send(p, body);
            }
        }
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

    /// Deposits member `index`'s part `data` of collective `seq` of `group` (of `members`
    /// ranks), to be taken by `takers`, wherever they run.
    pub fn contribute(
        &self,
        group: u32,
        seq: u64,
        index: usize,
        members: usize,
        takers: Takers,
        data: Vec<f32>,
    ) -> Result<()> {
        let mut part = Part {
            group,
            seq,
            index: index as u32,
            members: members as u32,
            takers: 0,
            data,
        };
        let here = match &self.remote {
            None => match takers {
                Takers::All => members,
                Takers::First => 1,
            },
            Some(r) => {
                let mut here = 0;
                for (p, n) in r.routes.takers(group, takers) {
                    if p == r.routes.me() {
                        here = n as usize;
                        continue;
                    }
                    let body = Body::Part(Part {
                        takers: n,
                        ..part.clone()
                    });
                    r.link.send(p, body)?;
                }
                here
            }
        };
        if here == 0 {
            return Ok(());
        }
        part.takers = here as u32;
        let mut part = Some(part);
        self.until(true, |s| {
            deposit(s, part.take().expect("invariant: deposited once"));
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

    /// Hands the readback's token of `out` to every other process.
    pub fn publish(&self, out: &StepOutput) -> Result<()> {
        match &self.remote {
            Some(r) => crate::dist::broadcast(&r.link, out),
            None => Ok(()),
        }
    }

    /// How many messages from other processes the wire has taken so far.
    pub fn generation(&self) -> u64 {
        self.lock().generation
    }

    /// Waits until a message from another process arrives after `seen` (see `generation`).
    pub fn await_change(&self, seen: u64) -> Result<()> {
        self.until(true, |s| Ok((s.generation != seen).then_some(())))
            .map(drop)
    }

    /// Stops every rank waiting on the wire; they fail naming `why`.
    pub fn fail(&self, why: &str) {
        let mut state = self.lock();
        state.failure.get_or_insert_with(|| why.to_string());
        self.changed.notify_all();
    }
}

/// Adds `part` to its collective, created for `part.takers` takers.
fn deposit(s: &mut State, part: Part) {
    let c = s
        .collectives
        .entry((part.group, part.seq))
        .or_insert_with(|| Collective {
            parts: vec![None; part.members as usize],
            takers_left: part.takers as usize,
        });
    if let Some(p) = c.parts.get_mut(part.index as usize) {
        *p = Some(part.data);
    }
}

impl Deliver for Wire {
    /// Applies another process's operation as a local rank's would be.
    fn deliver(&self, from: u32, body: Body) {
        let mut s = self.lock();
        match body {
            Body::Record { event, step } => {
                let n = s.recorded.entry(event).or_default();
                *n = (*n).max(step + 1);
            }
            Body::Slot {
                boundary,
                slot,
                payload,
            } => {
                let target =
                    s.tx.get_mut(&boundary)
                        .and_then(|slots| slots.get_mut(slot as usize));
                match target {
                    Some(t) => *t = Some(payload),
                    None => {
                        s.failure.get_or_insert_with(|| {
                            format!("process {from} wrote slot {slot} of boundary {boundary}, which this plan does not have; every process must run the same plan")
                        });
                    }
                }
            }
            Body::Part(part) => deposit(&mut s, part),
            Body::Token { step, pos, token } => {
                if let Some(r) = &self.remote {
                    let out = StepOutput {
                        step,
                        pos,
                        token,
                        logits: Vec::new(),
                        argmax: Vec::new(),
                    };
                    // A closed channel means the host stopped listening.
                    let _ = r.outputs.send(Ok(out));
                }
            }
        }
        s.generation += 1;
        self.changed.notify_all();
    }

    fn fail(&self, why: &str) {
        Wire::fail(self, why);
        if let Some(r) = &self.remote {
            let _ = r.outputs.send(Err(anyhow!("{why}")));
        }
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
        wire.contribute(0, 0, 1, 2, Takers::All, vec![2.0]).unwrap();
        assert!(wire.collect(0, 0, false).unwrap().is_none());
        wire.contribute(0, 0, 0, 2, Takers::All, vec![1.0]).unwrap();
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
