//! A persistent thread pool for the CPU kernels. A decode step issues ~200 matvecs of tens of
//! microseconds each, so workers spin on a shared state word between jobs instead of being
//! spawned or woken through the OS every time; after a few milliseconds idle they park on a
//! condvar so that an idle pool costs nothing. The calling thread works too.
//!
//! A job is a number of tasks that threads claim one at a time, so a thread the OS has
//! descheduled (a busy machine) delays a job by one small task, not by a fixed share.

use std::cell::UnsafeCell;
use std::panic::{catch_unwind, resume_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// How long an idle worker spins before parking: longer than the serial work between two
/// matvecs of one token (norms, rope, attention), shorter than anything a person notices.
const SPIN: Duration = Duration::from_millis(3);

/// Tasks per thread in `split_mut`: enough to rebalance around a descheduled thread, few
/// enough that claiming costs nothing next to a task.
const TASKS_PER_THREAD: usize = 4;

/// Largest task count of one job (it shares a 16-bit field of the state word).
const MAX_TASKS: usize = 0xffff;

/// The job as the workers see it: a borrowed closure whose lifetime `run` guarantees by not
/// returning before every claimed task has finished.
type Job = *const (dyn Fn(usize) + Sync);

struct Shared {
    /// generation (32 bits) | tasks (16) | next unclaimed task (16): one word, so a claim
    /// (a compare-exchange) can never take a task of a job other than the one it checked
    state: AtomicU64,
    finished: AtomicUsize,
    sleepers: AtomicUsize,
    stop: AtomicBool,
    panicked: AtomicBool,
    job: UnsafeCell<Option<Job>>,
    park: Mutex<()>,
    wake: Condvar,
}

// SAFETY: `job` is written only by the thread inside `run` (serialized by `Pool::caller`)
// before the state word publishes the job, and read only by a thread that has claimed one of
// its tasks through that word; `run` does not return (nor overwrite it) before every claimed
// task has finished.
unsafe impl Sync for Shared {}
unsafe impl Send for Shared {}

/// A fixed set of threads that run one job at a time; `run` blocks until all have finished.
pub struct Pool {
    shared: Arc<Shared>,
    workers: Vec<JoinHandle<()>>,
    caller: Mutex<()>,
}

impl Pool {
    /// A pool of `threads` threads in total, counting the caller (so `new(1)` spawns none).
    pub fn new(threads: usize) -> Pool {
        let shared = Arc::new(Shared {
            state: AtomicU64::new(0),
            finished: AtomicUsize::new(0),
            sleepers: AtomicUsize::new(0),
            stop: AtomicBool::new(false),
            panicked: AtomicBool::new(false),
            job: UnsafeCell::new(None),
            park: Mutex::new(()),
            wake: Condvar::new(),
        });
        let workers = (1..threads.max(1))
            .map(|index| {
                let shared = Arc::clone(&shared);
                std::thread::Builder::new()
                    .name(format!("memra-cpu-{index}"))
                    .spawn(move || worker(&shared))
                    .expect("invariant: the OS can spawn a kernel thread")
            })
            .collect();
        Pool {
            shared,
            workers,
            caller: Mutex::new(()),
        }
    }

    /// Number of threads, the caller included.
    pub fn threads(&self) -> usize {
        self.workers.len() + 1
    }

    /// Runs `f(t)` for every task `t` in `0..tasks` (at most 65535) across the pool's
    /// threads, the caller included, and returns when all have returned. A panic in any
    /// task is re-raised here.
    pub fn run(&self, tasks: usize, f: &(dyn Fn(usize) + Sync)) {
        assert!(tasks <= MAX_TASKS, "pool: {tasks} tasks exceed {MAX_TASKS}");
        if self.workers.is_empty() || tasks <= 1 {
            return (0..tasks).for_each(f);
        }
        let _serial = self.caller.lock().unwrap_or_else(|e| e.into_inner());
        let s = &*self.shared;
        s.finished.store(0, Ordering::Relaxed);
        // SAFETY: the lifetime is erased only while this call runs; it returns only after
        // every claimed task has finished
        let job: Job = unsafe { std::mem::transmute::<&(dyn Fn(usize) + Sync), Job>(f) };
        unsafe { *s.job.get() = Some(job) };
        let generation = (s.state.load(Ordering::Relaxed) >> 32).wrapping_add(1) & 0xffff_ffff;
        s.state
            .store(generation << 32 | (tasks as u64) << 16, Ordering::SeqCst);
        if s.sleepers.load(Ordering::SeqCst) > 0 {
            let _g = s.park.lock().unwrap_or_else(|e| e.into_inner());
            s.wake.notify_all();
        }
        let mine = catch_unwind(AssertUnwindSafe(|| claim_and_run(s, generation)));
        let mut spins = 0u32;
        while s.finished.load(Ordering::Acquire) < tasks {
            spins += 1;
            if spins < 1 << 12 {
                std::hint::spin_loop();
            } else {
                // the thread holding the last task is likely descheduled: let it run
                std::thread::yield_now();
            }
        }
        unsafe { *s.job.get() = None };
        if let Err(p) = mine {
            resume_unwind(p);
        }
        if s.panicked.swap(false, Ordering::Relaxed) {
            panic!("a cpu kernel panicked on a pool thread");
        }
    }

    /// Splits `out` into contiguous pieces, each a multiple of `unit` elements long (except
    /// the last), and runs `f(offset, piece)` for every piece in parallel.
    pub fn split_mut<T: Send>(
        &self,
        out: &mut [T],
        unit: usize,
        f: &(dyn Fn(usize, &mut [T]) + Sync),
    ) {
        let n = out.len();
        let units = n.div_ceil(unit);
        let tasks = units.min(self.threads() * TASKS_PER_THREAD);
        let base = SendPtr(out.as_mut_ptr());
        self.run(tasks, &|t| {
            let start = (units * t / tasks * unit).min(n);
            let end = (units * (t + 1) / tasks * unit).min(n);
            if start < end {
                // SAFETY: the ranges [start, end) of distinct tasks are disjoint and inside
                // `out`, which `run` keeps borrowed until every task is done
                let piece =
                    unsafe { std::slice::from_raw_parts_mut(base.get().add(start), end - start) };
                f(start, piece);
            }
        });
    }
}

/// A raw pointer that may cross threads; `split_mut` hands out disjoint ranges of it.
struct SendPtr<T>(*mut T);
unsafe impl<T: Send> Sync for SendPtr<T> {}
impl<T> SendPtr<T> {
    fn get(&self) -> *mut T {
        self.0
    }
}

impl Drop for Pool {
    fn drop(&mut self) {
        let s = &*self.shared;
        s.stop.store(true, Ordering::SeqCst);
        let generation = (s.state.load(Ordering::Relaxed) >> 32).wrapping_add(1) & 0xffff_ffff;
        s.state.store(generation << 32, Ordering::SeqCst);
        {
            let _g = s.park.lock().unwrap_or_else(|e| e.into_inner());
            s.wake.notify_all();
        }
        for w in self.workers.drain(..) {
            let _ = w.join();
        }
    }
}

/// Claims tasks of job `generation` until none is left, running each; a panic is recorded
/// for `run` to re-raise, and the task still counts as finished.
fn claim_and_run(s: &Shared, generation: u64) {
    loop {
        let v = s.state.load(Ordering::Acquire);
        let (tasks, next) = ((v >> 16) & 0xffff, v & 0xffff);
        if v >> 32 != generation || next >= tasks {
            return;
        }
        if s.state
            .compare_exchange_weak(v, v + 1, Ordering::AcqRel, Ordering::Relaxed)
            .is_err()
        {
            continue;
        }
        // SAFETY: we hold task `next` of this job, so `run` keeps the closure alive
        let job = unsafe { (*s.job.get()).expect("invariant: a published job has a closure") };
        if catch_unwind(AssertUnwindSafe(|| unsafe { (*job)(next as usize) })).is_err() {
            s.panicked.store(true, Ordering::Relaxed);
        }
        s.finished.fetch_add(1, Ordering::Release);
    }
}

fn worker(s: &Shared) {
    let mut seen = 0u64;
    loop {
        seen = wait_for_job(s, seen);
        if s.stop.load(Ordering::SeqCst) {
            return;
        }
        claim_and_run(s, seen);
    }
}

/// Spins, then parks, until the generation differs from `seen`; returns the new one.
fn wait_for_job(s: &Shared, seen: u64) -> u64 {
    let start = Instant::now();
    let mut spins = 0u32;
    loop {
        let g = s.state.load(Ordering::Acquire) >> 32;
        if g != seen {
            return g;
        }
        spins = spins.wrapping_add(1);
        if spins.is_multiple_of(256) && start.elapsed() > SPIN {
            break;
        }
        std::hint::spin_loop();
    }
    let mut guard = s.park.lock().unwrap_or_else(|e| e.into_inner());
    s.sleepers.fetch_add(1, Ordering::SeqCst);
    // the SeqCst pair (sleepers here, the state word in `run`) means either we see the new
    // generation now or `run` sees a sleeper and notifies under the lock
    loop {
        let g = s.state.load(Ordering::SeqCst) >> 32;
        if g != seen {
            s.sleepers.fetch_sub(1, Ordering::SeqCst);
            return g;
        }
        guard = s.wake.wait(guard).unwrap_or_else(|e| e.into_inner());
    }
}
