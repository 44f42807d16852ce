//! The pinned hot store: which experts to pin (from a usage history), and wiring them in RAM.

use super::usage::Usage;
use super::Expert;

/// Selections of history below which autopin does nothing.
pub const AUTOPIN_MIN_HISTORY: u64 = 5000;
/// Autopin plans under this many GB pin nothing.
pub const AUTOPIN_MIN_GB: f64 = 0.5;
/// Selections at which autopin trusts the history fully.
pub const AUTOPIN_FULL_CONFIDENCE: u64 = 200_000;

/// The `n` most used experts of sparse layers, most used first; ties by (layer, expert).
/// Experts never selected are not pinned unless `fill` (`PIN_FILL=1`): then they follow every
/// selected one with count 0, taken round-robin over the layers (expert 0 of every layer,
/// then expert 1, ...) so a budget that ends inside the fill spreads it over all layers
/// instead of giving it all to the first ones.
pub fn select(usage: &Usage, sparse: &[bool], n: usize, fill: bool) -> Vec<(usize, usize)> {
    let mut recs: Vec<(usize, usize, u64)> = usage
        .records()
        .filter(|&(l, _, _)| sparse.get(l).copied().unwrap_or(false))
        .collect();
    recs.sort_by(|a, b| b.2.cmp(&a.2).then((a.0, a.1).cmp(&(b.0, b.1))));
    let mut out: Vec<(usize, usize)> = recs.into_iter().take(n).map(|(l, e, _)| (l, e)).collect();
    if fill {
        'fill: for e in 0..usage.n_experts {
            for (l, _) in sparse.iter().enumerate().filter(|(_, s)| **s) {
                if out.len() >= n {
                    break 'fill;
                }
                if usage.get(l, e) == 0 {
                    out.push((l, e));
                }
            }
        }
    }
    out
}

/// Autopin's pin budget in GB from `history` selections and the bytes experts may take:
/// half of them, scaled by confidence `min(1, history / 200000)`, and never more than the
/// model's expert bytes (`model_expert_bytes`: every routed expert once), however much RAM
/// there is: a plan bigger than the model is a number nobody can act on (a 20 MB model once
/// reported `pinning 8.7 GB`). `None` below 5000 selections or under 0.5 GB.
pub fn autopin_gb(history: u64, expert_room_bytes: f64, model_expert_bytes: f64) -> Option<f64> {
    if history < AUTOPIN_MIN_HISTORY || expert_room_bytes <= 0.0 {
        return None;
    }
    let conf = (history as f64 / AUTOPIN_FULL_CONFIDENCE as f64).min(1.0);
    let gb = (expert_room_bytes / 1e9 * 0.5 * conf).min(model_expert_bytes.max(0.0) / 1e9);
    (gb >= AUTOPIN_MIN_GB).then_some(gb)
}

/// Locks an expert's weights in RAM (`--mlock`).
pub fn mlock(x: &Expert) -> Result<(), String> {
    for m in [&x.gate, &x.up, &x.down] {
        lock_bytes(m.data())?;
        let s = m.scales();
        // f32 slice as its byte extent: only the address range matters to mlock.
        lock_range(s.as_ptr() as *const u8, std::mem::size_of_val(s))?;
    }
    Ok(())
}

fn lock_bytes(b: &[u8]) -> Result<(), String> {
    lock_range(b.as_ptr(), b.len())
}

fn lock_range(ptr: *const u8, len: usize) -> Result<(), String> {
    if len == 0 {
        return Ok(());
    }
    // SAFETY: `ptr..ptr+len` is the extent of a live slice borrowed by the caller, so the range
    // is mapped. mlock reads nothing and writes nothing: it only asks the kernel to keep those
    // pages resident (it rounds to page boundaries, which may lock neighbouring heap bytes too
    // — harmless). Who guarantees it: the borrow of the expert. Worst case: the kernel refuses
    // (EPERM / ENOMEM over RLIMIT_MEMLOCK) and we return the error; the lock ends when the
    // allocation is unmapped as the expert is dropped (suspect for small allocations that the
    // allocator keeps mapped: those pages stay locked until exit).
    let rc = unsafe { nix::libc::mlock(ptr as *const nix::libc::c_void, len) };
    if rc == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error().to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn picks_most_used_sparse_experts() {
        let mut u = Usage::new(3, 4);
        u.add(0, 1, 1000); // dense layer: never pinned
        u.add(1, 2, 50);
        u.add(2, 3, 50);
        u.add(2, 0, 70);
        u.add(1, 0, 5);
        let sparse = [false, true, true];
        assert_eq!(select(&u, &sparse, 3, false), vec![(2, 0), (1, 2), (2, 3)]);
        assert_eq!(select(&u, &sparse, 10, false).len(), 4);
        assert!(select(&u, &sparse, 0, false).is_empty());
    }

    #[test]
    fn pin_fill_appends_unseen_experts_after_the_seen_ones() {
        let mut u = Usage::new(3, 4);
        u.add(1, 2, 50);
        u.add(2, 0, 70);
        let sparse = [false, true, true];
        // Without PIN_FILL only the two selected experts can be pinned.
        assert_eq!(select(&u, &sparse, 8, false), vec![(2, 0), (1, 2)]);
        // With it every sparse expert is a candidate, unseen ones after, round-robin over
        // the layers, never the dense layer 0 and never an expert twice.
        let all = select(&u, &sparse, 100, true);
        assert_eq!(all.len(), 8);
        assert_eq!(
            all,
            vec![
                (2, 0),
                (1, 2),
                (1, 0),
                (1, 1),
                (2, 1),
                (2, 2),
                (1, 3),
                (2, 3)
            ]
        );
        let mut dedup = all.clone();
        dedup.sort();
        dedup.dedup();
        assert_eq!(dedup.len(), 8);
        // A budget ending inside the fill takes the first ones of it.
        assert_eq!(
            select(&u, &sparse, 4, true),
            vec![(2, 0), (1, 2), (1, 0), (1, 1)]
        );
        // An empty history with PIN_FILL still pins (all at count 0).
        assert_eq!(
            select(&Usage::new(3, 4), &sparse, 3, true),
            vec![(1, 0), (2, 0), (1, 1)]
        );
    }

    #[test]
    fn autopin_needs_history_and_scales_with_confidence() {
        let big = 1e12; // a model far larger than the room: the room decides
        assert_eq!(autopin_gb(4999, 100e9, big), None);
        assert_eq!(autopin_gb(200_000, 10e9, big), Some(5.0));
        assert_eq!(autopin_gb(400_000, 10e9, big), Some(5.0));
        assert_eq!(autopin_gb(100_000, 10e9, big), Some(2.5));
        assert_eq!(autopin_gb(5000, 10e9, big), None); // 0.125 GB < 0.5
    }

    #[test]
    fn autopin_never_plans_more_than_the_models_experts() {
        // The demo: 48 experts of ~0.4 MB (20 MB model) and a history of 405,072 selections
        // on a machine with 17.4 GB of expert room once planned 8.7 GB; it pins nothing now
        // (the whole model is under the 0.5 GB floor).
        assert_eq!(autopin_gb(405_072, 17.4e9, 20e6), None);
        // A 3 GB model in 10 GB of room: at most the model, not half the room.
        assert_eq!(autopin_gb(200_000, 10e9, 3e9), Some(3.0));
        // A model bigger than the plan: the plan as before.
        assert_eq!(autopin_gb(200_000, 10e9, 6e9), Some(5.0));
        // Nonsense sizes never plan a negative or infinite amount.
        assert_eq!(autopin_gb(200_000, 10e9, -1.0), None);
    }
}
