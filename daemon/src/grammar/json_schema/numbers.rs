//! `minimum` / `maximum` / `exclusiveMinimum` / `exclusiveMaximum` as digit automata.
//!
//! A bounded number is written without an exponent (the grammar chooses the spelling, so
//! nothing is lost) and a value's digits are compared with the bound's digit by digit: an
//! integer part strictly between the bounds' takes any fraction, one equal to a bound's takes
//! a fraction compared digit by digit with that bound's. The same digit limits as the
//! unbounded primitives (15 integer digits, 16 fraction digits) keep every value exact and
//! finite.

use std::cmp::Ordering;

/// Fraction digits at most.
const FRAC_DIGITS: usize = 16;
/// The largest integer part written (15 digits: every value stays within 2^53).
const INT_MAX: u64 = 999_999_999_999_999;

/// A decimal bound: sign, integer part (`None`: past [`INT_MAX`]) and fraction digits
/// (no trailing zeros, so the digits compare as strings).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Dec {
    pub neg: bool,
    pub int: Option<u64>,
    pub frac: Vec<u8>,
}

impl Dec {
    /// A JSON number's text (`-1.5e-3` too) as a decimal; `None` for a fraction past
    /// [`FRAC_DIGITS`] digits (the grammar could not write the bound itself).
    pub fn parse(text: &str) -> Option<Dec> {
        let (neg, rest) = match text.strip_prefix('-') {
            Some(r) => (true, r),
            None => (false, text),
        };
        let (mant, exp) = match rest.find(['e', 'E']) {
            Some(i) => (&rest[..i], rest[i + 1..].parse::<i64>().ok()?),
            None => (rest, 0),
        };
        let (ip, fp) = mant.split_once('.').unwrap_or((mant, ""));
        let digits: Vec<u8> = ip.bytes().chain(fp.bytes()).map(|b| b - b'0').collect();
        if digits.iter().any(|&d| d > 9) || exp.abs() > 400 {
            return None;
        }
        // The decimal point sits after `point` digits.
        let point = ip.len() as i64 + exp;
        let at = |i: i64| -> u8 {
            if i < 0 || i >= digits.len() as i64 {
                0
            } else {
                digits[i as usize]
            }
        };
        let mut int: Option<u64> = Some(0);
        for i in 0..point.max(0) {
            int = int
                .and_then(|v| v.checked_mul(10))
                .and_then(|v| v.checked_add(at(i) as u64))
                .filter(|&v| v <= INT_MAX);
            if int.is_none() {
                break;
            }
        }
        let mut frac: Vec<u8> = (point..digits.len() as i64).map(at).collect();
        while frac.last() == Some(&0) {
            frac.pop();
        }
        if frac.len() > FRAC_DIGITS {
            return None;
        }
        let zero = int == Some(0) && frac.is_empty();
        Some(Dec {
            neg: neg && !zero,
            int,
            frac,
        })
    }

    /// The magnitude's order.
    fn cmp_abs(&self, o: &Dec) -> Ordering {
        let int = |d: &Dec| d.int.map_or(u128::MAX, u128::from);
        int(self).cmp(&int(o)).then_with(|| self.frac.cmp(&o.frac))
    }

    fn abs(&self) -> Dec {
        Dec {
            neg: false,
            ..self.clone()
        }
    }
}

impl Ord for Dec {
    fn cmp(&self, o: &Dec) -> Ordering {
        match (self.neg, o.neg) {
            (false, true) => Ordering::Greater,
            (true, false) => Ordering::Less,
            (false, false) => self.cmp_abs(o),
            (true, true) => o.cmp_abs(self),
        }
    }
}

impl PartialOrd for Dec {
    fn partial_cmp(&self, o: &Dec) -> Option<Ordering> {
        Some(self.cmp(o))
    }
}

/// A bound and whether it is exclusive.
pub type Bound = (Dec, bool);

/// GBNF for the numbers within `lo`..`hi` (`integer`: no fraction); `None` when there is
/// none the grammar can write.
pub fn range(lo: Option<&Bound>, hi: Option<&Bound>, integer: bool) -> Option<String> {
    if integer {
        return int_values(lo, hi);
    }
    let mut alts = Vec::new();
    // Zero and up.
    let nonneg_lo = match lo {
        Some((d, x)) if !d.neg => Some((d.clone(), *x)),
        _ => None,
    };
    if !hi.is_some_and(|(d, _)| d.neg) {
        alts.extend(magnitude(nonneg_lo.as_ref(), hi));
    }
    // Below zero: the magnitude above |hi| (or above 0) and below |lo|.
    if !lo.is_some_and(|(d, _)| !d.neg) {
        let m_lo = match hi {
            Some((d, x)) if d.neg => (d.abs(), *x),
            _ => (Dec::parse("0").expect("zero"), true),
        };
        let m_hi = lo.map(|(d, x)| (d.abs(), *x));
        if let Some(m) = magnitude(Some(&m_lo), m_hi.as_ref()) {
            alts.push(format!("\"-\" {m}"));
        }
    }
    join(alts)
}

