//! A decode step's routed experts in one parallel region: every member's gate and up, its
//! SwiGLU, and its down, with no join between the gate/up products and the downs.
//!
//! The two-region form ([`QMatrix::matmul_batch_i8act_then`], then
//! [`QMatrix::matmul_batch_i8act_prepared`]) makes every thread wait at a join for the last
//! gate/up rows before any down starts, and runs the last members' SwiGLU and the downs' input
//! quantization serially between the regions. Here member `m`'s down rows only wait for
//! member `m`: the thread that completes the last of its gate/up pieces (a count per member)
//! makes its SwiGLU product and quantizes it for the down, and marks it ready.
//!
//! Each thread of the region runs one claiming loop over the work, not the pool's task
//! indices, because a thread the machine preempts while it holds a member's gate/up piece
//! must delay only that member: with tasks claimed strictly in order, every thread that
//! claimed a down of that member spun until the holder came back (0.44-0.56x the two-region
//! form on a loaded host). A thread takes, in this order: the next gate/up piece (a member's
//! gate or up by default: smaller pieces keep less back behind a stalled holder, but each
//! starts its stream over, and 12 a member measured 0.89-0.92x two), else a down task of any
//! ready member (out of member order: a stalled member's downs are simply left for later),
//! else, while a member whose downs are unclaimed is not ready, it waits: the caller spins (it
//! waits at the region's end anyway), a worker spins briefly and then leaves the region, so
//! that a worker the machine preempts is seldom inside it. A member not ready has every piece
//! claimed by a thread computing one (a thread never waits inside a piece), and the thread
//! that completes the member goes on to claim its downs, so whoever leaves, the region ends,
//! also when the pool runs it serially.
//!
//! The products are the batch's: the same kernels over the same quantized inputs, row by row,
//! so every output has [`QMatrix::matmul_i8act`]'s bits whatever the split and the order.

use std::cell::UnsafeCell;
use std::sync::atomic::Ordering::{Relaxed, Release};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering::AcqRel, Ordering::Acquire};
use std::time::{Duration, Instant};

use super::act::{with_row_scratch, ActBuf, Layout};
use super::batch::{batch_rows, quantize_inputs, BatchActs};
use super::matmul::Act;
use super::pool::{Guided, SpinPool, MAX_GUIDED_TASKS};
use super::tuning::{decode_tuning, pool_for, pool_threads};
use super::tuning::{CHUNK_MIN_WORK, GUIDED_MIN_WORK, PAR_MIN_WORK};
use super::{KernelSet, QMatrix, Threading};

/// The most members one region takes (a top-k plus a shared expert fits many times over);
/// a bigger batch goes through the two-region form.
pub const MAX_CHAIN_MEMBERS: usize = 64;

/// The most down tasks: the guided split's, each cut at the members' boundaries.
const MAX_DOWN_TASKS: usize = MAX_GUIDED_TASKS + MAX_CHAIN_MEMBERS;

/// Multiply-adds a gate/up piece aims at with `one_region_pieces` 0: four guided minimums
/// (128-256 KB of packed weights), long enough for the stream's prefetch, short enough that a
/// preempted holder keeps back a small part of its member. (Two pieces a member, the default,
/// measured 1.09-1.12x these on the medium model: every piece starts a stream over.)
const PIECE_WORK: usize = 4 * GUIDED_MIN_WORK;

/// The most gate/up pieces a member (the count of `PIECE_WORK` pieces on a wide member).
const MAX_PIECES: usize = 16;

/// One member's down input, quantized by whichever thread finishes the member.
#[derive(Default)]
struct Slot(UnsafeCell<ActBuf>);

// SAFETY: a slot is written only by the one thread that brings its member's count to zero,
// before it sets the member's ready flag (Release), and read only after a load of that flag
// (Acquire) saw it set; between two regions only the owner of the `&mut ChainScratch` touches
// it.
unsafe impl Sync for Slot {}

/// What [`QMatrix::matmul_experts_i8act`] keeps between steps: the gate/up input quantized
/// once, and a quantized down input per member. Grown once; a decode step then allocates
/// nothing.
#[derive(Default)]
pub struct ChainScratch {
    x_acts: BatchActs,
    slots: Vec<Slot>,
}

