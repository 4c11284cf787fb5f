//! One process per device: the world of processes that run one plan together, and the
//! transport between them (localhost or network TCP, `std::net` only).
//!
//! A process joins the world once (`World::join`, see `join` for the rendezvous), then opens
//! engines on it: every process opens the same engines in the same order (the command's
//! host code is the same everywhere), so the `n`-th engine of each process is one engine of
//! the world, its epoch `n`. `World::open` is a barrier that also checks that every process
//! opened the same plan. An engine's wire sends `Body` messages to the same epoch in other
//! processes (`Link::send`) and receives theirs through `Deliver`; messages that arrive
//! before the engine attached wait in a queue, messages for a closed engine are dropped.
//!
//! The mesh is full: one TCP connection per pair of processes, one reader thread per
//! connection. Against a star through process 0 this saves a hop and a relay thread that
//! would serialize every process's traffic, and it gives per-pair FIFO order, which the
//! wire's semantics rest on: a slot's payload reaches the receiver before the `ready` record
//! that follows it, and a `consumed` record before the sender's next write into that slot.
//! Plans run on a handful of devices per host, so the mesh stays small.
//!
//! Endings: `finish` is a barrier (every process says `Bye` and waits for everyone's), so no
//! process leaves while another may still need it; `abort` tells the others why this process
//! fails. A connection that ends without `Bye` means its process died: every open engine
//! fails naming it, so no process waits forever.
//!
//! A backend plugs in at its engine: with `EngineOptions::world` set it runs the ranks
//! `ProcessMap::ranks` gives its process, opens a `Link` (`World::open`), routes what its
//! ranks share with `Routes`, implements `Deliver` for what arrives, and has the readback
//! process hand each step's token to the others (`Body::Token`). The CPU wire
//! (`crate::cpu::wire`) does all of it on host memory. Bytes a backend exchanges out of band
//! (an NCCL unique id) go through `World::share`. `launcher` reads which process this is
//! from the variables a site's launcher (srun, mpirun, torchrun) sets.

mod frame;
mod join;
pub mod launcher;
mod routes;
mod tokens;

#[cfg(test)]
pub(crate) use routes::tests::two_ranks_per_device;

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::io::BufReader;
use std::net::{Shutdown, TcpStream};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, Weak};

use anyhow::{anyhow, bail, Result};
use memra_compiler::plan::Plan;

pub use frame::{Body, Part, Payload};
pub use join::{JOIN_TIMEOUT, LISTENING};
pub use routes::{ProcessMap, Routes, Takers};
pub use tokens::{broadcast, TokenInbox};

use frame::Msg;

/// The exit status of a process that stopped because another process of its world failed
/// or died, so that `launch` can tell the cause from its victims.
pub const PEER_FAILED: u8 = 3;

/// An engine's end of the world: what it does with messages from other processes.
pub trait Deliver: Send + Sync {
    /// A message from process `from` to this engine, in the order `from` sent it.
    fn deliver(&self, from: u32, body: Body);
    /// The world broke (a process failed or died); every wait must end with `why`.
    fn fail(&self, why: &str);
}

/// This process's membership in a world of processes.
#[derive(Clone)]
pub struct World {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for World {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "process {} of {}",
            self.inner.process, self.inner.processes
        )
    }
}

struct Inner {
    process: u32,
    processes: u32,
    /// The sending side of each connection, by process (`None` at this process).
    writers: Vec<Option<Mutex<TcpStream>>>,
    state: Mutex<State>,
    changed: Condvar,
}

#[derive(Default)]
struct State {
    /// The epoch the next `open` takes.
    next_epoch: u64,
    /// Epochs opened here or announced by a message, not yet closed.
    epochs: BTreeMap<u64, Epoch>,
    /// Plans other processes opened, by (epoch, process).
    opens: BTreeMap<(u64, u32), String>,
    /// Shared bytes not yet taken, by sending process.
    shared: BTreeMap<u32, VecDeque<Vec<u8>>>,
    /// Processes that said `Bye`.
    byes: BTreeSet<u32>,
    /// This process is closing its connections; their ends are expected.
    closing: bool,
    /// Why the world broke.
    dead: Option<String>,
}

enum Epoch {
    /// Messages that came before the engine attached, in arrival order.
    Pending(Vec<(u32, Body)>),
    /// The engine's wire.
    Attached(Weak<dyn Deliver>),
}

impl World {
    /// Joins the world of `processes` processes as `process`, meeting at `rendezvous`.
    pub fn join(process: u32, processes: u32, rendezvous: &str) -> Result<World> {
        let streams = join::join(process, processes, rendezvous)?;
        let mut writers = Vec::new();
        let mut readers = Vec::new();
        for (q, s) in streams.into_iter().enumerate() {
            match s {
                Some(s) => {
                    writers.push(Some(Mutex::new(s.try_clone()?)));
                    readers.push((q as u32, s));
                }
                None => writers.push(None),
            }
        }
        let inner = Arc::new(Inner {
            process,
            processes,
            writers,
            state: Mutex::new(State::default()),
            changed: Condvar::new(),
        });
        for (q, s) in readers {
            let inner = inner.clone();
            std::thread::Builder::new()
                .name(format!("memra-peer-{q}"))
                .spawn(move || inner.read_from(q, s))
                .map_err(|e| anyhow!("cannot start the reader of process {q}: {e}"))?;
        }
        Ok(World { inner })
    }