fn join(alts: Vec<String>) -> Option<String> {
    match alts.len() {
        0 => None,
        1 => alts.into_iter().next(),
        _ => Some(format!("( {} )", alts.join(" | "))),
    }
}

/// Integers in the bounds: rounded inward to whole numbers, then digit ranges.
fn int_values(lo: Option<&Bound>, hi: Option<&Bound>) -> Option<String> {
    // As i128: the integer parts are at most INT_MAX; `None` magnitudes are past it.
    let whole = |d: &Dec| -> i128 {
        let m = d.int.map_or(INT_MAX as i128 + 1, |v| v as i128);
        if d.neg {
            -m
        } else {
            m
        }
    };
    let lo_i = lo.map_or(-(INT_MAX as i128), |(d, x)| {
        let w = whole(d);
        // Truncation rounds toward zero: up for a positive fraction, already up below 0.
        let w = if d.frac.is_empty() {
            w + i128::from(*x)
        } else if d.neg {
            w
        } else {
            w + 1
        };
        w.max(-(INT_MAX as i128))
    });
    let hi_i = hi.map_or(INT_MAX as i128, |(d, x)| {
        let w = whole(d);
        let w = if d.frac.is_empty() {
            w - i128::from(*x)
        } else if d.neg {
            w - 1
        } else {
            w
        };
        w.min(INT_MAX as i128)
    });
    if lo_i > hi_i {
        return None;
    }
    let mut alts = Vec::new();
    if hi_i >= 0 {
        alts.push(int_range(lo_i.max(0) as u64, hi_i as u64));
    }
    if lo_i < 0 {
        let a = (-hi_i).max(1) as u64;
        alts.push(format!("\"-\" {}", int_range(a, (-lo_i) as u64)));
    }
    join(alts)
}

/// Canonical decimal integers (no leading zero) in `lo..=hi`.
pub fn int_range(lo: u64, hi: u64) -> String {
    let len = |v: u64| v.to_string().len();
    let mut alts = Vec::new();
    for n in len(lo)..=len(hi) {
        let first = if n == 1 { 0 } else { 10u64.pow(n as u32 - 1) };
        let last = 10u64.pow(n as u32) - 1;
        let (a, b) = (lo.max(first), hi.min(last));
        if a <= b {
            alts.push(same_len(a.to_string().as_bytes(), b.to_string().as_bytes()));
        }
    }
    join(alts).expect("lo <= hi")
}

/// Digit strings of one length between `lo` and `hi` (as text, same length).
fn same_len(lo: &[u8], hi: &[u8]) -> String {
    if lo.is_empty() {
        return "\"\"".into();
    }
    let n = lo.len() - 1;
    let any = |n: usize| {
        if n == 0 {
            String::new()
        } else {
            format!(" [0-9]{{{n}}}")
        }
    };
    if lo[1..].iter().all(|&b| b == b'0') && hi[1..].iter().all(|&b| b == b'9') {
        return format!("[{}-{}]{}", lo[0] as char, hi[0] as char, any(n));
    }
    if lo[0] == hi[0] {
        return format!("\"{}\" {}", lo[0] as char, same_len(&lo[1..], &hi[1..]));
    }
    let nines = vec![b'9'; n];
    let zeros = vec![b'0'; n];
    let mut alts = vec![format!(
        "\"{}\" {}",
        lo[0] as char,
        same_len(&lo[1..], &nines)
    )];
    if lo[0] + 1 < hi[0] {
        alts.push(format!(
            "[{}-{}]{}",
            (lo[0] + 1) as char,
            (hi[0] - 1) as char,
            any(n)
        ));
    }
    alts.push(format!(
        "\"{}\" {}",
        hi[0] as char,
        same_len(&zeros, &hi[1..])
    ));
    format!("( {} )", alts.join(" | "))
}

