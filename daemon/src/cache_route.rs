//! Cache-aware routing (opt-in, changes outputs): upstream's `CACHE_ROUTE` and the max-rank
//! routing of arXiv 2412.00099. Each row still ranks every expert; its first `J` ranks are
//! kept whatever they cost, and each later chosen expert that is not resident (pinned, in
//! the LRU or in VRAM) gives its slot to the best-ranked resident expert among ranks
//! `top_k..M` not chosen yet. The weights are then recomputed from the router's scores of the
//! new set exactly as the family's router weighs its own choice (`model::moe::Router::weigh`),
//! so a swapped-in expert weighs what its own score says. With every chosen expert resident
//! nothing changes, not even a bit of the weights.
//!
//! It lives beside `routing`, below both the model (which re-routes with it) and the expert
//! store (which holds it, answers residency and reports its counters).
//!
//! Every routing is counted: slots, swaps, and the exact weight mass the swaps kept, which
//! the STAT suffix, the `[PROF]` line and the API's usage report.

use std::sync::atomic::{AtomicU64, Ordering};

use clap::Args;

use crate::error::EngineError;
use crate::routing::Routing;

/// Upstream's default window (`ROUTE_M`).
pub const DEFAULT_M: usize = 12;
/// Upstream's default of ranks always kept (`ROUTE_J`).
pub const DEFAULT_J: usize = 2;

fn boolish() -> clap::builder::BoolishValueParser {
    clap::builder::BoolishValueParser::new()
}

#[derive(Args, Debug, Clone)]
pub struct CacheRouteArgs {
    /// Cache-aware routing, which CHANGES OUTPUTS (off by default): a chosen expert that would
    /// be read from disk is replaced by the best-ranked resident one among the router's top M
    /// (--route-m), the first --route-j ranks always kept. `1` turns it on (upstream's
    /// CACHE_ROUTE=1), `0` off. Every STAT line, the [PROF] lines and the API's usage then
    /// report the agreement with exact routing.
    #[arg(long, env = "CACHE_ROUTE", default_value = "0", value_parser = boolish(), action = clap::ArgAction::Set, num_args = 0..=1, default_missing_value = "true")]
    pub cache_route: bool,
    /// With --cache-route: the candidate window, top_k..=n_experts ranks (default 12, within
    /// that range).
    #[arg(long, env = "ROUTE_M", value_parser = clap::value_parser!(u32).range(1..=1_000_000))]
    pub route_m: Option<u32>,
    /// With --cache-route: the leading ranks always taken, 0..=top_k (default 2).
    #[arg(long, env = "ROUTE_J", value_parser = clap::value_parser!(u32).range(0..=1_000_000))]
    pub route_j: Option<u32>,
}

/// The options as given (checked against the model's shape in [`CacheRoute::new`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CacheRouteConfig {
    pub m: Option<usize>,
    pub j: Option<usize>,
}

impl CacheRouteArgs {
    /// `None`: off. --route-m / --route-j without --cache-route are refused, as they would
    /// otherwise be silently ignored.
    pub fn config(&self) -> Result<Option<CacheRouteConfig>, EngineError> {
        if !self.cache_route {
            for (given, name) in [
                (self.route_m.is_some(), "--route-m (ROUTE_M)"),
                (self.route_j.is_some(), "--route-j (ROUTE_J)"),
            ] {
                if given {
                    return Err(EngineError::Usage(format!(
                        "{name} is given without --cache-route (CACHE_ROUTE=1): it would do nothing"
                    )));
                }
            }
            return Ok(None);
        }
        Ok(Some(CacheRouteConfig {
            m: self.route_m.map(|m| m as usize),
            j: self.route_j.map(|j| j as usize),
        }))
    }
}

/// The counters, since the start.
#[derive(Default)]
struct Meter {
    routings: AtomicU64,
    slots: AtomicU64,
    swaps: AtomicU64,
    /// Sum over routings of `-ln(kept exact mass)`, in nano-nats.
    kl_nano: AtomicU64,
}

