//! A small spinning thread pool for the many short matmuls of a decode step.
//!
//! `workers` threads wait for work by spinning on an atomic for a bounded
//! time (`spin`), then park on a condvar.  [`SpinPool::for_each_chunk_mut2`]
//! publishes a job, the caller works on it too, and returns only when no
//! worker can still touch the job, so borrowed data may be used.  A call
//! made while the pool is busy (another thread's call, or a nested one) runs
//! serially on the caller: never a deadlock, never an error.
//!
//! Protocol (all atomics `SeqCst`): the caller writes the job while
//! `open == 0` and `active == 0`, then stores `open = epoch`.  A worker that
//! sees a new `open` increments `active`, re-reads `open`, and only if it is
//! still that epoch reads the job and claims task indices from `next`.  The
//! caller, after the tasks are exhausted, stores `open = 0` and waits for
//! `active == 0`.  In the single total order either the worker's increment
//! comes first (the caller waits for it) or the close does (the worker's
//! re-read sees 0 and it leaves without touching the job).

use std::cell::UnsafeCell;
use std::sync::atomic::{
    AtomicBool, AtomicU64, AtomicUsize, Ordering::AcqRel, Ordering::Relaxed, Ordering::SeqCst,
};
use std::sync::{Arc, Condvar, Mutex, OnceLock};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// A job: task `i` of `n`.  The `'static` is a lie told to the cell; see
/// the module docs for why no worker uses it after the call returns.
type Job = *const (dyn Fn(usize) + Sync + 'static);

struct Shared {
    /// Epoch of the open job, 0 when none.
    open: AtomicU64,
    /// Workers inside the current job.
    active: AtomicUsize,
    /// Next task index and task count of the open job.
    next: AtomicUsize,
    n_tasks: AtomicUsize,
    job: UnsafeCell<Option<Job>>,
    /// Workers parked (or about to park) on `wake`.
    sleepers: AtomicUsize,
    lock: Mutex<()>,
    wake: Condvar,
    shutdown: AtomicBool,
    spin: Duration,
    /// Workers whose thread has started running (see [`SpinPool::new`]).
    started: AtomicUsize,
    /// Calls timed since the last reset.
    calls: AtomicU64,
    /// Each thread's time in calls while [`set_timing`] is on: the caller's at 0, worker
    /// `i`'s at `i + 1`.
    clocks: Box<[Clock]>,
}

/// Whether calls time their threads ([`SpinPool::times`]): off by default, as reading the
/// clock five times a call is a cost a decode step does not need to pay.
static TIMING: AtomicBool = AtomicBool::new(false);

/// Turns the timing of every pool's calls on or off (`colibri bench --pool-times`).
pub fn set_timing(on: bool) {
    TIMING.store(on, SeqCst);
}

/// Nanoseconds one thread spent in a pool's calls.
#[derive(Default)]
struct Clock {
    /// In the call's tasks (the caller: from publishing the job until no task is left).
    tasks: AtomicU64,
    /// The caller only: after the last task was claimed, waiting for the workers to finish
    /// theirs (the join).
    join: AtomicU64,
}

/// What [`SpinPool::times`] reports: the calls since the last reset, and per thread (the
/// caller first) the seconds in tasks and, for the caller, at joins.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct PoolTimes {
    pub calls: u64,
    pub tasks_s: Vec<f64>,
    pub join_s: f64,
}

// SAFETY: `job` is written only by the caller holding `call` while no
// worker can read it (open == 0, active == 0: module docs) and read by
// workers only while open; the pointee is `Sync`.  Everything else is
// atomics or std sync types.
unsafe impl Sync for Shared {}
// SAFETY: as above; the raw pointer is only dereferenced under the
// protocol, and the closure it points to is `Sync`.
unsafe impl Send for Shared {}

/// See the module docs.
pub struct SpinPool {
    shared: Arc<Shared>,
    /// Serialises callers; a busy pool runs a call serially.
    call: Mutex<u64>,
    workers: Vec<JoinHandle<()>>,
}

