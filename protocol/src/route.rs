//! Upstream's optional STAT suffix while cache-aware routing is on (`CACHE_ROUTE=1`):
//! ` swap_pct=%.1f route_swaps=%llu route_slots=%llu route_agree=%.1f route_kl=%.4f`.
//! Its presence says the turn's outputs were computed with approximate routing.

use crate::num::{parse_f64, parse_u64, push_fixed};

/// How far a turn's routing strayed from the router's exact top-k.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct RouteAgree {
    /// Percent of the routed expert slots given to another (resident) expert.
    pub swap_pct: f64,
    /// Slots swapped.
    pub swaps: u64,
    /// Expert slots routed (tokens x sparse layers x top-k).
    pub slots: u64,
    /// Percent of the chosen experts exact routing would also have chosen.
    pub agree_pct: f64,
    /// Mean over routings of `-ln` of the exact weight mass the swaps kept: the KL divergence
    /// of the exact weights restricted to the kept experts from the exact weights (0 when
    /// nothing was swapped).
    pub kl: f64,
}

impl RouteAgree {
    /// Appends the suffix, leading space included.
    pub fn push_suffix(&self, s: &mut String) {
        s.push_str(" swap_pct=");
        push_fixed(s, self.swap_pct, 1);
        s.push_str(&format!(
            " route_swaps={} route_slots={} route_agree=",
            self.swaps, self.slots
        ));
        push_fixed(s, self.agree_pct, 1);
        s.push_str(" route_kl=");
        push_fixed(s, self.kl, 4);
    }

    /// The suffix from the `key=value` fields of a STAT line; `None` unless all five are there.
    pub fn parse<'a>(fields: impl Iterator<Item = &'a [u8]>) -> Option<RouteAgree> {
        let mut r = RouteAgree::default();
        let mut seen = 0u8;
        for f in fields {
            let Some(eq) = f.iter().position(|&b| b == b'=') else {
                continue;
            };
            let (k, v) = (&f[..eq], &f[eq + 1..]);
            let bit = match k {
                b"swap_pct" => {
                    r.swap_pct = parse_f64(v)?;
                    1
                }
                b"route_swaps" => {
                    r.swaps = parse_u64(v)?;
                    2
                }
                b"route_slots" => {
                    r.slots = parse_u64(v)?;
                    4
                }
                b"route_agree" => {
                    r.agree_pct = parse_f64(v)?;
                    8
                }
                b"route_kl" => {
                    r.kl = parse_f64(v)?;
                    16
                }
                _ => 0,
            };
            seen |= bit;
        }
        (seen == 31).then_some(r)
    }
}

#[cfg(test)]
mod tests {
    use crate::{parse_stat_line, RouteAgree, Stat};

    const SUFFIX: &str =
        " swap_pct=12.5 route_swaps=3 route_slots=24 route_agree=87.5 route_kl=0.0421";

    fn agree() -> RouteAgree {
        RouteAgree {
            swap_pct: 12.5,
            swaps: 3,
            slots: 24,
            agree_pct: 87.5,
            kl: 0.0421,
        }
    }

    #[test]
    fn the_suffix_has_upstreams_bytes_after_either_form_and_parses_back() {
        for (prompt, head) in [
            (Some((9, true)), "STAT 4 2.50 75.0 1.31 9 1"),
            (None, "STAT 4 2.50 75.0 1.31"),
        ] {
            let s = Stat {
                completion_tokens: 4,
                tok_per_s: 2.5,
                hit_pct: 75.0,
                rss_gb: 1.31,
                prompt,
                route: Some(agree()),
                prefetch: None,
            };
            let line = s.to_line();
            assert_eq!(line, format!("{head}{SUFFIX}"));
            assert_eq!(parse_stat_line(line.as_bytes()), Some(s));
        }
    }

    #[test]
    fn an_incomplete_or_unknown_suffix_is_no_route() {
        let line = "STAT 4 2.50 75.0 1.31 9 0 swap_pct=12.5 route_swaps=3";
        let s = parse_stat_line(line.as_bytes()).unwrap();
        assert_eq!(s.route, None);
        assert_eq!(s.prompt, Some((9, false)));
        let s = parse_stat_line(b"STAT 4 2.50 75.0 1.31 x=1").unwrap();
        assert_eq!((s.route, s.prompt), (None, None));
    }
}