/// Cache-aware routing of one model: its window, its kept ranks and its counters.
pub struct CacheRoute {
    pub m: usize,
    pub j: usize,
    meter: Meter,
}

/// A kept mass below this counts as this (a routing whose every slot was swapped, `J = 0`):
/// its KL is then at most `-ln(1e-9)`, about 20.7.
const MIN_KEPT: f64 = 1e-9;

impl CacheRoute {
    /// Checks the options against the model: `top_k <= M <= n_experts`, `J <= top_k`.
    pub fn new(
        cfg: CacheRouteConfig,
        top_k: usize,
        n_experts: usize,
    ) -> Result<CacheRoute, EngineError> {
        let m = match cfg.m {
            None => DEFAULT_M.clamp(top_k, n_experts.max(top_k)),
            Some(m) if (top_k..=n_experts).contains(&m) => m,
            Some(m) => {
                return Err(EngineError::bad_option(
                    "--route-m (ROUTE_M)",
                    m,
                    format!(
                        "the window must be from top_k ({top_k}) to the number of experts \
                         ({n_experts})"
                    ),
                ))
            }
        };
        let j = match cfg.j {
            None => DEFAULT_J.min(top_k),
            Some(j) if j <= top_k => j,
            Some(j) => {
                return Err(EngineError::bad_option(
                    "--route-j (ROUTE_J)",
                    j,
                    format!("the ranks always kept must be from 0 to top_k ({top_k})"),
                ))
            }
        };
        Ok(CacheRoute {
            m,
            j,
            meter: Meter::default(),
        })
    }

    /// Re-routes one row: `r` is the router's exact choice and `order` its ranking of the
    /// eligible experts; `resident[e]` says whether expert `e` of this layer is resident;
    /// `reweigh` gives a changed choice its weights as the router would. Allocation-free.
    pub fn apply(
        &self,
        order: &[usize],
        r: &mut Routing,
        resident: &[bool],
        reweigh: impl FnOnce(&mut Routing),
    ) {
        let k = r.experts.len();
        let lo = k.min(order.len());
        let window = &order[lo..self.m.min(order.len()).max(lo)];
        let total: f64 = r.weights.iter().map(|&w| w as f64).sum();
        let mut next = 0;
        let mut kept = 0f64;
        let mut swaps = 0u64;
        for i in 0..k {
            let e = r.experts[i];
            if i < self.j || resident.get(e).copied().unwrap_or(true) {
                kept += r.weights[i] as f64;
                continue;
            }
            while next < window.len() && !resident.get(window[next]).copied().unwrap_or(false) {
                next += 1;
            }
            if next == window.len() {
                // No resident candidate left: the expert is read as exact routing would.
                kept += r.weights[i] as f64;
                continue;
            }
            r.experts[i] = window[next];
            next += 1;
            swaps += 1;
        }
        let m = &self.meter;
        m.routings.fetch_add(1, Ordering::Relaxed);
        m.slots.fetch_add(k as u64, Ordering::Relaxed);
        if swaps > 0 {
            reweigh(r);
            m.swaps.fetch_add(swaps, Ordering::Relaxed);
            let frac = if total > 0.0 { kept / total } else { 1.0 };
            let kl = -frac.clamp(MIN_KEPT, 1.0).ln();
            m.kl_nano
                .fetch_add((kl * 1e9).round() as u64, Ordering::Relaxed);
        }
    }

    pub fn counts(&self) -> RouteCounts {
        let g = |a: &AtomicU64| a.load(Ordering::Relaxed);
        RouteCounts {
            on: true,
            m: self.m,
            j: self.j,
            routings: g(&self.meter.routings),
            slots: g(&self.meter.slots),
            swaps: g(&self.meter.swaps),
            kl_nano: g(&self.meter.kl_nano),
        }
    }
}