impl SpinPool {
    /// A pool of `workers` threads (the caller is one more) that spin for
    /// `spin` before parking.
    pub fn new(workers: usize, spin: Duration) -> SpinPool {
        let shared = Arc::new(Shared {
            open: AtomicU64::new(0),
            active: AtomicUsize::new(0),
            next: AtomicUsize::new(0),
            n_tasks: AtomicUsize::new(0),
            job: UnsafeCell::new(None),
            sleepers: AtomicUsize::new(0),
            lock: Mutex::new(()),
            wake: Condvar::new(),
            shutdown: AtomicBool::new(false),
            spin,
            started: AtomicUsize::new(0),
            calls: AtomicU64::new(0),
            clocks: (0..=workers).map(|_| Clock::default()).collect(),
        });
        let n = workers;
        let workers = (0..workers)
            .map(|i| {
                let s = Arc::clone(&shared);
                std::thread::Builder::new()
                    .name(format!("quant-spin-{i}"))
                    .spawn(move || worker(&s, &s.clocks[i + 1]))
                    .expect("spawn quant pool worker")
            })
            .collect();
        // A thread allocates as it starts (its name, its stack guard's info): wait until every
        // worker is past that, so a pool made before a decode loop never allocates inside it,
        // however late a busy machine schedules the new threads.
        while shared.started.load(SeqCst) < n {
            std::thread::yield_now();
        }
        SpinPool {
            shared,
            call: Mutex::new(0),
            workers,
        }
    }

