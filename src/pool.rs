//! The thread pool every row-parallel path runs on.
//!
//! Rayon's global pool cannot be resized once built, and it does not survive
//! `fork()`: the child inherits the pool's bookkeeping but none of its worker
//! threads, so the first job it submits waits forever for a worker that does
//! not exist. That is exactly what a fork-based data loader would hit. So the
//! crate keeps a pool of its own:
//!
//! - its size comes from [`set_num_threads`], else `RAYON_NUM_THREADS`, else
//!   the machine's available parallelism (asked once per process: a later
//!   change of the process's CPU affinity is not seen);
//! - its state is per process id: a process that finds state made by
//!   another pid (a forked child) makes fresh state and builds a fresh pool,
//!   never touching the inherited lock (another parent thread may have held
//!   it at the fork) and leaking, not dropping, the inherited pool, since
//!   dropping it would signal threads that only exist in the parent;
//! - if a pool cannot be built at all, work runs on the calling thread.
//!
//! Results never depend on the thread count: every parallel path splits work
//! by independent rows, and each row is computed the same way on any thread.

use std::sync::atomic::{AtomicPtr, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use rayon::{ThreadPool, ThreadPoolBuilder};

struct PoolState {
    threads: usize,
    pool: Arc<ThreadPool>,
}

/// One process's pool state. A forked child must not touch its parent's:
/// another thread of the parent may have held the lock at the moment of
/// `fork()`, and in the child that lock stays held forever (the thread
/// holding it does not exist there). So the state is per process id, behind
/// an atomic pointer a child swaps for a fresh one, leaking the inherited one.
struct Slot {
    pid: u32,
    /// `None` until the first parallel call, or after [`set_num_threads`].
    state: Mutex<Option<PoolState>>,
    /// The machine's available parallelism as this process first saw it.
    /// Asking costs ~28 µs a call on Linux (the affinity mask plus three
    /// cgroup files opened and read), paid by every parallel call before:
    /// more than a 32-row witness merge's whole work. Per process id like
    /// the rest, so a forked child (pinned elsewhere, say) asks afresh.
    cpus: std::sync::OnceLock<usize>,
}

static SLOT: AtomicPtr<Slot> = AtomicPtr::new(std::ptr::null_mut());
/// The size asked for by [`set_num_threads`]; 0 means "not set". An atomic,
/// not a lock, for the same reason as [`Slot`].
static REQUESTED: AtomicUsize = AtomicUsize::new(0);

/// This process's slot, made on first use (and first use after a fork).
fn slot() -> &'static Slot {
    let pid = std::process::id();
    loop {
        let cur = SLOT.load(Ordering::Acquire);
        // SAFETY: every non-null pointer in `SLOT` comes from `Box::leak`
        // below and is never freed, so it is valid for `'static`.
        if let Some(s) = unsafe { cur.as_ref() } {
            if s.pid == pid {
                return s;
            }
        }
        let fresh = Box::into_raw(Box::new(Slot {
            pid,
            state: Mutex::new(None),
            cpus: std::sync::OnceLock::new(),
        }));
        match SLOT.compare_exchange(cur, fresh, Ordering::AcqRel, Ordering::Acquire) {
            // The inherited slot (if any) is leaked: its pool's workers only
            // exist in the parent, and its lock may be held forever.
            // SAFETY: `fresh` was just leaked from a Box and is now in `SLOT`.
            Ok(_) => return unsafe { &*fresh },
            // Another thread of this process installed one first: use it.
            // SAFETY: `fresh` came from `Box::into_raw` above and was never
            // shared, so it can be freed.
            Err(_) => drop(unsafe { Box::from_raw(fresh) }),
        }
    }
}