/// Non-negative decimals (integer part, then an optional `.` and fraction) between the
/// bounds, both of them non-negative.
fn magnitude(lo: Option<&Bound>, hi: Option<&Bound>) -> Option<String> {
    if let (Some((l, lx)), Some((h, hx))) = (lo, hi) {
        match l.cmp(h) {
            Ordering::Greater => return None,
            Ordering::Equal if *lx || *hx => return None,
            _ => {}
        }
    }
    // A lower bound past the largest integer part: nothing the grammar writes.
    let li = match lo {
        Some((d, _)) => d.int?,
        None => 0,
    };
    let hi = hi.filter(|(d, _)| d.int.is_some());
    let hi_i = hi.map_or(INT_MAX, |(d, _)| d.int.expect("filtered"));
    let lo_f = lo.map(|(d, x)| (&d.frac[..], *x));
    let hi_f = hi.map(|(d, x)| (&d.frac[..], *x));
    let mut alts = Vec::new();
    if li == hi_i {
        if let Some(t) = frac_tail(lo_f, hi_f) {
            alts.push(format!("{} {t}", int_range(li, li)));
        }
    } else {
        if li + 1 < hi_i {
            alts.push(format!(
                "{} ( \".\" [0-9]{{1,{FRAC_DIGITS}}} )?",
                int_range(li + 1, hi_i - 1)
            ));
        }
        if let Some(t) = frac_tail(lo_f, None) {
            alts.push(format!("{} {t}", int_range(li, li)));
        }
        if let Some(t) = frac_tail(None, hi_f) {
            alts.push(format!("{} {t}", int_range(hi_i, hi_i)));
        }
    }
    join(alts)
}

type FracBound<'a> = Option<(&'a [u8], bool)>;

/// What follows an integer part: nothing or `.` and 1..=16 digits, the fraction within the
/// bounds (fraction digits; exclusive or not).
fn frac_tail(lo: FracBound, hi: FracBound) -> Option<String> {
    let zero_ok = zero_fits(lo, hi);
    let digits = frac_digits(lo, hi, FRAC_DIGITS);
    match (zero_ok, digits) {
        (true, Some(d)) => Some(format!("( \".\" {d} )?")),
        (true, None) => Some("\"\"".into()),
        (false, Some(d)) => Some(format!("\".\" {d}")),
        (false, None) => None,
    }
}

/// Whether a fraction of 0 (no more digits) is within the bounds.
fn zero_fits(lo: FracBound, hi: FracBound) -> bool {
    let lo_ok = lo.is_none_or(|(f, x)| f.iter().all(|&d| d == 0) && !x);
    let hi_ok = hi.is_none_or(|(f, x)| !(f.iter().all(|&d| d == 0) && x));
    lo_ok && hi_ok
}

/// One or more (at most `left`) fraction digits within the bounds.
fn frac_digits(lo: FracBound, hi: FracBound, left: usize) -> Option<String> {
    if left == 0 {
        return None;
    }
    let mut free = Vec::new();
    let mut alts = Vec::new();
    for d in 0..=9u8 {
        let next_lo = match lo {
            None => Some(None),
            Some((f, x)) => {
                let l0 = f.first().copied().unwrap_or(0);
                match d.cmp(&l0) {
                    Ordering::Greater => Some(None),
                    Ordering::Less => None,
                    Ordering::Equal => Some(Some((f.get(1..).unwrap_or(&[]), x))),
                }
            }
        };
        let next_hi = match hi {
            None => Some(None),
            Some((f, x)) => {
                let h0 = f.first().copied().unwrap_or(0);
                match d.cmp(&h0) {
                    Ordering::Less => Some(None),
                    Ordering::Greater => None,
                    Ordering::Equal => Some(Some((f.get(1..).unwrap_or(&[]), x))),
                }
            }
        };
        let (Some(nl), Some(nh)) = (next_lo, next_hi) else {
            continue;
        };
        if nl.is_none() && nh.is_none() {
            free.push(d);
            continue;
        }
        // This digit, then either nothing more (if a fraction ending here fits) or more.
        let end = zero_fits(nl, nh);
        let more = frac_digits(nl, nh, left - 1);
        let digit = format!("\"{d}\"");
        match (end, more) {
            (true, Some(m)) => alts.push(format!("{digit} {m}?")),
            (true, None) => alts.push(digit),
            (false, Some(m)) => alts.push(format!("{digit} {m}")),
            (false, None) => {}
        }
    }
    if !free.is_empty() {
        let class: String = free.iter().map(|d| (b'0' + d) as char).collect();
        let rest = if left > 1 {
            format!(" [0-9]{{0,{}}}", left - 1)
        } else {
            String::new()
        };
        alts.push(format!("[{class}]{rest}"));
    }
    join(alts).map(|a| {
        if a.starts_with('(') {
            a
        } else {
            format!("( {a} )")
        }
    })
}