    /// This process's index.
    pub fn process(&self) -> u32 {
        self.inner.process
    }

    /// Number of processes.
    pub fn processes(&self) -> u32 {
        self.inner.processes
    }

    /// Whether this process holds `plan`'s readback rank (and so its logits and its output).
    pub fn holds_readback(&self, plan: &Plan) -> bool {
        ProcessMap::of(plan).reader() == Some(self.inner.process)
    }

    fn others(&self) -> impl Iterator<Item = u32> + '_ {
        (0..self.inner.processes).filter(|&q| q != self.inner.process)
    }

    /// Opens the next engine of the world on `plan`: waits until every process opened it and
    /// refuses a process that opened another plan.
    pub fn open(&self, plan: &Plan) -> Result<Link> {
        let id = format!(
            "placement {} of model {}",
            plan.placement_hash, plan.model.fingerprint
        );
        let epoch = {
            let mut st = self.inner.lock();
            if let Some(why) = &st.dead {
                bail!("{why}");
            }
            let epoch = st.next_epoch;
            st.next_epoch += 1;
            st.epochs
                .entry(epoch)
                .or_insert_with(|| Epoch::Pending(Vec::new()));
            epoch
        };
        // Made first so that an early return closes the epoch.
        let link = Link {
            world: self.clone(),
            epoch,
        };
        for q in self.others() {
            self.inner.send(
                q,
                &Msg::Open {
                    epoch,
                    plan: id.clone(),
                },
            )?;
        }
        let mut st = self.inner.lock();
        loop {
            if let Some(why) = &st.dead {
                bail!("{why}");
            }
            let missing = self.others().find(|&q| !st.opens.contains_key(&(epoch, q)));
            match missing {
                None => break,
                Some(q) if st.byes.contains(&q) => bail!(
                    "process {q} finished its command while this one opens engine {epoch}; every process must run the same command"
                ),
                Some(_) => st = self.inner.wait(st),
            }
        }
        for q in self.others() {
            let theirs = st.opens.remove(&(epoch, q)).unwrap_or_default();
            if theirs != id {
                bail!("process {q} runs {theirs} as engine {epoch}, this process {id}; every process must run the same plan and command");
            }
        }
        Ok(link)
    }

    /// Hands `bytes` from process `root` to every process: `root` passes `Some`, the others
    /// `None`; everyone gets root's bytes, in the order root shared them.
    pub fn share(&self, root: u32, bytes: Option<Vec<u8>>) -> Result<Vec<u8>> {
        if self.inner.process == root {
            let bytes = bytes.expect("invariant: the root shares its bytes");
            for q in self.others() {
                self.inner.send(
                    q,
                    &Msg::Share {
                        bytes: bytes.clone(),
                    },
                )?;
            }
            return Ok(bytes);
        }
        let mut st = self.inner.lock();
        loop {
            if let Some(why) = &st.dead {
                bail!("{why}");
            }
            if let Some(b) = st.shared.get_mut(&root).and_then(VecDeque::pop_front) {
                return Ok(b);
            }
            if st.byes.contains(&root) {
                bail!("process {root} finished without sharing what this process waits for");
            }
            st = self.inner.wait(st);
        }
    }

    /// Ends this process's part after its command succeeded: waits until every process has
    /// finished too, then closes the connections.
    pub fn finish(&self) -> Result<()> {
        for q in self.others() {
            self.inner.send(q, &Msg::Bye)?;
        }
        let mut st = self.inner.lock();
        loop {
            if let Some(why) = &st.dead {
                bail!("{why}");
            }
            if self.others().all(|q| st.byes.contains(&q)) {
                break;
            }
            st = self.inner.wait(st);
        }
        st.closing = true;
        drop(st);
        self.inner.close();
        Ok(())
    }

    /// Whether another process failed or died (and this process's failure followed from it).
    pub fn is_broken(&self) -> bool {
        self.inner.lock().dead.is_some()
    }

    /// Ends this process's part after its command failed: tells the others why (those still
    /// connected, when the world is broken already).
    pub fn abort(&self, why: &str) {
        self.inner.lock().closing = true;
        for q in self.others() {
            // The others learn of this process's end from the closed connection anyway.
            let _ = self.inner.write(q, &Msg::Abort { why: why.into() });
        }
        self.inner.close();
    }
}

/// One engine's connection to the same engine in the other processes; dropping it closes
/// the engine's epoch.
pub struct Link {
    world: World,
    epoch: u64,
}

impl Link {
    /// This process's index.
    pub fn process(&self) -> u32 {
        self.world.process()
    }