fn default_threads() -> usize {
    std::env::var("RAYON_NUM_THREADS")
        .ok()
        .and_then(|s| s.trim().parse::<usize>().ok())
        .filter(|&n| n > 0)
        .unwrap_or_else(|| {
            *slot().cpus.get_or_init(|| {
                std::thread::available_parallelism()
                    .map(|n| n.get())
                    .unwrap_or(1)
            })
        })
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    // A poisoned lock only means another thread panicked while holding it;
    // the data (a pool handle) is still consistent.
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// The number of threads parallel calls use.
pub fn num_threads() -> usize {
    match REQUESTED.load(Ordering::Relaxed) {
        0 => default_threads(),
        requested => requested,
    }
}

/// Sets the number of threads later parallel calls use (1 = run on the
/// calling thread). `0` restores the default (`RAYON_NUM_THREADS`, else the
/// available parallelism).
pub fn set_num_threads(n: usize) {
    REQUESTED.store(n, Ordering::Relaxed);
    *lock(&slot().state) = None;
}

fn current_pool() -> Option<Arc<ThreadPool>> {
    let threads = num_threads();
    if threads <= 1 {
        return None;
    }
    let mut state = lock(&slot().state);
    if let Some(s) = state.as_ref() {
        if s.threads == threads {
            return Some(Arc::clone(&s.pool));
        }
    }
    let pool = ThreadPoolBuilder::new()
        .num_threads(threads)
        .thread_name(|i| format!("kvselect-{i}"))
        .build()
        .ok()?;
    let pool = Arc::new(pool);
    *state = Some(PoolState {
        threads,
        pool: Arc::clone(&pool),
    });
    Some(pool)
}

/// Runs `f(parallel)` inside the crate's pool when it has more than one
/// thread (`parallel = true`: rayon's parallel iterators in `f` then use this
/// pool, never rayon's global one); otherwise on the calling thread with
/// `parallel = false`, where `f` must use plain iterators.
pub fn install<R: Send>(f: impl FnOnce(bool) -> R + Send) -> R {
    match current_pool() {
        Some(pool) => pool.install(|| f(true)),
        None => f(false),
    }
}

/// Below this much work (in elements touched) a parallel task does not pay
/// for itself: waking a sleeping worker costs 30–170 µs on the virtual
/// machines measured (`benches/compare.py` reports the effect), about what
/// one thread needs to scan 300K–500K elements, and the call cannot return
/// before the woken worker has started.
pub const PAR_MIN_WORK: usize = 1 << 19;

/// How many rows of `work_per_row` elements make one parallel task worth
/// its hand-off (at least 1).
pub fn min_rows(work_per_row: usize) -> usize {
    (PAR_MIN_WORK / work_per_row.max(1)).max(1)
}

/// Calls `f(row_index, row)` on every `width`-wide row of `data`, split
/// across the pool's threads in runs of at least `min_rows` rows (so a small
/// call does not pay a cross-thread hand-off per row). `width == 0` means
/// there is nothing to visit.
///
/// The calling thread works too: the rows are cut into runs, the pool's
/// other threads are woken to claim runs, and the caller claims runs itself
/// meanwhile. Waking a sleeping worker costs tens to a hundred microseconds
/// on the virtual machines measured; with `install` the caller would sit
/// idle through that wake-up (and through a second one for the work to
/// split), while here it is already working, and a call that finishes
/// before a worker wakes simply finishes. Runs are claimed from a shared
/// counter, so rows of uneven cost (causal attention) balance themselves.
pub fn for_each_row_mut<T, F>(data: &mut [T], width: usize, min_rows: usize, f: F)
where
    T: Send,
    F: Fn(usize, &mut [T]) + Sync + Send,
{
    use std::sync::atomic::{AtomicUsize, Ordering};

    if width == 0 {
        return;
    }
    let rows = data.len() / width;
    let min_rows = min_rows.max(1);
    let pool = if rows < 2 * min_rows {
        None
    } else {
        current_pool()
    };
    let Some(pool) = pool else {
        data.chunks_mut(width)
            .enumerate()
            .for_each(|(i, r)| f(i, r));
        return;
    };
    let threads = pool.current_num_threads().max(1);
    // About eight runs per thread: `min_rows` only decided whether to wake
    // anyone; once a worker is coming, short runs let it share whatever is
    // left when it arrives, however late that is.
    let run_rows = rows.div_ceil(threads * 8).max(1);
    let runs: Vec<Mutex<Option<&mut [T]>>> = data
        .chunks_mut(run_rows * width)
        .map(|c| Mutex::new(Some(c)))
        .collect();
    let next = AtomicUsize::new(0);
    let work = || loop {
        let i = next.fetch_add(1, Ordering::Relaxed);
        let Some(slot) = runs.get(i) else { break };
        if let Some(run) = lock(slot).take() {
            for (j, row) in run.chunks_mut(width).enumerate() {
                f(i * run_rows + j, row);
            }
        }
    };
    let helpers = threads.min(runs.len()).saturating_sub(1);
    pool.in_place_scope(|s| {
        for _ in 0..helpers {
            s.spawn(|_| work());
        }
        work();
    });
}