    /// The process-wide pool: one worker per available CPU beyond the
    /// caller, spinning for 200 us.
    /// As many threads as the rayon pool of its first caller (the daemon's global pool,
    /// sized by `--threads`), so both poolings use the cores the user gave.
    pub fn global() -> &'static SpinPool {
        static POOL: OnceLock<SpinPool> = OnceLock::new();
        POOL.get_or_init(|| {
            let n = rayon::current_num_threads();
            SpinPool::new(n.saturating_sub(1), Duration::from_micros(200))
        })
    }

    /// Threads that work on a call (workers plus the caller).
    pub fn threads(&self) -> usize {
        self.workers.len() + 1
    }

    /// The time of the calls made while [`set_timing`] was on, since the last
    /// [`SpinPool::reset_times`]. Calls that ran serially (a busy pool, one task) are not
    /// counted.
    pub fn times(&self) -> PoolTimes {
        let s = &*self.shared;
        let secs = |a: &AtomicU64| a.load(SeqCst) as f64 / 1e9;
        PoolTimes {
            calls: s.calls.load(SeqCst),
            tasks_s: s.clocks.iter().map(|c| secs(&c.tasks)).collect(),
            join_s: secs(&s.clocks[0].join),
        }
    }

    /// Starts [`SpinPool::times`] over.
    pub fn reset_times(&self) {
        let s = &*self.shared;
        s.calls.store(0, SeqCst);
        for c in s.clocks.iter() {
            c.tasks.store(0, SeqCst);
            c.join.store(0, SeqCst);
        }
    }

    /// Run `f(i)` for `i in 0..n` on the pool and the caller.
    pub fn run(&self, n: usize, f: &(dyn Fn(usize) + Sync)) {
        let guard = match self.call.try_lock() {
            Ok(g) if !self.workers.is_empty() && n > 1 => g,
            _ => {
                (0..n).for_each(f);
                return;
            }
        };
        let mut epoch = guard;
        *epoch += 1;
        let s = &*self.shared;
        // SAFETY: we hold `call`, and the previous call returned only after
        // `open == 0` and `active == 0`, so no worker reads `job` now.  The
        // lifetime is erased; the pointer is not used after this call
        // returns (module docs).
        unsafe {
            let f: &'static (dyn Fn(usize) + Sync) = std::mem::transmute(f);
            *s.job.get() = Some(f as Job);
        }
        let timed = TIMING.load(Relaxed).then(Instant::now);
        s.next.store(0, SeqCst);
        s.n_tasks.store(n, SeqCst);
        s.open.store(*epoch, SeqCst);
        if s.sleepers.load(SeqCst) > 0 {
            let _l = s.lock.lock().unwrap_or_else(|e| e.into_inner());
            s.wake.notify_all();
        }
        loop {
            let i = s.next.fetch_add(1, SeqCst);
            if i >= n {
                break;
            }
            f(i);
        }
        s.open.store(0, SeqCst);
        let tasks_done = timed.map(|t0| (t0, Instant::now()));
        while s.active.load(SeqCst) != 0 {
            std::hint::spin_loop();
        }
        if let Some((t0, t1)) = tasks_done {
            let clock = &s.clocks[0];
            clock.tasks.fetch_add(nanos(t1 - t0), Relaxed);
            clock.join.fetch_add(nanos(t1.elapsed()), Relaxed);
            s.calls.fetch_add(1, Relaxed);
        }
    }

    /// Split `a` then `b` into chunks of `chunk` elements and run
    /// `f(slice_index, chunk_index, chunk)` for every chunk of both
    /// (`slice_index` 0 for `a`, 1 for `b`), in parallel.
    pub fn for_each_chunk_mut2<T: Send>(
        &self,
        a: &mut [T],
        b: &mut [T],
        chunk: usize,
        f: impl Fn(usize, usize, &mut [T]) + Sync,
    ) {
        assert!(chunk > 0);
        let (na, nb) = (a.len().div_ceil(chunk), b.len().div_ceil(chunk));
        let (pa, la) = (SendPtr(a.as_mut_ptr()), a.len());
        let (pb, lb) = (SendPtr(b.as_mut_ptr()), b.len());
        let task = |t: usize| {
            let (p, len, c) = if t < na {
                (&pa, la, t)
            } else {
                (&pb, lb, t - na)
            };
            let start = c * chunk;
            let n = chunk.min(len - start);
            // SAFETY: task `t` runs exactly once (`next` hands out each
            // index once) and chunks of one slice are disjoint ranges
            // inside it, so this is the only reference to these elements;
            // the slices outlive `run`, which returns after every task.
            let ch = unsafe { std::slice::from_raw_parts_mut(p.0.add(start), n) };
            f(usize::from(t >= na), c, ch);
        };
        self.run(na + nb, &task);
    }
}

/// The most tasks of a [`Guided`] split.
pub(super) const MAX_GUIDED_TASKS: usize = 48;

/// A guided split of `len` elements, in whole `unit`s, among `threads` threads: each task
/// takes `1 / (2 threads)` of what is left, at least `min_units` units, so the first tasks are
/// long (each thread streams a long share) and the last short (a thread that finishes its
/// share while another still works claims a short piece, not half of a long one). With equal
/// tasks, 2 threads and 4 tasks, the first to finish waited up to a quarter of the region for
/// the other. Plain data on the stack: a decode step allocates nothing.
pub struct Guided {
    bounds: [usize; MAX_GUIDED_TASKS + 1],
    tasks: usize,
}

impl Guided {
    pub fn new(len: usize, unit: usize, threads: usize, min_units: usize) -> Guided {
        let mut g = Guided {
            bounds: [0; MAX_GUIDED_TASKS + 1],
            tasks: 0,
        };
        g.push_guided(len, unit, threads, min_units);
        g
    }

