//! The AMX tile plumbing the prefill panels share (`kpanel_amx.rs`, the K-quants;
//! `iqpanel_amx.rs`, the lattice types, Q2_K and IQ1): whether this process may use the tiles,
//! the one tile configuration (every tile 16 rows of 64 bytes), the shapes it implies and the
//! two-group tile product both panels run. What differs between the panels (the weights'
//! unpacking, the float steps after the products, row sets) stays with each.

use std::arch::asm;
use std::arch::x86_64::*;
use std::sync::OnceLock;

/// Whether the tiles can be used: not turned off (`COLI_AMX=0`: the VNNI panel, the same
/// bits), CPUID's AMX-TILE and AMX-INT8, the OS's XSAVE support of the tile state (XCR0 bits
/// 17 and 18), and Linux's grant of it to this process (asked once; without it the first tile
/// instruction faults).
pub(super) fn amx_ready() -> bool {
    static READY: OnceLock<bool> = OnceLock::new();
    *READY.get_or_init(|| {
        if std::env::var("COLI_AMX").is_ok_and(|v| v.trim() == "0") {
            return false;
        }
        if !super::x86::has_panel_features() || !is_x86_feature_detected!("xsave") {
            return false;
        }
        let leaf7 = __cpuid_count(7, 0);
        let (tile, int8) = (leaf7.edx & (1 << 24) != 0, leaf7.edx & (1 << 25) != 0);
        if !tile || !int8 {
            return false;
        }
        // SAFETY: XSAVE is present (checked), so `xgetbv` with ECX = 0 is defined.
        let xcr0 = unsafe { _xgetbv(0) };
        if xcr0 & (3 << 17) != 3 << 17 {
            return false;
        }
        request_tile_state()
    })
}

/// Linux's `arch_prctl(ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA)`: 0 where granted.
#[cfg(target_os = "linux")]
fn request_tile_state() -> bool {
    const SYS_ARCH_PRCTL: i64 = 158;
    const ARCH_REQ_XCOMP_PERM: i64 = 0x1023;
    const XFEATURE_XTILEDATA: i64 = 18;
    let ret: i64;
    // SAFETY: the system call only changes which XSAVE state this process may use; it reads
    // and writes no memory of ours, and clobbers only rax (its result), rcx and r11.
    unsafe {
        asm!(
            "syscall",
            inlateout("rax") SYS_ARCH_PRCTL => ret,
            in("rdi") ARCH_REQ_XCOMP_PERM,
            in("rsi") XFEATURE_XTILEDATA,
            lateout("rcx") _,
            lateout("r11") _,
            options(nostack),
        );
    }
    ret == 0
}

#[cfg(not(target_os = "linux"))]
fn request_tile_state() -> bool {
    false
}

/// Weight rows a tile product (A's and C's rows).
pub(super) const R: usize = 16;
/// Positions a group: C's columns, B's sixteen 4-byte words a row.
pub(super) const P: usize = 16;
/// 4-input steps a 256-block.
pub(super) const STEPS: usize = 64;
/// Bytes a tile row, and the stride of every tile load and store here.
pub(super) const ROW: usize = 64;

/// `ldtilecfg`'s 64-byte operand (palette 1): every tile used here is 16 rows of 64 bytes.
#[repr(C, align(64))]
pub(super) struct TileConfig {
    palette: u8,
    start_row: u8,
    reserved: [u8; 14],
    colsb: [u16; 16],
    rows: [u8; 16],
    reserved_end: [u8; 16],
}

impl TileConfig {
    pub(super) fn all_16x64() -> TileConfig {
        let mut c = TileConfig {
            palette: 1,
            start_row: 0,
            reserved: [0; 14],
            colsb: [0; 16],
            rows: [0; 16],
            reserved_end: [0; 16],
        };
        for t in 0..8 {
            c.colsb[t] = ROW as u16;
            c.rows[t] = 16;
        }
        c
    }
}

/// Two groups' tile sums, as stored: `[group][hi, lo][row][position]`.
#[repr(C, align(64))]
pub(super) struct Sums(pub(super) [[[[i32; P]; R]; 2]; 2]);