/// The counters at one moment (all zero and `on: false` without cache-aware routing).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RouteCounts {
    pub on: bool,
    pub m: usize,
    pub j: usize,
    pub routings: u64,
    pub slots: u64,
    pub swaps: u64,
    pub kl_nano: u64,
}

impl RouteCounts {
    /// What happened since `before`, as the STAT suffix reports it; `None` when off.
    pub fn since(&self, before: &RouteCounts) -> Option<protocol::RouteAgree> {
        if !self.on {
            return None;
        }
        let slots = self.slots.saturating_sub(before.slots);
        let swaps = self.swaps.saturating_sub(before.swaps);
        let routings = self.routings.saturating_sub(before.routings);
        let kl = self.kl_nano.saturating_sub(before.kl_nano) as f64 / 1e9;
        let swap_pct = if slots > 0 {
            100.0 * swaps as f64 / slots as f64
        } else {
            0.0
        };
        Some(protocol::RouteAgree {
            swap_pct,
            swaps,
            slots,
            agree_pct: 100.0 - swap_pct,
            kl: if routings > 0 {
                kl / routings as f64
            } else {
                0.0
            },
        })
    }

    /// The `[PROF]` line of a run.
    pub fn prof_line(&self) -> Option<String> {
        let a = self.since(&RouteCounts::default())?;
        Some(format!(
            "[PROF] cache-route (approximate routing, outputs differ from exact): M={} J={} | {} of {} expert slots swapped for resident ones ({:.1}%) | agreement with exact routing {:.1}% | route_kl {:.4}",
            self.m, self.j, a.swaps, a.slots, a.swap_pct, a.agree_pct, a.kl
        ))
    }