/// The members of one region (see [`QMatrix::matmul_experts_i8act`]).
pub struct Experts<'a, M, G> {
    /// Members `0..members`.
    pub members: usize,
    /// The input every computed member's gate and up read.
    pub x: &'a [f32],
    /// Member `i`'s gate, up and down.
    pub mats: M,
    /// The last member's gate then up outputs when they were computed already (a shared
    /// expert's, beside the router): only its SwiGLU and down run here.
    pub given: Option<&'a [f32]>,
    /// Member `i`'s SwiGLU product into its first argument from its gate and up outputs.
    pub glu: G,
}

/// A raw pointer shared by the tasks, each of which rebuilds its own disjoint part of the
/// buffer (see the SAFETY at each use).
struct Shared(*mut f32);
// SAFETY: only used to rebuild disjoint sub-slices, as the uses state.
unsafe impl Sync for Shared {}

/// A piece of work a thread of the region starts, as the tests' probe sees it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Step {
    /// A gate/up piece of `member` (or the given member's SwiGLU), claimed, about to run.
    GateUp { member: usize },
    /// A down task of `member`, done.
    Down { member: usize },
}

impl QMatrix {
    /// Member `i`'s gate and up products (`gate.rows()` then `up.rows()` values at `2 *
    /// off(i)` of `gu`, `off(i)` the gate rows of the members before it), its SwiGLU product
    /// (at `off(i)` of `h`) and its down product (after the down rows of the members before
    /// it, in `y`), all in one region of the spin pool, with int8 activations. Returns false,
    /// touching nothing, where one region does not apply (not the spin pool with guided
    /// splits, one thread, too little work to split, more than [`MAX_CHAIN_MEMBERS`] members,
    /// [`DecodeTuning::one_region`](super::DecodeTuning) off): the caller then runs the
    /// two-region form, which gives the same bits. Panics if a buffer is shorter than the
    /// members' rows.
    pub fn matmul_experts_i8act<'a, M, G>(
        e: &Experts<'a, M, G>,
        gu: &mut [f32],
        h: &mut [f32],
        y: &mut [f32],
        sc: &mut ChainScratch,
    ) -> bool
    where
        M: Fn(usize) -> [&'a QMatrix; 3] + Sync,
        G: Fn(usize, &mut [f32], &[f32], &[f32]) + Sync,
    {
        let members = e.members;
        let pool = pool_for(1);
        if members == 0
            || members > MAX_CHAIN_MEMBERS
            || pool_threads(pool) <= 1
            || pool != Threading::Spin
            || !decode_tuning().guided
            || !decode_tuning().one_region
        {
            return false;
        }
        let computed = members - e.given.is_some() as usize;
        let work: usize = (0..members)
            .map(|i| {
                let [g, u, d] = (e.mats)(i);
                d.rows * d.cols
                    + if i < computed {
                        (g.rows + u.rows) * g.cols
                    } else {
                        0
                    }
            })
            .sum();
        if work <= PAR_MIN_WORK {
            return false;
        }
        let t = decode_tuning();
        let claiming = Claiming {
            pieces: t.one_region_pieces,
            leave_after: Duration::from_micros(t.one_region_leave_us as u64),
        };
        let pool = SpinPool::global();
        run_chain(pool, KernelSet::active(), e, claiming, gu, h, y, sc, |_| {});
        true
    }
}

/// How the region's threads claim its work ([`DecodeTuning`](super::DecodeTuning)'s
/// `one_region_pieces` and `one_region_leave_us`): they move time, never bits.
#[derive(Clone, Copy, Debug)]
struct Claiming {
    /// Pieces each member's gate and up rows are claimed in (0: pieces of [`PIECE_WORK`]).
    pieces: usize,
    /// How long a worker with nothing to claim waits for a member before it leaves the
    /// region: a few gate/up pieces' time, the usual wait for the running holder of a
    /// member's last piece. A longer one means the holder is off its core; a worker that
    /// waited on (spinning or yielding) was then itself preempted inside the region often
    /// enough that the caller's wait at the pool's join took 16-22% of the decode on the
    /// loaded development host.
    leave_after: Duration,
}