    /// A split whose first `first` elements go in `first_tasks` near-equal tasks (at least
    /// one, at most one an element) and the `len - first` after them guided as
    /// [`Guided::new`] splits them: a task boundary at `first`, for
    /// [`SpinPool::for_each_guided2_then`]. Panics if `first > len`.
    pub fn staged(
        first: usize,
        first_tasks: usize,
        len: usize,
        unit: usize,
        threads: usize,
        min_units: usize,
    ) -> Guided {
        assert!(first <= len, "staged split: first part past the end");
        let mut g = Guided {
            bounds: [0; MAX_GUIDED_TASKS + 1],
            tasks: 0,
        };
        // Half the task budget at most, so the guided part keeps room for its short tail.
        let k = first_tasks.clamp(1, MAX_GUIDED_TASKS / 2).min(first);
        for i in 1..=k {
            g.tasks += 1;
            g.bounds[g.tasks] = first * i / k;
        }
        g.push_guided(len - first, unit, threads, min_units);
        g
    }

    /// Appends a guided split of the next `len` elements (see the type's docs).
    fn push_guided(&mut self, len: usize, unit: usize, threads: usize, min_units: usize) {
        let unit = unit.max(1);
        let units = len.div_ceil(unit);
        let base = self.bounds[self.tasks];
        let mut done = 0;
        while done < units {
            let left = units - done;
            let take = if self.tasks + 1 == MAX_GUIDED_TASKS {
                left
            } else {
                left.div_ceil(2 * threads.max(1))
                    .max(min_units.max(1))
                    .min(left)
            };
            done += take;
            self.tasks += 1;
            self.bounds[self.tasks] = base + (done * unit).min(len);
        }
    }

    /// Tasks in the split.
    pub fn tasks(&self) -> usize {
        self.tasks
    }

    /// Task `t`'s element range.
    pub fn range(&self, t: usize) -> std::ops::Range<usize> {
        self.bounds[t]..self.bounds[t + 1]
    }
}

impl SpinPool {
    /// `f(slice_index, start, chunk)` over the elements of `a` then `b` (as one sequence, cut
    /// by `split`, which must cover `a.len() + b.len()` elements) in parallel: `chunk` is
    /// `a[start..]` (slice 0) or `b[start..]` (slice 1); a task that straddles the two calls
    /// `f` once on each side.
    pub fn for_each_guided2<T: Send>(
        &self,
        a: &mut [T],
        b: &mut [T],
        split: &Guided,
        f: impl Fn(usize, usize, &mut [T]) + Sync,
    ) {
        let (la, lb) = (a.len(), b.len());
        assert_eq!(
            split.bounds[split.tasks],
            la + lb,
            "guided split of another length"
        );
        let (pa, pb) = (SendPtr(a.as_mut_ptr()), SendPtr(b.as_mut_ptr()));
        let task = |t: usize| {
            let (pa, pb) = (&pa, &pb);
            let r = split.range(t);
            // Task `t` runs exactly once and the tasks' ranges are disjoint (the bounds only
            // grow) and inside `a ++ b` (asserted above), so each sub-slice below is the only
            // reference to its elements; both slices outlive `run`, which returns after every
            // task.
            if r.start < la {
                let end = r.end.min(la);
                // SAFETY: see above; `r.start..end` lies in `a`.
                let ch =
                    unsafe { std::slice::from_raw_parts_mut(pa.0.add(r.start), end - r.start) };
                f(0, r.start, ch);
            }
            if r.end > la {
                let start = r.start.max(la) - la;
                // SAFETY: see above; `start..r.end - la` lies in `b`.
                let ch =
                    unsafe { std::slice::from_raw_parts_mut(pb.0.add(start), r.end - la - start) };
                f(1, start, ch);
            }
        };
        self.run(split.tasks, &task);
    }
}