    /// The usage field of an API response: `{"cache_route": M, "route_j": J, ...}`.
    pub fn usage_json(a: &protocol::RouteAgree, m: usize, j: usize) -> serde_json::Value {
        serde_json::json!({
            "cache_route": m,
            "route_j": j,
            "route_agree": (a.agree_pct * 10.0).round() / 1000.0,
            "route_swaps": a.swaps,
            "route_slots": a.slots,
            "route_kl": a.kl,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::RouterKind;
    use crate::model::moe::Router;
    use crate::quant::QMatrix;

    /// Softmax router over 6 experts whose logits are the input itself (identity weight).
    fn router(top_k: usize, norm: bool) -> Router {
        let n = 6;
        let mut w = vec![0f32; n * n];
        for i in 0..n {
            w[i * n + i] = 1.0;
        }
        Router {
            weight: QMatrix::from_f32(w, n, n),
            bias: vec![0.0; n],
            kind: RouterKind::Softmax,
            top_k,
            n_group: 1,
            topk_group: 1,
            norm_topk_prob: norm,
            scaling: 1.0,
        }
    }

    fn route(r: &Router, x: &[f32]) -> (Vec<f32>, Vec<usize>, Routing) {
        let mut scores = Vec::new();
        let mut order = Vec::new();
        let mut out = Routing::default();
        r.route_into(x, &mut scores, &mut order, &mut out);
        (scores, order, out)
    }

    const X: [f32; 6] = [6.0, 5.0, 4.0, 3.0, 2.0, 1.0];

    #[test]
    fn every_chosen_expert_resident_changes_nothing() {
        let r = router(2, true);
        let (s, o, exact) = route(&r, &X);
        let cr = CacheRoute::new(CacheRouteConfig::default(), 2, 6).unwrap();
        let mut got = exact.clone();
        cr.apply(&o, &mut got, &[true; 6], |x| r.weigh(&s, x));
        assert_eq!(got.experts, exact.experts);
        assert_eq!(
            got.weights.iter().map(|w| w.to_bits()).collect::<Vec<_>>(),
            exact
                .weights
                .iter()
                .map(|w| w.to_bits())
                .collect::<Vec<_>>()
        );
        let a = cr.counts().since(&RouteCounts::default()).unwrap();
        assert_eq!((a.swaps, a.slots), (0, 2));
        assert_eq!(a.agree_pct, 100.0);
        assert_eq!(a.kl, 0.0);
    }

    #[test]
    fn a_cold_expert_past_rank_j_gives_its_slot_to_the_best_resident_candidate() {
        // Top 3 of 6: experts 0, 1, 2. J = 1 keeps expert 0 whatever it costs; expert 1 is
        // cold, expert 2 resident; the window (M = 5) offers 3 (cold) then 4 (resident).
        let r = router(3, true);
        let (s, o, exact) = route(&r, &X);
        assert_eq!(exact.experts, vec![0, 1, 2]);
        let cr = CacheRoute::new(
            CacheRouteConfig {
                m: Some(5),
                j: Some(1),
            },
            3,
            6,
        )
        .unwrap();
        let resident = [false, false, true, false, true, true];
        let mut got = exact.clone();
        cr.apply(&o, &mut got, &resident, |x| r.weigh(&s, x));
        assert_eq!(got.experts, vec![0, 4, 2]);
        // Renormalised over the new set from the router's own probabilities.
        let p: Vec<f32> = [0usize, 4, 2].iter().map(|&e| s[e]).collect();
        let z: f32 = p.iter().sum::<f32>() + 1e-20;
        for (w, q) in got.weights.iter().zip(&p) {
            assert!((w - q / z).abs() < 1e-6, "{:?}", got.weights);
        }
        let a = cr.counts().since(&RouteCounts::default()).unwrap();
        assert_eq!((a.swaps, a.slots), (1, 3));
        assert!((a.agree_pct - 200.0 / 3.0).abs() < 1e-9);
        // KL = -ln(mass exact routing gave the kept experts 0 and 2).
        let w = &exact.weights;
        let kept = (w[0] + w[2]) as f64 / w.iter().map(|&v| v as f64).sum::<f64>();
        assert!(
            (a.kl - (-kept.ln())).abs() < 1e-6,
            "{} vs {}",
            a.kl,
            -kept.ln()
        );
    }

    #[test]
    fn without_a_resident_candidate_the_cold_expert_stays() {
        let r = router(2, false);
        let (s, o, exact) = route(&r, &X);
        let cr = CacheRoute::new(
            CacheRouteConfig {
                m: Some(3),
                j: Some(0),
            },
            2,
            6,
        )
        .unwrap();
        let mut got = exact.clone();
        // Rank 3 (expert 2) is cold too: nothing to swap to.
        cr.apply(&o, &mut got, &[false, true, false, true, true, true], |x| {
            r.weigh(&s, x)
        });
        assert_eq!(got.experts, exact.experts);
        assert_eq!(got.weights, exact.weights);
        assert_eq!(cr.counts().swaps, 0);
    }

    #[test]
    fn out_of_range_options_are_refused_naming_the_option_and_range() {
        let e = CacheRoute::new(
            CacheRouteConfig {
                m: Some(1),
                j: None,
            },
            2,
            6,
        )
        .err()
        .unwrap()
        .to_string();
        assert!(
            e.contains("--route-m") && e.contains("from top_k (2) to the number of experts (6)"),
            "{e}"
        );
        let e = CacheRoute::new(
            CacheRouteConfig {
                m: Some(7),
                j: None,
            },
            2,
            6,
        )
        .err()
        .unwrap()
        .to_string();
        assert!(e.contains("--route-m") && e.contains('7'), "{e}");
        let e = CacheRoute::new(
            CacheRouteConfig {
                m: None,
                j: Some(3),
            },
            2,
            6,
        )
        .err()
        .unwrap()
        .to_string();
        assert!(
            e.contains("--route-j") && e.contains("0 to top_k (2)"),
            "{e}"
        );
        // The default window fits a model smaller than it.
        let cr = CacheRoute::new(CacheRouteConfig::default(), 2, 4).unwrap();
        assert_eq!((cr.m, cr.j), (4, 2));
    }
}
