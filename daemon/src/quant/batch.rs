//! Decode products of many matrices in one parallel region.
//!
//! A MoE layer at decode runs many small matmuls per phase (every routed expert's gate and up,
//! then every down). Splitting each one across the threads costs a fork and a join per matrix,
//! and each thread's share of a small matrix is too short for the prefetch to get ahead. One
//! region over the rows of all of them costs one fork and join, and each thread streams one
//! long share that runs from matrix to matrix.

use std::cell::Cell;

use super::act::{with_row_scratch, ActBuf, Layout};
use super::matmul::Act;
use super::pool::{Guided, SpinPool};
use super::tuning::{decode_tuning, CHUNK_MIN_WORK, GUIDED_MIN_WORK, PAR_MIN_WORK};
use super::tuning::{pool_for, pool_threads};
use super::{KernelSet, QFormat, QMatrix, Threading};
use rayon::prelude::*;

/// The quantized inputs of one batch: one [`ActBuf`] per distinct input (by address and
/// length) and weight layout.
#[derive(Default)]
pub(super) struct BatchActs {
    pub(super) keys: Vec<(usize, usize, Layout)>,
    bufs: Vec<ActBuf>,
}

impl BatchActs {
    fn index(&self, x: &[f32], layout: Layout) -> Option<usize> {
        let key = (x.as_ptr() as usize, x.len(), layout);
        self.keys.iter().position(|&k| k == key)
    }
}

thread_local! {
    static ACTS: Cell<BatchActs> = Cell::new(BatchActs::default());
}

impl QMatrix {
    /// `y = [W_0 x_0; W_1 x_1; ...]` at one position, `(W_j, x_j) = job(j)` for `j` in
    /// `0..jobs`, with int8 activations: every output bit-identical to
    /// [`QMatrix::matmul_i8act`] of its matrix. An input shared by several jobs (the same
    /// slice) is quantized once per weight layout. The jobs are a function rather than a list
    /// so a caller can describe them without building one (decode allocates nothing). Panics if
    /// `y` is not as long as the rows of all jobs together, or an input's length is not its
    /// matrix's column count.
    pub fn matmul_batch_i8act<'a>(
        jobs: usize,
        job: impl Fn(usize) -> (&'a QMatrix, &'a [f32]) + Sync,
        y: &mut [f32],
    ) {
        QMatrix::matmul_batch_i8act_with(KernelSet::active(), jobs, job, y)
    }

    /// [`QMatrix::matmul_batch_i8act`] with an explicit kernel set.
    pub fn matmul_batch_i8act_with<'a>(
        k: &KernelSet,
        jobs: usize,
        job: impl Fn(usize) -> (&'a QMatrix, &'a [f32]) + Sync,
        y: &mut [f32],
    ) {
        let mut acts = ACTS.with(|c| c.take());
        acts.keys.clear();
        let (total, work) = quantize_inputs(k, jobs, &job, &mut acts);
        run_batch(k, jobs, &job, &acts, (total, work), y);
        ACTS.with(|c| c.set(acts));
    }

    /// [`QMatrix::matmul_batch_i8act`] with the inputs quantized into `inputs` beforehand
    /// ([`BatchInputs::add`], on any thread, while another region runs) where they were, and
    /// the others quantized here: the same bits, less serial code between two regions.
    pub fn matmul_batch_i8act_prepared<'a>(
        inputs: &mut BatchInputs,
        jobs: usize,
        job: impl Fn(usize) -> (&'a QMatrix, &'a [f32]) + Sync,
        y: &mut [f32],
    ) {
        let k = KernelSet::active();
        let (total, work) = quantize_inputs(k, jobs, &job, &mut inputs.0);
        run_batch(k, jobs, &job, &inputs.0, (total, work), y);
    }
}

/// The int8 inputs of a coming [`QMatrix::matmul_batch_i8act_prepared`], quantized ahead.
/// Keyed by each input slice's address and length: the slices must not move or change
/// between [`BatchInputs::add`] and the product. Reused from step to step, a decode step
/// allocates nothing once it has grown.
#[derive(Default)]
pub struct BatchInputs(BatchActs);