impl SpinPool {
    /// [`SpinPool::for_each_guided2`], and `then(a)` once, on whichever thread completes the
    /// last task over `a` (`split` must have a task boundary at `a.len()`: [`Guided::staged`]),
    /// while the other threads go on with the tasks over `b`. Serial code that needs `a`'s
    /// results (a router's choice from its logits) then runs beside `b`'s products instead of
    /// between two parallel regions, where every other thread would wait for it. With `a`
    /// empty, `then` runs first, on the caller.
    pub fn for_each_guided2_then<T: Send>(
        &self,
        a: &mut [T],
        b: &mut [T],
        split: &Guided,
        f: impl Fn(usize, usize, &mut [T]) + Sync,
        then: impl FnOnce(&mut [T]) + Send,
    ) {
        let (la, lb) = (a.len(), b.len());
        assert_eq!(
            split.bounds[split.tasks],
            la + lb,
            "guided split of another length"
        );
        let pre = (0..=split.tasks)
            .find(|&t| split.bounds[t] == la)
            .expect("the split has a task boundary at the end of `a`");
        if pre == 0 {
            then(a);
            return self.for_each_guided2(a, b, split, f);
        }
        let then = Mutex::new(Some(then));
        let done = AtomicUsize::new(0);
        let (pa, pb) = (SendPtr(a.as_mut_ptr()), SendPtr(b.as_mut_ptr()));
        let task = |t: usize| {
            let (pa, pb) = (&pa, &pb);
            let r = split.range(t);
            // As in `for_each_guided2`: each task runs once, over its own range of `a ++ b`;
            // the first `pre` tasks cover `a` exactly (the boundary found above).
            if t < pre {
                // SAFETY: see above; `r` lies in `a`.
                let ch = unsafe { std::slice::from_raw_parts_mut(pa.0.add(r.start), r.len()) };
                f(0, r.start, ch);
                // AcqRel: the task that brings the count to `pre` sees every other one's
                // writes to `a`.
                if done.fetch_add(1, AcqRel) + 1 == pre {
                    let then = then.lock().unwrap_or_else(|e| e.into_inner()).take();
                    if let Some(then) = then {
                        // SAFETY: every task over `a` has completed (the count) and no later
                        // task touches it, so this is the only reference to `a`'s elements
                        // until `run` returns, which waits for this task.
                        then(unsafe { std::slice::from_raw_parts_mut(pa.0, la) });
                    }
                }
            } else {
                let (s, e) = (r.start - la, r.end - la);
                // SAFETY: see above; `s..e` lies in `b`.
                let ch = unsafe { std::slice::from_raw_parts_mut(pb.0.add(s), e - s) };
                f(1, s, ch);
            }
        };
        self.run(split.tasks, &task);
    }

    /// Run `f(i, a_i, b_i)` for the `i`-th chunk of `a` (`a_chunk` elements) and of `b`
    /// (`b_chunk` elements) together, for every chunk of `a`, in parallel; `b` must have at
    /// least as many chunks.
    pub fn for_each_chunk_pair<T: Send, U: Send>(
        &self,
        a: &mut [T],
        a_chunk: usize,
        b: &mut [U],
        b_chunk: usize,
        f: impl Fn(usize, &mut [T], &mut [U]) + Sync,
    ) {
        assert!(a_chunk > 0 && b_chunk > 0);
        let n = a.len().div_ceil(a_chunk);
        assert!(
            b.len().div_ceil(b_chunk) >= n,
            "for_each_chunk_pair: b too short"
        );
        let (pa, la) = (SendPtr(a.as_mut_ptr()), a.len());
        let (pb, lb) = (SendPtr(b.as_mut_ptr()), b.len());
        let task = |i: usize| {
            // Whole-struct borrows: the closure must capture the `Sync` wrappers, not the
            // raw pointers inside them.
            let (pa, pb) = (&pa, &pb);
            let (sa, sb) = (i * a_chunk, i * b_chunk);
            // SAFETY: task `i` runs exactly once and its two chunks are disjoint from every
            // other task's (ranges `i * chunk..` of each slice), so these are the only
            // references to those elements; the slices outlive `run`.
            let (ca, cb) = unsafe {
                (
                    std::slice::from_raw_parts_mut(pa.0.add(sa), a_chunk.min(la - sa)),
                    std::slice::from_raw_parts_mut(pb.0.add(sb), b_chunk.min(lb - sb)),
                )
            };
            f(i, ca, cb);
        };
        self.run(n, &task);
    }
}

