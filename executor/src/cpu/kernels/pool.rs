//! A persistent thread pool for the CPU kernels. A decode step issues ~200 matvecs of tens of
//! microseconds each, so workers spin on a generation counter between jobs instead of being
//! spawned or woken through the OS every time; after a few milliseconds idle they park on a
//! condvar so that an idle pool costs nothing. The calling thread is worker 0.

use std::cell::UnsafeCell;
use std::panic::{catch_unwind, resume_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// How long an idle worker spins before parking: longer than the serial work between two
/// matvecs of one token (norms, rope, attention), shorter than anything a person notices.
const SPIN: Duration = Duration::from_millis(3);

/// The job as the workers see it: a borrowed closure whose lifetime `run` guarantees by not
/// returning before every worker is done with it.
type Job = *const (dyn Fn(usize) + Sync);

struct Shared {
    generation: AtomicU64,
    done: AtomicUsize,
    sleepers: AtomicUsize,
    stop: AtomicBool,
    panicked: AtomicBool,
    job: UnsafeCell<Option<Job>>,
    park: Mutex<()>,
    wake: Condvar,
}

// SAFETY: `job` is written only by the thread inside `run` (serialized by `Pool::caller`)
// before the release increment of `generation`, and read by workers only after acquiring it.
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
            generation: AtomicU64::new(0),
            done: AtomicUsize::new(0),
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
                    .spawn(move || worker(&shared, index))
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

    /// Runs `f(t)` for every thread index `t` in `0..threads()`, `f(0)` on the calling thread,
    /// and returns when all calls have returned. A panic in any call is re-raised here.
    pub fn run(&self, f: &(dyn Fn(usize) + Sync)) {
        if self.workers.is_empty() {
            return f(0);
        }
        let _serial = self.caller.lock().unwrap_or_else(|e| e.into_inner());
        let s = &*self.shared;
        s.done.store(0, Ordering::Relaxed);
        // SAFETY: the lifetime is erased only for the duration of this call; we wait below
        // until every worker has finished calling it.
        let job: Job = unsafe { std::mem::transmute::<&(dyn Fn(usize) + Sync), Job>(f) };
        unsafe { *s.job.get() = Some(job) };
        s.generation.fetch_add(1, Ordering::SeqCst);
        if s.sleepers.load(Ordering::SeqCst) > 0 {
            let _g = s.park.lock().unwrap_or_else(|e| e.into_inner());
            s.wake.notify_all();
        }
        let mine = catch_unwind(AssertUnwindSafe(|| f(0)));
        let mut spins = 0u32;
        while s.done.load(Ordering::Acquire) < self.workers.len() {
            spins += 1;
            if spins < 1 << 16 {
                std::hint::spin_loop();
            } else {
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

    /// Splits `out` into one contiguous piece per thread, each a multiple of `unit` elements
    /// long (except the last), and runs `f(offset, piece)` for every piece in parallel.
    pub fn split_mut<T: Send>(
        &self,
        out: &mut [T],
        unit: usize,
        f: &(dyn Fn(usize, &mut [T]) + Sync),
    ) {
        let n = out.len();
        let units = n.div_ceil(unit);
        let threads = self.threads();
        let base = SendPtr(out.as_mut_ptr());
        self.run(&|t| {
            let start = (units * t / threads * unit).min(n);
            let end = (units * (t + 1) / threads * unit).min(n);
            if start < end {
                // SAFETY: the ranges [start, end) of distinct threads are disjoint and inside
                // `out`, which `run` keeps borrowed until every thread is done.
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
        s.generation.fetch_add(1, Ordering::SeqCst);
        {
            let _g = s.park.lock().unwrap_or_else(|e| e.into_inner());
            s.wake.notify_all();
        }
        for w in self.workers.drain(..) {
            let _ = w.join();
        }
    }
}

fn worker(s: &Shared, index: usize) {
    let mut seen = 0u64;
    loop {
        seen = wait_for_job(s, seen);
        if s.stop.load(Ordering::SeqCst) {
            return;
        }
        // SAFETY: published before the generation we just acquired; `run` keeps it alive
        // until we increment `done`.
        let job =
            unsafe { (*s.job.get()).expect("invariant: a job is published with its generation") };
        if catch_unwind(AssertUnwindSafe(|| unsafe { (*job)(index) })).is_err() {
            s.panicked.store(true, Ordering::Relaxed);
        }
        s.done.fetch_add(1, Ordering::Release);
    }
}

/// Spins, then parks, until the generation differs from `seen`; returns the new one.
fn wait_for_job(s: &Shared, seen: u64) -> u64 {
    let start = Instant::now();
    let mut spins = 0u32;
    loop {
        let g = s.generation.load(Ordering::Acquire);
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
    // the SeqCst pair (sleepers here, generation in `run`) means either we see the new
    // generation now or `run` sees a sleeper and notifies under the lock
    loop {
        let g = s.generation.load(Ordering::SeqCst);
        if g != seen {
            s.sleepers.fetch_sub(1, Ordering::SeqCst);
            return g;
        }
        guard = s.wake.wait(guard).unwrap_or_else(|e| e.into_inner());
    }
}