impl BatchInputs {
    /// Forgets every input (their buffers are kept).
    pub fn clear(&mut self) {
        self.0.keys.clear();
    }

    /// Quantizes the int8 inputs of `job(0..jobs)` not held yet, with the active kernels
    /// (those the product uses, so the same bits).
    pub fn add<'a>(&mut self, jobs: usize, job: impl Fn(usize) -> (&'a QMatrix, &'a [f32])) {
        quantize_inputs(KernelSet::active(), jobs, &job, &mut self.0);
    }
}

/// Rows of `job(0..jobs)` into `y` from the inputs quantized in `acts`, in one parallel region
/// where `work` (the jobs' multiply-adds over `total` rows) is worth one.
fn run_batch<'a>(
    k: &KernelSet,
    jobs: usize,
    job: &(impl Fn(usize) -> (&'a QMatrix, &'a [f32]) + Sync),
    acts: &BatchActs,
    (total, work): (usize, usize),
    y: &mut [f32],
) {
    assert_eq!(y.len(), total, "matmul_batch: y.len() != sum of rows");
    // One position: every job here is a decode-shaped product.
    let pool = pool_for(1);
    let threads = pool_threads(pool);
    let piece = |g0: usize, out: &mut [f32]| batch_rows(k, jobs, job, acts, g0, out);
    if work <= PAR_MIN_WORK || threads <= 1 {
        piece(0, y);
    } else {
        // Two pieces a thread: one long contiguous share each, and room for a stolen half
        // when a thread is held up.
        let min_rows = CHUNK_MIN_WORK.div_ceil(work / total);
        let chunk = total.div_ceil(threads * 2).max(min_rows);
        match pool {
            Threading::Spin if decode_tuning().guided => {
                let min = GUIDED_MIN_WORK.div_ceil(work / total).max(min_rows);
                let split = Guided::new(total, 1, threads, min);
                SpinPool::global().for_each_guided2(y, &mut [], &split, |_, g0, out| piece(g0, out))
            }
            Threading::Spin => {
                SpinPool::global()
                    .for_each_chunk_mut2(y, &mut [], chunk, |_, i, out| piece(i * chunk, out))
            }
            _ => y
                .par_chunks_mut(chunk)
                .enumerate()
                .for_each(|(i, out)| piece(i * chunk, out)),
        }
    }
}

impl QMatrix {
    /// [`QMatrix::matmul_batch_i8act`] of jobs `0..jobs`, the first `pre` into `y_pre` and the
    /// others into `y`, and `then(y_pre)` once the first `pre` products are complete: on the
    /// spin pool, by whichever thread finishes the last of their rows while the other threads
    /// go on with the later jobs ([`SpinPool::for_each_guided2_then`]), so serial code that
    /// reads the first products (a router's choice from its logits) runs beside the others
    /// instead of between two parallel regions. Elsewhere (rayon, one thread, a product too
    /// small to split) `then` runs between the two parts. Every output has
    /// `matmul_batch_i8act`'s bits. Panics as it does, per part.
    pub fn matmul_batch_i8act_then<'a>(
        jobs: usize,
        pre: usize,
        job: impl Fn(usize) -> (&'a QMatrix, &'a [f32]) + Sync,
        y_pre: &mut [f32],
        y: &mut [f32],
        then: impl FnOnce(&mut [f32]) + Send,
    ) {
        let k = KernelSet::active();
        assert!(pre <= jobs, "matmul_batch_then: more first jobs than jobs");
        let pool = pool_for(1);
        let threads = pool_threads(pool);
        let mut acts = ACTS.with(|c| c.take());
        acts.keys.clear();
        let (total, work) = quantize_inputs(k, jobs, &job, &mut acts);
        let pre_rows: usize = (0..pre).map(|j| job(j).0.rows).sum();
        assert_eq!(
            y_pre.len(),
            pre_rows,
            "matmul_batch_then: y_pre.len() != first rows"
        );
        assert_eq!(
            y.len(),
            total - pre_rows,
            "matmul_batch_then: y.len() != other rows"
        );
        let (acts_ref, job_ref) = (&acts, &job);
        let piece = |g0: usize, out: &mut [f32]| batch_rows(k, jobs, job_ref, acts_ref, g0, out);
        let staged = pool == Threading::Spin && decode_tuning().guided;
        if work <= PAR_MIN_WORK || threads <= 1 || !staged || pre_rows == 0 {
            ACTS.with(|c| c.set(acts));
            QMatrix::matmul_batch_i8act_with(k, pre, &job, y_pre);
            then(y_pre);
            QMatrix::matmul_batch_i8act_with(k, jobs - pre, |j| job(pre + j), y);
            return;
        }
        let min_rows = CHUNK_MIN_WORK.div_ceil(work / total);
        let min = GUIDED_MIN_WORK.div_ceil(work / total).max(min_rows);
        // The first part in two tasks a thread: they end close together, so the thread that
        // runs `then` starts it soon after the last of them.
        let split = Guided::staged(pre_rows, 2 * threads, total, 1, threads, min);
        SpinPool::global().for_each_guided2_then(
            y_pre,
            y,
            &split,
            |s, start, out| piece(if s == 0 { start } else { pre_rows + start }, out),
            then,
        );
        ACTS.with(|c| c.set(acts));
    }
}

