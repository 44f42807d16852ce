//! Differential check of the float formatting against the C library's own `snprintf`, the
//! function upstream's lines come from. The only deliberate difference: a negative value
//! that rounds to zero prints without its sign (`0.00`, glibc `-0.00`).
#![cfg(all(unix, target_env = "gnu"))]

use std::ffi::{c_char, c_int};

use protocol::num::fixed;

extern "C" {
    fn snprintf(buf: *mut c_char, n: usize, fmt: *const c_char, ...) -> c_int;
}

fn c_fixed(x: f64, prec: usize) -> String {
    let fmt = format!("%.{prec}f\0");
    let mut buf = vec![0u8; 2048];
    // SAFETY: `buf` is writable for `buf.len()` bytes, `fmt` is NUL-terminated and takes
    // exactly one double, which is what is passed.
    let n = unsafe { snprintf(buf.as_mut_ptr().cast(), buf.len(), fmt.as_ptr().cast(), x) };
    assert!(n >= 0 && (n as usize) < buf.len());
    buf.truncate(n as usize);
    String::from_utf8(buf).unwrap()
}

fn check(x: f64) {
    for prec in [1, 2, 3] {
        let c = c_fixed(x, prec);
        let ours = fixed(x, prec);
        let negative_zero = c.starts_with('-') && c[1..].bytes().all(|b| b == b'0' || b == b'.');
        if negative_zero {
            assert_eq!(ours, &c[1..], "{x:e} %.{prec}f");
        } else {
            assert_eq!(ours, c, "{x:e} %.{prec}f");
        }
    }
}

#[test]
fn matches_glibc_printf() {
    for x in [
        0.0,
        -0.0,
        0.125,
        0.375,
        2.675,
        0.05,
        0.15,
        0.25,
        0.35,
        1.005,
        1.0005,
        99.995,
        1e15,
        -2.5,
        f64::MIN_POSITIVE,
        f64::INFINITY,
        f64::NEG_INFINITY,
        f64::NAN,
        1e300,
    ] {
        check(x);
    }
    // Exact ties at each precision, and their neighbours.
    for k in -20_000i64..20_000 {
        for d in [2.0, 20.0, 200.0, 2000.0, 8.0, 16.0, 1024.0] {
            let x = k as f64 / d;
            check(x);
            check(f64::from_bits(x.to_bits() + 1));
        }
    }
    // Random doubles of ordinary magnitudes.
    let mut s = 0x1234_5678_9abc_def1u64;
    for _ in 0..200_000 {
        s ^= s >> 12;
        s ^= s << 25;
        s ^= s >> 27;
        let r = s.wrapping_mul(0x2545_F491_4F6C_DD1D);
        let mantissa = (r >> 12) as f64 / (1u64 << 52) as f64;
        let exp = ((r & 0xff) as i32 % 40) - 20;
        let x = mantissa * 10f64.powi(exp) * if r & 0x100 != 0 { -1.0 } else { 1.0 };
        check(x);
    }
}
