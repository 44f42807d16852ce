//! Code point ranges to UTF-8 byte-range sequences, so the matcher works on bytes only (a
//! token may end in the middle of a character; the next one finishes it).

/// Sequences of inclusive byte ranges; a code point in `lo..=hi` (surrogates excluded) has
/// exactly one encoding and it matches exactly one of the returned sequences.
pub fn sequences(lo: u32, hi: u32, out: &mut Vec<Vec<(u8, u8)>>) {
    let hi = hi.min(0x10FFFF);
    if lo > hi {
        return;
    }
    // Surrogates have no UTF-8 encoding.
    if lo < 0xD800 && hi > 0xDFFF {
        sequences(lo, 0xD7FF, out);
        sequences(0xE000, hi, out);
        return;
    }
    let (lo, hi) = match (lo, hi) {
        (l, h) if (0xD800..=0xDFFF).contains(&l) && (0xD800..=0xDFFF).contains(&h) => return,
        (l, h) if (0xD800..=0xDFFF).contains(&l) => (0xE000, h),
        (l, h) if (0xD800..=0xDFFF).contains(&h) => (l, 0xD7FF),
        p => p,
    };
    if lo > hi {
        return;
    }
    // One encoded length per piece.
    for limit in [0x7F, 0x7FF, 0xFFFF] {
        if lo <= limit && hi > limit {
            sequences(lo, limit, out);
            sequences(limit + 1, hi, out);
            return;
        }
    }
    let n = encoded_len(lo);
    // Split until every continuation byte spans its full range below the first differing
    // byte, so the pair of encodings describes the set as a product of byte ranges.
    for i in 1..n {
        let m = (1u32 << (6 * i)) - 1;
        if lo & !m != hi & !m {
            if lo & m != 0 {
                sequences(lo, lo | m, out);
                sequences((lo | m) + 1, hi, out);
                return;
            }
            if hi & m != m {
                sequences(lo, (hi & !m) - 1, out);
                sequences(hi & !m, hi, out);
                return;
            }
        }
    }
    let a = encode(lo);
    let b = encode(hi);
    out.push(a.iter().zip(b.iter()).map(|(&x, &y)| (x, y)).collect());
}

fn encoded_len(c: u32) -> usize {
    match c {
        0..=0x7F => 1,
        0x80..=0x7FF => 2,
        0x800..=0xFFFF => 3,
        _ => 4,
    }
}

fn encode(c: u32) -> Vec<u8> {
    let ch = char::from_u32(c).expect("surrogates are split off before encoding");
    let mut buf = [0u8; 4];
    ch.encode_utf8(&mut buf).as_bytes().to_vec()
}

/// The complement of sorted, merged `ranges` within all code points.
pub fn complement(ranges: &[(u32, u32)]) -> Vec<(u32, u32)> {
    let mut out = Vec::new();
    let mut next = 0u32;
    for &(lo, hi) in ranges {
        if lo > next {
            out.push((next, lo - 1));
        }
        next = next.max(hi.saturating_add(1));
    }
    if next <= 0x10FFFF {
        out.push((next, 0x10FFFF));
    }
    out
}

/// Sorts and merges overlapping or touching ranges.
pub fn normalize(ranges: &[(u32, u32)]) -> Vec<(u32, u32)> {
    let mut v = ranges.to_vec();
    v.sort_unstable();
    let mut out: Vec<(u32, u32)> = Vec::with_capacity(v.len());
    for (lo, hi) in v {
        match out.last_mut() {
            Some(last) if lo <= last.1.saturating_add(1) => last.1 = last.1.max(hi),
            _ => out.push((lo, hi)),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn matches(seqs: &[Vec<(u8, u8)>], bytes: &[u8]) -> usize {
        seqs.iter()
            .filter(|s| {
                s.len() == bytes.len()
                    && s.iter()
                        .zip(bytes)
                        .all(|(&(lo, hi), &b)| lo <= b && b <= hi)
            })
            .count()
    }

    #[test]
    fn every_code_point_matches_exactly_once() {
        for &(lo, hi) in &[
            (0u32, 0x10FFFF),
            (0x41, 0x5A),
            (0x7F0, 0x10010),
            (0xE9, 0xE9),
        ] {
            let mut seqs = Vec::new();
            sequences(lo, hi, &mut seqs);
            let mut c = 0u32;
            while c <= 0x10FFFF {
                if let Some(ch) = char::from_u32(c) {
                    let mut buf = [0u8; 4];
                    let enc = ch.encode_utf8(&mut buf).as_bytes();
                    let want = usize::from(lo <= c && c <= hi);
                    assert_eq!(matches(&seqs, enc), want, "U+{c:04X} in {lo:X}..={hi:X}");
                }
                // Every code point near the edges, a sample elsewhere.
                c += if c < 0x1100 || (0xFF00..0x10100).contains(&c) {
                    1
                } else {
                    97
                };
            }
        }
    }

    #[test]
    fn complement_of_quote_and_backslash() {
        let n = normalize(&[(0x5C, 0x5C), (0x22, 0x22), (0, 0x1F)]);
        assert_eq!(n, vec![(0, 0x1F), (0x22, 0x22), (0x5C, 0x5C)]);
        assert_eq!(
            complement(&n),
            vec![(0x20, 0x21), (0x23, 0x5B), (0x5D, 0x10FFFF)]
        );
    }
}