/// Quantizes the int8 jobs' inputs that `acts` does not hold yet into it (one buffer per
/// distinct input and weight layout); returns the jobs' total rows and multiply-adds.
pub(super) fn quantize_inputs<'a>(
    k: &KernelSet,
    jobs: usize,
    job: &impl Fn(usize) -> (&'a QMatrix, &'a [f32]),
    acts: &mut BatchActs,
) -> (usize, usize) {
    let (mut total, mut work) = (0, 0);
    for j in 0..jobs {
        let (w, x) = job(j);
        assert_eq!(x.len(), w.cols, "matmul_batch: input length != cols");
        total += w.rows;
        work += w.rows * w.cols;
        if w.i8_via_f32() {
            continue;
        }
        let layout = Layout::of(w.fmt);
        if acts.index(x, layout).is_none() {
            let n = acts.keys.len();
            acts.keys.push((x.as_ptr() as usize, x.len(), layout));
            if acts.bufs.len() == n {
                acts.bufs.push(ActBuf::default());
            }
            acts.bufs[n].fill_with(k, x, 1, x.len(), layout);
        }
    }
    (total, work)
}

/// Rows `g0..g0 + out.len()` of the concatenated products into `out`.
pub(super) fn batch_rows<'a>(
    k: &KernelSet,
    jobs: usize,
    job: &impl Fn(usize) -> (&'a QMatrix, &'a [f32]),
    acts: &BatchActs,
    g0: usize,
    out: &mut [f32],
) {
    let g1 = g0 + out.len();
    let mut start = 0;
    for j in 0..jobs {
        let (w, x) = job(j);
        let end = start + w.rows;
        let (a, b) = (g0.max(start), g1.min(end));
        if a < b {
            let o = &mut out[a - g0..b - g0];
            let act = if w.i8_via_f32() {
                Act::F32(x)
            } else {
                let i = acts
                    .index(x, Layout::of(w.fmt))
                    .expect("every int8 job's input was quantized");
                Act::I8(&acts.bufs[i])
            };
            // The f32 path dequantizes packed rows into a scratch row.
            let dequant = matches!(act, Act::F32(_)) && w.fmt != QFormat::F32;
            let len = if dequant { w.cols } else { 0 };
            with_row_scratch(len, |row| w.rows_into(k, &act, a - start, 1, o, row));
        }
        start = end;
        if start >= g1 {
            break;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::tests::{kernel_sets, Rng};
    use super::super::{set_decode_tuning, set_threading, DecodeTuning};
    use super::*;

    /// Mixed formats (int4-g64 and int4-row share a layout, int8 and f32 do not), two inputs of
    /// two widths, odd row counts, big enough to split: every output equals the matrix's own
    /// `matmul_i8act`, bit for bit, on every kernel set and with either threading.
    #[test]
    fn batch_equals_separate_matmuls() {
        let mut rng = Rng::new(31);
        let (c0, c1) = (4 * 128 + 70, 1000);
        let shapes = [
            (QFormat::I4G64, 301, c0, 0),
            (QFormat::I4Row, 77, c0, 0),
            (QFormat::I8Row, 130, c1, 1),
            (QFormat::F32, 45, c0, 0),
            (QFormat::I3G64, 64, c1, 1),
            (QFormat::I4G64, 259, c1, 1),
            (QFormat::I2Row, 33, c0, 0),
        ];
        let mats: Vec<QMatrix> = shapes
            .iter()
            .map(|&(f, r, c, _)| QMatrix::quantize(&rng.weights(r * c), r, c, f))
            .collect();
        let (x0, x1) = (rng.vec(c0), rng.vec(c1));
        let inputs: [&[f32]; 2] = [&x0, &x1];
        let jobs: Vec<(&QMatrix, &[f32])> = mats
            .iter()
            .zip(&shapes)
            .map(|(w, s)| (w, inputs[s.3]))
            .collect();
        let total: usize = mats.iter().map(|m| m.rows()).sum();
        assert!(total * c0 > PAR_MIN_WORK);
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(3)
            .build()
            .unwrap();
        for k in kernel_sets() {
            let want: Vec<u32> = jobs
                .iter()
                .flat_map(|&(w, x)| {
                    let mut y = vec![0f32; w.rows()];
                    w.matmul_i8act_with(k, x, 1, &mut y);
                    y
                })
                .map(f32::to_bits)
                .collect();
            let run = || {
                let mut y = vec![f32::NAN; total];
                QMatrix::matmul_batch_i8act_with(k, jobs.len(), |j| jobs[j], &mut y);
                y.iter().map(|v| v.to_bits()).collect::<Vec<u32>>()
            };
            assert_eq!(run(), want, "{}", k.name());
            assert_eq!(pool.install(run), want, "{} 3 threads", k.name());
            // A subset, and the jobs in another order, give the same products.
            let last = jobs.len() - 1;
            let mut y = vec![0f32; mats[last].rows() + mats[0].rows()];
            let pick = [jobs[last], jobs[0]];
            QMatrix::matmul_batch_i8act_with(k, 2, |j| pick[j], &mut y);
            let tail = &want[want.len() - mats[last].rows()..];
            let head = &want[..mats[0].rows()];
            let got: Vec<u32> = y.iter().map(|v| v.to_bits()).collect();
            assert_eq!(got, [tail, head].concat(), "{} reordered", k.name());
        }
        let mut z = vec![0f32; total];
        QMatrix::matmul_batch_i8act(jobs.len(), |j| jobs[j], &mut z);
        // The spin pool's guided and equal splits give the rayon split's bits.
        set_threading(Threading::Spin);
        for guided in [true, false] {
            set_decode_tuning(DecodeTuning {
                guided,
                ..DecodeTuning::default()
            });
            let mut y = vec![0f32; total];
            QMatrix::matmul_batch_i8act(jobs.len(), |j| jobs[j], &mut y);
            let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<u32>>();
            assert_eq!(bits(&y), bits(&z), "spin pool, guided {guided}");
        }
        set_decode_tuning(DecodeTuning::default());
        set_threading(Threading::Rayon);
    }

    /// The staged batch: an f32 router-shaped product first, then int8 ones on a shared input;
    /// `then` sees the first products complete, and every output has the plain batch's bits,
    /// on the spin pool (staged) and on rayon (in order).
    #[test]
    fn staged_batch_equals_the_batch_and_hands_over_the_first_part() {
        let mut rng = Rng::new(57);
        let cols = 4 * 128 + 64;
        let mats = [
            QMatrix::from_f32(rng.weights(96 * cols), 96, cols),
            QMatrix::quantize(&rng.weights(301 * cols), 301, cols, QFormat::I8Row),
            QMatrix::quantize(&rng.weights(259 * cols), 259, cols, QFormat::I4Row),
            QMatrix::quantize(&rng.weights(130 * cols), 130, cols, QFormat::I8Row),
        ];
        let x = rng.vec(cols);
        let job = |j: usize| (&mats[j], &x[..]);
        let total: usize = mats.iter().map(|m| m.rows()).sum();
        let mut want = vec![0f32; total];
        QMatrix::matmul_batch_i8act(mats.len(), job, &mut want);
        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<u32>>();
        for threading in [Threading::Spin, Threading::Rayon] {
            set_threading(threading);
            for pre in [1, 2] {
                let first: usize = mats[..pre].iter().map(|m| m.rows()).sum();
                for _ in 0..20 {
                    let (mut a, mut b) = (vec![f32::NAN; first], vec![f32::NAN; total - first]);
                    let mut seen = Vec::new();
                    QMatrix::matmul_batch_i8act_then(mats.len(), pre, job, &mut a, &mut b, |a| {
                        seen = bits(a)
                    });
                    assert_eq!(seen, bits(&want[..first]), "{threading:?}, {pre} first");
                    assert_eq!(bits(&a), bits(&want[..first]), "{threading:?}, {pre} first");
                    assert_eq!(bits(&b), bits(&want[first..]), "{threading:?}, {pre} first");
                }
            }
        }
        set_threading(Threading::Rayon);
    }

    /// Inputs quantized ahead (some of them; one shared by two jobs) give the plain batch's
    /// bits, on the spin pool and on rayon; and the product reads what was quantized ahead, not
    /// the slice as it is by then (the buffer is keyed by the slice, and not made again).
    #[test]
    fn prepared_inputs_give_the_batch_bits_and_are_not_made_again() {
        let mut rng = Rng::new(83);
        let cols = 4 * 128 + 64;
        let mats = [
            QMatrix::quantize(&rng.weights(301 * cols), 301, cols, QFormat::I4G64),
            QMatrix::quantize(&rng.weights(259 * cols), 259, cols, QFormat::I8Row),
            QMatrix::from_f32(rng.weights(40 * cols), 40, cols),
            QMatrix::quantize(&rng.weights(130 * cols), 130, cols, QFormat::I4G64),
        ];
        let mut xs = [rng.vec(cols), rng.vec(cols), rng.vec(cols)];
        let which = [0, 1, 2, 0];
        let total: usize = mats.iter().map(|m| m.rows()).sum();
        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<u32>>();
        let mut want = vec![0f32; total];
        QMatrix::matmul_batch_i8act(4, |j| (&mats[j], &xs[which[j]][..]), &mut want);
        let mut inputs = BatchInputs::default();
        for threading in [Threading::Spin, Threading::Rayon] {
            set_threading(threading);
            for ahead in 0..=4 {
                inputs.clear();
                inputs.add(ahead, |j| (&mats[j], &xs[which[j]][..]));
                let mut y = vec![f32::NAN; total];
                QMatrix::matmul_batch_i8act_prepared(
                    &mut inputs,
                    4,
                    |j| (&mats[j], &xs[which[j]][..]),
                    &mut y,
                );
                assert_eq!(bits(&y), bits(&want), "{threading:?}, {ahead} ahead");
            }
        }
        set_threading(Threading::Rayon);
        // Input 0 quantized ahead, then overwritten in place: its job's product is still the
        // first input's (a product that quantized it again would see the negated values).
        inputs.clear();
        inputs.add(1, |j| (&mats[j], &xs[which[j]][..]));
        let old = xs[0].clone();
        xs[0].iter_mut().for_each(|v| *v = -*v);
        let mut y = vec![f32::NAN; total];
        QMatrix::matmul_batch_i8act_prepared(
            &mut inputs,
            1,
            |j| (&mats[j], &xs[0][..]),
            &mut y[..301],
        );
        let mut from_old = vec![0f32; 301];
        QMatrix::matmul_batch_i8act(1, |_| (&mats[0], &old[..]), &mut from_old);
        assert_eq!(bits(&y[..301]), bits(&from_old));
    }

    #[test]
    #[should_panic(expected = "sum of rows")]
    fn batch_checks_output_length() {
        let m = QMatrix::quantize(&[1.0; 8], 2, 4, QFormat::I8Row);
        let x = [1.0f32; 4];
        let mut y = [0f32; 3];
        QMatrix::matmul_batch_i8act(1, |_| (&m, &x[..]), &mut y);
    }
}