/// [`QMatrix::matmul_experts_i8act`]'s region on `pool` with the kernels of `k`, whatever the
/// threading settings (the tests' entry: a pool of their own, none of the global switches),
/// calling `probe` at each [`Step`] (the tests' window on the claiming order; a no-op that
/// compiles away otherwise).
#[allow(clippy::too_many_arguments)]
fn run_chain<'a, M, G>(
    pool: &SpinPool,
    k: &KernelSet,
    e: &Experts<'a, M, G>,
    claiming: Claiming,
    gu: &mut [f32],
    h: &mut [f32],
    y: &mut [f32],
    sc: &mut ChainScratch,
    probe: impl Fn(Step) + Sync,
) where
    M: Fn(usize) -> [&'a QMatrix; 3] + Sync,
    G: Fn(usize, &mut [f32], &[f32], &[f32]) + Sync,
{
    let (members, threads) = (e.members, pool.threads());
    assert!(
        members <= MAX_CHAIN_MEMBERS,
        "experts chain: too many members"
    );
    let computed = members - e.given.is_some() as usize;
    // Prefix offsets: gate rows (the SwiGLU products' and, doubled, the gate/up outputs')
    // and down rows (the outputs').
    let mut off = [0usize; MAX_CHAIN_MEMBERS + 1];
    let mut dstart = [0usize; MAX_CHAIN_MEMBERS + 1];
    let (mut down_work, mut member_gu_work) = (0, 0);
    for i in 0..members {
        let [g, u, d] = (e.mats)(i);
        assert_eq!(g.rows, u.rows, "experts chain: gate and up rows differ");
        assert_eq!(d.cols, g.rows, "experts chain: down cols != gate rows");
        off[i + 1] = off[i] + g.rows;
        dstart[i + 1] = dstart[i] + d.rows;
        down_work += d.rows * d.cols;
        if i < computed {
            member_gu_work = member_gu_work.max(2 * g.rows * g.cols);
        }
    }
    let (inter_total, down_rows) = (off[members], dstart[members]);
    assert!(gu.len() >= 2 * off[computed], "experts chain: gu too short");
    assert!(h.len() >= inter_total, "experts chain: h too short");
    assert_eq!(y.len(), down_rows, "experts chain: y.len() != down rows");
    if let Some(g) = e.given {
        assert!(
            g.len() >= 2 * (off[members] - off[computed]),
            "experts chain: given gate/up too short"
        );
    }
    let gate_up = |j: usize| ((e.mats)(j / 2)[j % 2], e.x);
    sc.x_acts.keys.clear();
    let (gu_rows, _) = quantize_inputs(k, 2 * computed, &gate_up, &mut sc.x_acts);
    if sc.slots.len() < members {
        sc.slots.resize_with(members, Slot::default);
    }
    // Gate/up pieces a member: as the tuning asks (by default two: its gate, its up) or
    // pieces of about `PIECE_WORK`, at least two per thread over all members (the first
    // members finish early and their downs start while the last ones' gate/up rows run) and
    // two a member.
    let pieces = match claiming.pieces {
        0 => member_gu_work / PIECE_WORK,
        p => p,
    }
    .clamp(2, MAX_PIECES)
    .max((2 * threads).div_ceil(computed.max(1)));
    // Piece 0 is the given member's SwiGLU where there is one, then member-major pieces.
    let prep = e.given.is_some() as usize;
    let n_gu = prep + computed * pieces;
    // The downs: a guided split over all members' rows (long tasks first, a short tail),
    // cut at the members' boundaries so a task waits for one member; member `m`'s tasks are
    // `first[m]..first[m + 1]`, claimed with `next_down[m]`.
    let down_min = {
        let per_row = down_work / down_rows.max(1);
        GUIDED_MIN_WORK
            .div_ceil(per_row.max(1))
            .max(CHUNK_MIN_WORK.div_ceil(per_row.max(1)))
    };
    let split = Guided::new(down_rows, 1, threads, down_min);
    let mut bounds = [0usize; MAX_DOWN_TASKS + 1];
    let mut first = [0usize; MAX_CHAIN_MEMBERS + 1];
    let (mut tasks, mut guided) = (0, 0);
    for m in 0..members {
        first[m] = tasks;
        let mut at = dstart[m];
        while at < dstart[m + 1] {
            // The guided task holding row `at` (its bounds only grow, and cover every row).
            while split.range(guided).end <= at {
                guided += 1;
            }
            at = split.range(guided).end.min(dstart[m + 1]);
            tasks += 1;
            bounds[tasks] = at;
        }
    }
    first[members] = tasks;
    let next_down: [AtomicUsize; MAX_CHAIN_MEMBERS] =
        std::array::from_fn(|m| AtomicUsize::new(first[m.min(members)]));
    let next_gu = AtomicUsize::new(0);
    let left: [AtomicUsize; MAX_CHAIN_MEMBERS] =
        std::array::from_fn(|i| AtomicUsize::new(if i < computed { pieces } else { 1 }));
    let ready: [AtomicBool; MAX_CHAIN_MEMBERS] = std::array::from_fn(|_| AtomicBool::new(false));
    let (gu_p, h_p, y_p) = (
        Shared(gu.as_mut_ptr()),
        Shared(h.as_mut_ptr()),
        Shared(y.as_mut_ptr()),
    );
    let (acts, slots) = (&sc.x_acts, &sc.slots[..members]);
    debug_assert_eq!(gu_rows, 2 * off[computed]);
    // Member `m`'s SwiGLU product and its quantized down input, then its ready flag: run
    // once, by the thread that completed the member's last gate/up piece.
    let finish = |m: usize| {
        let (gu_p, h_p) = (&gu_p, &h_p);
        let rows = off[m + 1] - off[m];
        // SAFETY: every piece of member `m`'s gate/up rows is complete (its count reached
        // zero with AcqRel) and no task writes them again; `gu` outlives the region.
        let (g, u) = match e.given.filter(|_| m >= computed) {
            Some(given) => given[..2 * rows].split_at(rows),
            None => unsafe {
                std::slice::from_raw_parts(gu_p.0.add(2 * off[m]), 2 * rows).split_at(rows)
            },
        };
        // SAFETY: only this call writes member `m`'s range of `h` (it runs once per
        // member), and downs read it only after the ready flag below.
        let hm = unsafe { std::slice::from_raw_parts_mut(h_p.0.add(off[m]), rows) };
        (e.glu)(m, hm, g, u);
        let down = (e.mats)(m)[2];
        if !down.i8_via_f32() {
            // SAFETY: see `Slot`: this thread alone writes slot `m`, before the flag.
            let buf = unsafe { &mut *slots[m].0.get() };
            buf.fill_with(k, hm, 1, rows, Layout::of(down.fmt));
        }
        ready[m].store(true, Release);
    };
    // Gate/up piece `j` (claimed once, from `next_gu`).
    let gate_up_piece = |j: usize| {
        let gu_p = &gu_p;
        let m = if j < prep {
            computed
        } else {
            (j - prep) / pieces
        };
        probe(Step::GateUp { member: m });
        if j >= prep {
            let p = (j - prep) % pieces;
            let rows = 2 * (off[m + 1] - off[m]);
            let (a, b) = (rows * p / pieces, rows * (p + 1) / pieces);
            if a < b {
                let g0 = 2 * off[m] + a;
                // SAFETY: piece `p` of member `m` runs once and its rows are disjoint from
                // every other piece's; `gu` outlives the region.
                let out = unsafe { std::slice::from_raw_parts_mut(gu_p.0.add(g0), b - a) };
                batch_rows(k, 2 * computed, &gate_up, acts, g0, out);
            }
        }
        if left[m].fetch_sub(1, AcqRel) == 1 {
            finish(m);
        }
    };
    // Down task `t` of member `m` (claimed once, from `next_down[m]`, after `ready[m]`).
    let down_task = |m: usize, t: usize| {
        let (h_p, y_p) = (&h_p, &y_p);
        let (at, end) = (bounds[t], bounds[t + 1]);
        let down = (e.mats)(m)[2];
        let rows = off[m + 1] - off[m];
        // SAFETY: member `m` is ready (its flag was loaded with Acquire before the claim):
        // its `h` range and slot are written and nothing writes them again in this region.
        let hm = unsafe { std::slice::from_raw_parts(h_p.0.add(off[m]), rows) };
        // SAFETY: down task ranges are disjoint (the bounds only grow) and each runs once;
        // `y` outlives the region.
        let o = unsafe { std::slice::from_raw_parts_mut(y_p.0.add(at), end - at) };
        let act = if down.i8_via_f32() {
            Act::F32(hm)
        } else {
            // SAFETY: as above, slot `m` is written and only read from now on.
            Act::I8(unsafe { &*slots[m].0.get() })
        };
        let dequant = matches!(act, Act::F32(_)) && down.fmt != super::QFormat::F32;
        let len = if dequant { down.cols } else { 0 };
        with_row_scratch(len, |row| {
            down.rows_into(k, &act, at - dstart[m], 1, o, row)
        });
        probe(Step::Down { member: m });
    };
    // One thread's share: claim until nothing is left to claim (module docs).
    let caller = std::thread::current().id();
    let leave_after = claiming.leave_after;
    let claim_loop = |_: usize| {
        // The calling thread waits at the region's end anyway: it stays and helps.
        let is_caller = std::thread::current().id() == caller;
        // Members before `lo` have every down task claimed.
        let mut lo = 0;
        let mut idle_since: Option<Instant> = None;
        loop {
            if next_gu.load(Relaxed) < n_gu {
                let j = next_gu.fetch_add(1, Relaxed);
                if j < n_gu {
                    gate_up_piece(j);
                    continue;
                }
            }
            let (mut claimed, mut waiting, mut open) = (None, false, members);
            for m in lo..members {
                if next_down[m].load(Relaxed) >= first[m + 1] {
                    continue;
                }
                open = open.min(m);
                if !ready[m].load(Acquire) {
                    waiting = true;
                    continue;
                }
                let t = next_down[m].fetch_add(1, Relaxed);
                if t < first[m + 1] {
                    claimed = Some((m, t));
                    break;
                }
            }
            lo = open;
            match claimed {
                Some((m, t)) => {
                    down_task(m, t);
                    idle_since = None;
                }
                None if !waiting => return,
                None => {
                    // Every piece of a member not ready is claimed, by a thread computing
                    // it, which goes on to that member's downs: wait for it a while, then
                    // leave them to it (module docs).
                    let since = *idle_since.get_or_insert_with(Instant::now);
                    if !is_caller && since.elapsed() >= leave_after {
                        return;
                    }
                    for _ in 0..64 {
                        std::hint::spin_loop();
                    }
                }
            }
        }
    };
    pool.run(threads, &claim_loop);
}

#[cfg(test)]
mod tests {
    use super::super::expf::silu_mul_into;
    use super::super::tests::Rng;
    use super::super::QFormat;
    use super::*;

    /// How long a stalled thread waits for another member's down: far past any schedule
    /// of a working region, reached only where the others wait for the stalled member.
    const STALL_BOUND: Duration = Duration::from_secs(5);

    fn bits(v: &[f32]) -> Vec<u32> {
        v.iter().map(|x| x.to_bits()).collect()
    }

    /// Members of mixed formats (an f32 down takes the f32 path), a given last member wider
    /// than the others, on a serial pool and on pools of 2 and 4 threads, with several piece
    /// counts and waits before a worker leaves, many times over,
    /// and with the holder of member 0's first gate/up piece stalled: every SwiGLU product
    /// and down output has the bits of the member's own products (`matmul_i8act` of gate
    /// and up, `silu_mul_into`, `matmul_i8act` of down), and the other threads go on with
    /// the other members' downs meanwhile.
    #[test]
    fn one_region_gives_each_members_own_products() {
        let mut rng = Rng::new(52);
        let (hidden, inter, wide) = (4 * 128 + 64, 192, 320);
        let fmts = [QFormat::I4G64, QFormat::I8Row, QFormat::I4Row, QFormat::F32];
        let mut mats = Vec::new();
        for i in 0..9 {
            let r = if i == 8 { wide } else { inter };
            let q = |rng: &mut Rng, rows: usize, cols: usize, f: QFormat| {
                QMatrix::quantize(&rng.weights(rows * cols), rows, cols, f)
            };
            let f = fmts[i % fmts.len()];
            let g = q(&mut rng, r, hidden, f);
            let u = q(&mut rng, r, hidden, f);
            let d = q(&mut rng, hidden, r, fmts[(i + 1) % fmts.len()]);
            mats.push([g, u, d]);
        }
        let x = rng.vec(hidden);
        let k = KernelSet::active();
        // Each member's own products; the wide one's gate and up also serve as `given`.
        let mut want_h = Vec::new();
        let mut want_y = Vec::new();
        let mut given = Vec::new();
        for (i, [g, u, d]) in mats.iter().enumerate() {
            let (mut gv, mut uv) = (vec![0f32; g.rows()], vec![0f32; u.rows()]);
            g.matmul_i8act_with(k, &x, 1, &mut gv);
            u.matmul_i8act_with(k, &x, 1, &mut uv);
            let mut hv = vec![0f32; g.rows()];
            silu_mul_into(&mut hv, &gv, &uv);
            let mut yv = vec![0f32; hidden];
            d.matmul_i8act_with(k, &hv, 1, &mut yv);
            if i == 8 {
                given = [gv, uv].concat();
            }
            want_h.push(hv);
            want_y.push(yv);
        }
        let pools = [0, 1, 3].map(|w| SpinPool::new(w, Duration::from_micros(100)));
        // Pieces of `PIECE_WORK`, the default two (a member's gate, its up) with workers
        // leaving at once, odd and most pieces with a long wait: the claiming moves no bit.
        let claimings =
            [(0, 50), (2, 0), (5, 50), (MAX_PIECES, 500)].map(|(pieces, us)| Claiming {
                pieces,
                leave_after: Duration::from_micros(us),
            });
        let mut sc = ChainScratch::default();
        // (members, whether the last one's gate/up are given), the wide member last or absent.
        for (members, with_given) in [(9, true), (9, false), (8, false), (1, true), (1, false)] {
            let pick = |i: usize| if members < 9 || i + 1 < members { i } else { 8 };
            let e = Experts {
                members,
                x: &x[..],
                mats: |i: usize| {
                    let [g, u, d] = &mats[pick(i)];
                    [g, u, d]
                },
                given: with_given
                    .then_some(&given[..])
                    .filter(|_| pick(members - 1) == 8),
                glu: |_: usize, h: &mut [f32], g: &[f32], u: &[f32]| silu_mul_into(h, g, u),
            };
            if with_given && e.given.is_none() {
                continue;
            }
            let rows: usize = (0..members).map(|i| mats[pick(i)][0].rows()).sum();
            let want_h: Vec<u32> = (0..members).flat_map(|i| bits(&want_h[pick(i)])).collect();
            let want_y: Vec<u32> = (0..members).flat_map(|i| bits(&want_y[pick(i)])).collect();
            for (pool, claiming) in pools
                .iter()
                .flat_map(|p| claimings.iter().map(move |c| (p, *c)))
            {
                for run in 0..30 {
                    let mut gu = vec![f32::NAN; 2 * rows];
                    let mut h = vec![f32::NAN; rows];
                    let mut y = vec![f32::NAN; members * hidden];
                    // Every third run, the thread that claims member 0's first gate/up piece
                    // stalls (as if preempted) until another thread has done a down of
                    // another member, then a while longer (the others run out of work and
                    // wait for member 0): claimed in order, the others would spin on member
                    // 0's downs instead, and this stall would run into its bound.
                    let stall = members > 1 && pool.threads() > 1 && run % 3 == 0;
                    let (stalled, other_down) = (AtomicBool::new(false), AtomicBool::new(false));
                    let released = AtomicBool::new(false);
                    let probe = |s: Step| match s {
                        Step::GateUp { member: 0 } if stall && !stalled.swap(true, AcqRel) => {
                            let t0 = Instant::now();
                            while !other_down.load(Acquire) && t0.elapsed() < STALL_BOUND {
                                std::thread::yield_now();
                            }
                            released.store(other_down.load(Acquire), Release);
                            std::thread::sleep(Duration::from_millis(1));
                        }
                        Step::Down { member } if member != 0 => other_down.store(true, Release),
                        _ => {}
                    };
                    run_chain(
                        pool, k, &e, claiming, &mut gu, &mut h, &mut y, &mut sc, probe,
                    );
                    let what = format!(
                        "{members} members, given {with_given}, {} threads, stall {stall}, {claiming:?}",
                        pool.threads()
                    );
                    assert_eq!(stalled.load(Acquire), stall, "{what}");
                    assert!(
                        !stall || released.load(Acquire),
                        "{what}: no other member's down ran while member 0 was held"
                    );
                    assert_eq!(bits(&h), want_h, "{what}");
                    assert_eq!(bits(&y), want_y, "{what}");
                }
            }
        }
    }
}