/// A raw pointer that may cross threads (see the SAFETY at its use).
struct SendPtr<T>(*mut T);
// SAFETY: only used to rebuild disjoint `&mut [T]` chunks, `T: Send`.
unsafe impl<T: Send> Sync for SendPtr<T> {}

impl Drop for SpinPool {
    fn drop(&mut self) {
        self.shared.shutdown.store(true, SeqCst);
        {
            let _l = self.shared.lock.lock().unwrap_or_else(|e| e.into_inner());
            self.shared.wake.notify_all();
        }
        for w in self.workers.drain(..) {
            let _ = w.join();
        }
    }
}

fn nanos(d: Duration) -> u64 {
    d.as_nanos() as u64
}

fn worker(s: &Shared, clock: &Clock) {
    s.started.fetch_add(1, SeqCst);
    let mut last = 0u64;
    loop {
        // Spin for a new epoch, then park.
        let t0 = Instant::now();
        let mut spins = 0u32;
        let e = loop {
            let e = s.open.load(SeqCst);
            if e != 0 && e != last {
                break e;
            }
            if s.shutdown.load(SeqCst) {
                return;
            }
            spins += 1;
            if spins.is_multiple_of(64) && t0.elapsed() > s.spin {
                let mut l = s.lock.lock().unwrap_or_else(|e| e.into_inner());
                s.sleepers.fetch_add(1, SeqCst);
                loop {
                    let e = s.open.load(SeqCst);
                    if (e != 0 && e != last) || s.shutdown.load(SeqCst) {
                        break;
                    }
                    l = s.wake.wait(l).unwrap_or_else(|e| e.into_inner());
                }
                s.sleepers.fetch_sub(1, SeqCst);
                spins = 0;
                continue;
            }
            std::hint::spin_loop();
        };
        last = e;
        s.active.fetch_add(1, SeqCst);
        let timed = TIMING.load(Relaxed).then(Instant::now);
        if s.open.load(SeqCst) == e {
            // SAFETY: the job of epoch `e` is open and we are counted in
            // `active`, so the caller has not returned (module docs).
            let f = unsafe { (*s.job.get()).expect("open job is set") };
            let n = s.n_tasks.load(SeqCst);
            loop {
                let i = s.next.fetch_add(1, SeqCst);
                if i >= n {
                    break;
                }
                // SAFETY: as above, the closure outlives this use.
                unsafe { (*f)(i) };
            }
        }
        if let Some(t0) = timed {
            clock.tasks.fetch_add(nanos(t0.elapsed()), Relaxed);
        }
        s.active.fetch_sub(1, SeqCst);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chunks_cover_both_slices_once() {
        let pool = SpinPool::new(3, Duration::from_micros(50));
        for (la, lb, chunk) in [(10usize, 7usize, 3usize), (0, 5, 2), (100, 0, 7), (1, 1, 1)] {
            for _ in 0..50 {
                let (mut a, mut b) = (vec![0u32; la], vec![0u32; lb]);
                pool.for_each_chunk_mut2(&mut a, &mut b, chunk, |s, c, ch| {
                    for (i, v) in ch.iter_mut().enumerate() {
                        *v += (1 + s * 1000 + c * chunk + i) as u32;
                    }
                });
                assert!(a.iter().enumerate().all(|(i, &v)| v == 1 + i as u32));
                assert!(b.iter().enumerate().all(|(i, &v)| v == 1001 + i as u32));
            }
        }
        // After parking (spin expired), calls still complete.
        std::thread::sleep(Duration::from_millis(5));
        let mut a = vec![0u8; 64];
        pool.for_each_chunk_mut2(&mut a, &mut [], 8, |_, _, ch| ch.fill(1));
        assert!(a.iter().all(|&v| v == 1));
    }

    #[test]
    fn guided_tasks_shrink_and_cover_both_slices_once() {
        let g = Guided::new(1000, 1, 2, 10);
        let sizes: Vec<usize> = (0..g.tasks()).map(|t| g.range(t).len()).collect();
        assert_eq!(sizes.iter().sum::<usize>(), 1000);
        assert_eq!(sizes[0], 250, "{sizes:?}");
        assert!(sizes.windows(2).all(|w| w[0] >= w[1]), "{sizes:?}");
        assert!(
            sizes[..sizes.len() - 1].iter().all(|&s| s >= 10),
            "{sizes:?}"
        );
        // Whole units, the last one short; and a cap on the task count.
        let g = Guided::new(103, 4, 2, 1);
        assert!((0..g.tasks()).all(|t| g.range(t).start.is_multiple_of(4)));
        assert_eq!(Guided::new(1 << 20, 1, 8, 1).tasks(), MAX_GUIDED_TASKS);
        assert_eq!(Guided::new(0, 1, 2, 1).tasks(), 0);
        let pool = SpinPool::new(3, Duration::from_micros(50));
        for (la, lb, unit, min) in [
            (10usize, 7usize, 1usize, 1usize),
            (0, 5, 1, 2),
            (100, 0, 4, 3),
            (1, 1, 1, 1),
            (64, 64, 8, 1),
        ] {
            let g = Guided::new(la + lb, unit, 2, min);
            for _ in 0..50 {
                let (mut a, mut b) = (vec![0u32; la], vec![0u32; lb]);
                pool.for_each_guided2(&mut a, &mut b, &g, |s, start, ch| {
                    for (i, v) in ch.iter_mut().enumerate() {
                        *v += (1 + s * 1000 + start + i) as u32;
                    }
                });
                assert!(a.iter().enumerate().all(|(i, &v)| v == 1 + i as u32));
                assert!(b.iter().enumerate().all(|(i, &v)| v == 1001 + i as u32));
            }
        }
    }

    /// A staged split has its boundary at `first`, its first part in near-equal tasks; `then`
    /// runs exactly once, after every task over `a` and before the call returns, and sees all
    /// of `a` written, while `b` is covered once.
    #[test]
    fn then_runs_once_after_the_first_slice_is_done() {
        let g = Guided::staged(100, 4, 1100, 1, 2, 10);
        assert_eq!(g.bounds[..5], [0, 25, 50, 75, 100]);
        let sizes: Vec<usize> = (4..g.tasks()).map(|t| g.range(t).len()).collect();
        assert_eq!(sizes.iter().sum::<usize>(), 1000);
        assert_eq!(sizes[0], 250, "{sizes:?}");
        assert_eq!(Guided::staged(3, 8, 3, 1, 2, 1).tasks(), 3);
        assert_eq!(Guided::staged(0, 4, 10, 1, 2, 1).bounds[1], 3);
        let pool = SpinPool::new(2, Duration::from_micros(50));
        for (la, lb, first_tasks) in [
            (100usize, 1000usize, 4usize),
            (7, 0, 3),
            (0, 50, 2),
            (1, 1, 1),
        ] {
            let g = Guided::staged(la, first_tasks, la + lb, 1, 3, 4);
            for _ in 0..50 {
                let (mut a, mut b) = (vec![0u32; la], vec![0u32; lb]);
                let mut seen = (0usize, 0u64);
                pool.for_each_guided2_then(
                    &mut a,
                    &mut b,
                    &g,
                    |s, start, ch| {
                        for (i, v) in ch.iter_mut().enumerate() {
                            *v += (1 + s * 1000 + start + i) as u32;
                        }
                    },
                    |a| {
                        seen.0 += 1;
                        seen.1 = a.iter().map(|&v| v as u64).sum();
                        a.iter_mut().for_each(|v| *v += 1);
                    },
                );
                let want: u64 = (1..=la as u64).sum();
                assert_eq!(seen, (1, want), "a {la}, b {lb}");
                assert!(a.iter().enumerate().all(|(i, &v)| v == 2 + i as u32));
                assert!(b.iter().enumerate().all(|(i, &v)| v == 1001 + i as u32));
            }
        }
    }

    #[test]
    fn chunk_pairs_meet_in_step_once() {
        let pool = SpinPool::new(3, Duration::from_micros(50));
        // (a's length, a's chunk, b's length, b's chunk): tails on either side, b longer.
        for (la, ca, lb, cb) in [
            (10usize, 3usize, 8usize, 2usize),
            (9, 3, 30, 9),
            (1, 4, 1, 1),
        ] {
            for _ in 0..50 {
                let (mut a, mut b) = (vec![0u32; la], vec![0u32; lb]);
                pool.for_each_chunk_pair(&mut a, ca, &mut b, cb, |i, x, y| {
                    x.iter_mut().for_each(|v| *v += 1 + i as u32);
                    y.iter_mut().for_each(|v| *v += 1 + i as u32);
                });
                assert!(a.iter().enumerate().all(|(j, &v)| v == 1 + (j / ca) as u32));
                let chunks = la.div_ceil(ca);
                for (j, &v) in b.iter().enumerate() {
                    let want = if j / cb < chunks {
                        1 + (j / cb) as u32
                    } else {
                        0
                    };
                    assert_eq!(v, want, "b[{j}] with a {la}/{ca}, b {lb}/{cb}");
                }
            }
        }
    }

    /// With timing on, each call is counted once and the threads' task time covers the
    /// work done; with it off, nothing is counted.
    #[test]
    fn timed_calls_count_each_threads_tasks() {
        let pool = SpinPool::new(1, Duration::from_millis(50));
        let work = |_: usize, _: usize, ch: &mut [u64]| {
            let t = Instant::now();
            while t.elapsed() < Duration::from_micros(200) {
                std::hint::spin_loop();
            }
            ch.fill(1);
        };
        let mut a = vec![0u64; 8];
        pool.for_each_chunk_mut2(&mut a, &mut [], 1, work);
        assert_eq!(pool.times().calls, 0, "timing is off by default");
        set_timing(true);
        pool.reset_times();
        for _ in 0..10 {
            pool.for_each_chunk_mut2(&mut a, &mut [], 1, work);
        }
        set_timing(false);
        let t = pool.times();
        assert_eq!(t.calls, 10, "{t:?}");
        assert_eq!(t.tasks_s.len(), 2);
        // 80 tasks of at least 200 us each, split between the two threads.
        let total: f64 = t.tasks_s.iter().sum();
        assert!(total >= 80.0 * 200e-6, "{t:?}");
        assert!(t.join_s >= 0.0 && t.join_s < total, "{t:?}");
        pool.reset_times();
        assert_eq!(
            pool.times(),
            PoolTimes {
                calls: 0,
                tasks_s: vec![0.0; 2],
                join_s: 0.0
            }
        );
    }

    #[test]
    fn nested_and_concurrent_calls_run() {
        let pool = Arc::new(SpinPool::new(2, Duration::from_micros(20)));
        let hs: Vec<_> = (0..3)
            .map(|_| {
                let p = Arc::clone(&pool);
                std::thread::spawn(move || {
                    for _ in 0..200 {
                        let mut a = vec![0u32; 40];
                        p.for_each_chunk_mut2(&mut a, &mut [], 4, |_, _, ch| {
                            // Nested call: runs serially on this thread.
                            let mut inner = vec![0u32; 4];
                            p.for_each_chunk_mut2(&mut inner, &mut [], 1, |_, _, c| c[0] = 1);
                            ch.fill(inner.iter().sum());
                        });
                        assert!(a.iter().all(|&v| v == 4));
                    }
                })
            })
            .collect();
        for h in hs {
            h.join().unwrap();
        }
    }
}