/// The tile products of one block of sixteen rows (`$u`: any type with 4 KiB planes `hi`
/// and `lo`, `[64-input chunk][row][64 bytes]`) against two groups of sixteen positions
/// (`$b0`, `$b1`: each the block's 64 steps of 64 bytes), into `$c` ([`Sums`]), with the
/// tile product instruction `$op` (`tdpbusd`, `tdpbssd`). The panels' `tile_pair`s.
macro_rules! tile_pair_with {
    ($op:literal, $u:expr, $b0:expr, $b1:expr, $c:expr) => {
        // tmm0..3: C of (group 0, hi), (0, lo), (1, hi), (1, lo); tmm4/5: A hi/lo; tmm6/7: B
        // of groups 0/1. Chunk k of `hi`/`lo` is at 1024 k bytes, of a group's steps also at
        // 1024 k. Every tile load reads 16 rows of 64 bytes at a 64-byte stride from the
        // start of `u.hi[k]`, `u.lo[k]` or 16 steps of `b0`/`b1` (4 KiB each, 1 KiB a chunk),
        // and every store writes 16 rows of 64 bytes into `c` (4 KiB, 1 KiB a tile): all in
        // bounds.
        ::std::arch::asm!(
            "tilezero tmm0",
            "tilezero tmm1",
            "tilezero tmm2",
            "tilezero tmm3",
            "tileloadd tmm4, [{ah} + {s}]",
            "tileloadd tmm5, [{al} + {s}]",
            "tileloadd tmm6, [{b0} + {s}]",
            "tileloadd tmm7, [{b1} + {s}]",
            concat!($op, " tmm0, tmm4, tmm6"),
            concat!($op, " tmm1, tmm5, tmm6"),
            concat!($op, " tmm2, tmm4, tmm7"),
            concat!($op, " tmm3, tmm5, tmm7"),
            "tileloadd tmm4, [{ah} + {s} + 1024]",
            "tileloadd tmm5, [{al} + {s} + 1024]",
            "tileloadd tmm6, [{b0} + {s} + 1024]",
            "tileloadd tmm7, [{b1} + {s} + 1024]",
            concat!($op, " tmm0, tmm4, tmm6"),
            concat!($op, " tmm1, tmm5, tmm6"),
            concat!($op, " tmm2, tmm4, tmm7"),
            concat!($op, " tmm3, tmm5, tmm7"),
            "tileloadd tmm4, [{ah} + {s} + 2048]",
            "tileloadd tmm5, [{al} + {s} + 2048]",
            "tileloadd tmm6, [{b0} + {s} + 2048]",
            "tileloadd tmm7, [{b1} + {s} + 2048]",
            concat!($op, " tmm0, tmm4, tmm6"),
            concat!($op, " tmm1, tmm5, tmm6"),
            concat!($op, " tmm2, tmm4, tmm7"),
            concat!($op, " tmm3, tmm5, tmm7"),
            "tileloadd tmm4, [{ah} + {s} + 3072]",
            "tileloadd tmm5, [{al} + {s} + 3072]",
            "tileloadd tmm6, [{b0} + {s} + 3072]",
            "tileloadd tmm7, [{b1} + {s} + 3072]",
            concat!($op, " tmm0, tmm4, tmm6"),
            concat!($op, " tmm1, tmm5, tmm6"),
            concat!($op, " tmm2, tmm4, tmm7"),
            concat!($op, " tmm3, tmm5, tmm7"),
            "tilestored [{c} + {s}], tmm0",
            "tilestored [{c} + {s} + 1024], tmm1",
            "tilestored [{c} + {s} + 2048], tmm2",
            "tilestored [{c} + {s} + 3072], tmm3",
            ah = in(reg) $u.hi.as_ptr(),
            al = in(reg) $u.lo.as_ptr(),
            b0 = in(reg) $b0.as_ptr(),
            b1 = in(reg) $b1.as_ptr(),
            c = in(reg) $c.0.as_mut_ptr(),
            s = in(reg) $crate::quant::ggml::amx::ROW,
            options(nostack, preserves_flags),
        )
    };
}

/// [`tile_pair_with`] for one group of sixteen positions (`$b0`, a last single group),
/// into `$c.0[0]`: half the products.
macro_rules! tile_one_with {
    ($op:literal, $u:expr, $b0:expr, $c:expr) => {
        // tmm0/1: C of hi/lo; tmm4/5: A hi/lo; tmm6: B, as in `tile_pair_with`. Every load
        // reads 16 rows of 64 bytes inside `$u.hi[k]`, `$u.lo[k]` or `$b0`'s chunk k, every
        // store writes 1 KiB inside `$c.0[0]` (2 KiB): all in bounds.
        ::std::arch::asm!(
            "tilezero tmm0",
            "tilezero tmm1",
            "tileloadd tmm4, [{ah} + {s}]",
            "tileloadd tmm5, [{al} + {s}]",
            "tileloadd tmm6, [{b0} + {s}]",
            concat!($op, " tmm0, tmm4, tmm6"),
            concat!($op, " tmm1, tmm5, tmm6"),
            "tileloadd tmm4, [{ah} + {s} + 1024]",
            "tileloadd tmm5, [{al} + {s} + 1024]",
            "tileloadd tmm6, [{b0} + {s} + 1024]",
            concat!($op, " tmm0, tmm4, tmm6"),
            concat!($op, " tmm1, tmm5, tmm6"),
            "tileloadd tmm4, [{ah} + {s} + 2048]",
            "tileloadd tmm5, [{al} + {s} + 2048]",
            "tileloadd tmm6, [{b0} + {s} + 2048]",
            concat!($op, " tmm0, tmm4, tmm6"),
            concat!($op, " tmm1, tmm5, tmm6"),
            "tileloadd tmm4, [{ah} + {s} + 3072]",
            "tileloadd tmm5, [{al} + {s} + 3072]",
            "tileloadd tmm6, [{b0} + {s} + 3072]",
            concat!($op, " tmm0, tmm4, tmm6"),
            concat!($op, " tmm1, tmm5, tmm6"),
            "tilestored [{c} + {s}], tmm0",
            "tilestored [{c} + {s} + 1024], tmm1",
            ah = in(reg) $u.hi.as_ptr(),
            al = in(reg) $u.lo.as_ptr(),
            b0 = in(reg) $b0.as_ptr(),
            c = in(reg) $c.0.as_mut_ptr(),
            s = in(reg) $crate::quant::ggml::amx::ROW,
            options(nostack, preserves_flags),
        )
    };
}

pub(super) use {tile_one_with, tile_pair_with};