    /// The other processes of the world.
    pub fn others(&self) -> Vec<u32> {
        self.world.others().collect()
    }

    /// Hands the engine's messages to `to`, first those that came before.
    pub fn attach(&self, to: Weak<dyn Deliver>) {
        let target = to.upgrade();
        let mut st = self.world.inner.lock();
        let before = st.epochs.insert(self.epoch, Epoch::Attached(to));
        if let Some(d) = &target {
            if let Some(Epoch::Pending(list)) = before {
                list.into_iter()
                    .for_each(|(from, body)| d.deliver(from, body));
            }
            if let Some(why) = &st.dead {
                d.fail(why);
            }
        }
        drop(st);
    }

    /// Sends `body` to the engine in process `to`.
    pub fn send(&self, to: u32, body: Body) -> Result<()> {
        self.world.inner.send(
            to,
            &Msg::Engine {
                epoch: self.epoch,
                body,
            },
        )
    }
}

impl Drop for Link {
    fn drop(&mut self) {
        self.world.inner.lock().epochs.remove(&self.epoch);
    }
}

impl Inner {
    fn lock(&self) -> MutexGuard<'_, State> {
        // Every update under the lock is a single insert or removal, so a panic elsewhere
        // leaves consistent state.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn wait<'a>(&self, st: MutexGuard<'a, State>) -> MutexGuard<'a, State> {
        self.changed.wait(st).unwrap_or_else(|e| e.into_inner())
    }

    fn send(&self, to: u32, msg: &Msg) -> Result<()> {
        if let Some(why) = &self.lock().dead {
            bail!("{why}");
        }
        self.write(to, msg)
    }

    /// Sends `msg` even to a broken world (a failure report).
    fn write(&self, to: u32, msg: &Msg) -> Result<()> {
        let writer = self.writers[to as usize]
            .as_ref()
            .expect("invariant: a process does not send to itself");
        let sent = frame::write(&mut *writer.lock().unwrap_or_else(|e| e.into_inner()), msg);
        sent.map_err(|e| {
            let why = format!("cannot send to process {to}: {e}");
            self.die(&why);
            anyhow!(why)
        })
    }

    /// Reads process `from`'s messages until its connection ends; an end before its `Bye`
    /// breaks the world.
    fn read_from(self: Arc<Self>, from: u32, stream: TcpStream) {
        let mut r = BufReader::new(stream);
        let why = loop {
            match frame::read(&mut r) {
                Ok(Some(msg)) => self.receive(from, msg),
                Ok(None) => {
                    break format!(
                        "process {from} ended without finishing (it failed or was killed)"
                    )
                }
                Err(e) => break format!("the connection to process {from} broke: {e:#}"),
            }
        };
        let st = self.lock();
        if !st.byes.contains(&from) && !st.closing {
            drop(st);
            self.die(&why);
        }
    }

    fn receive(&self, from: u32, msg: Msg) {
        // An engine dropped by its last reference must not close its epoch under this lock.
        let mut keep: Option<Arc<dyn Deliver>> = None;
        let mut st = self.lock();
        match msg {
            Msg::Engine { epoch, body } => {
                let next = st.next_epoch;
                match st.epochs.get_mut(&epoch) {
                    Some(Epoch::Pending(list)) => list.push((from, body)),
                    Some(Epoch::Attached(to)) => {
                        if let Some(d) = to.upgrade() {
                            d.deliver(from, body);
                            keep = Some(d);
                        }
                    }
                    None if epoch >= next => {
                        st.epochs.insert(epoch, Epoch::Pending(vec![(from, body)]));
                    }
                    // The engine is closed here: what it no longer needs is dropped.
                    None => {}
                }
            }
            Msg::Open { epoch, plan } => {
                st.opens.insert((epoch, from), plan);
            }
            Msg::Share { bytes } => st.shared.entry(from).or_default().push_back(bytes),
            Msg::Bye => {
                st.byes.insert(from);
            }
            Msg::Abort { why } => {
                drop(st);
                self.die(&format!("process {from} failed: {why}"));
                return;
            }
            Msg::Hello { .. } | Msg::Table { .. } => {
                drop(st);
                self.die(&format!("process {from} sent a handshake after joining"));
                return;
            }
        }
        self.changed.notify_all();
        drop(st);
        drop(keep);
    }

    /// The world broke: every open engine and every waiter fails with `why`.
    fn die(&self, why: &str) {
        let mut keep = Vec::new();
        let mut st = self.lock();
        if st.dead.is_none() {
            st.dead = Some(why.to_string());
            for e in st.epochs.values() {
                if let Epoch::Attached(to) = e {
                    if let Some(d) = to.upgrade() {
                        d.fail(why);
                        keep.push(d);
                    }
                }
            }
        }
        self.changed.notify_all();
        drop(st);
        drop(keep);
    }

    fn close(&self) {
        for w in self.writers.iter().flatten() {
            let _ = w
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .shutdown(Shutdown::Both);
        }
    }
}
