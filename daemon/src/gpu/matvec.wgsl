// The products of every weight format (see matvec.rs for the contract).
//
// Group 0 is the matrix's own (made once at upload), group 1 the process's shared activation,
// info and output buffers, with one `Call` per product selected by a dynamic offset.

struct Mat {
    rows: u32,
    cols: u32,
    row_words: u32,
    // 0 int8 row, 1 int4 row, 2 int2 row, 3 int4-g64, 4 int3-g64, 5 f32, 6 MXFP4.
    fmt: u32,
    // Scales per row (0 for f32, 1 for the per-row formats, one per 64-group for the grouped
    // ones, one per 32-group for MXFP4).
    spr: u32,
    // Always 0, but unknown to the compiler: see `rounded`.
    zero: u32,
    pad1: u32,
    pad2: u32,
};

struct Call {
    n: u32,
    // 0: int8 activations, 1: f32 activations.
    act: u32,
    x_off: u32,
    x_stride: u32,
    info_off: u32,
    info_stride: u32,
    y_off: u32,
    // The CPU's f32 dot order to follow: 0 portable, 1 AVX2, 2 AVX-512 (see `dot_f32`).
    order: u32,
};

@group(0) @binding(0) var<uniform> mat: Mat;
@group(0) @binding(1) var<storage, read> w: array<u32>;
@group(0) @binding(2) var<storage, read> scales: array<f32>;
@group(1) @binding(0) var<uniform> call: Call;
@group(1) @binding(1) var<storage, read> x: array<u32>;
@group(1) @binding(2) var<storage, read> xinfo: array<u32>;
@group(1) @binding(3) var<storage, read_write> y: array<f32>;

// Signed byte k (0..4) of a word.
fn sb(v: u32, k: u32) -> i32 { return bitcast<i32>(v << (24u - 8u * k)) >> 24u; }

// The correctly rounded `acc as f32`: two exactly representable halves added once (a plain
// `f32(acc)` above 2^24 may round either way on some devices).
fn exact_f32(acc: i32) -> f32 {
    let hi = acc >> 12u;
    let lo = acc - (hi << 12u);
    return f32(hi) * 4096.0 + f32(lo);
}

// `p` rounded to f32 on its own. A compiler may fuse `a + b * c` into one multiply-add (one
// rounding instead of the CPU's two); passing the product through an operation it cannot see
// through (an xor with a zero it reads from memory) keeps the CPU's two roundings.
fn rounded(p: f32) -> f32 { return bitcast<f32>(bitcast<u32>(p) ^ mat.zero); }

// Byte i of the row starting at word wb.
fn wbyte(wb: u32, i: u32) -> u32 { return (w[wb + (i >> 2u)] >> (8u * (i & 3u))) & 255u; }

// Signed activation k of the position starting at word xb (int8 activations).
fn xq(xb: u32, k: u32) -> i32 { return sb(x[xb + (k >> 2u)], k & 3u); }

// Weight (r, k) as the CPU's dequantization gives it: `q as f32 * scale`.
fn weight(r: u32, wb: u32, k: u32) -> f32 {
    let sb0 = r * mat.spr;
    switch mat.fmt {
        case 0u: { return f32(sb(w[wb + (k >> 2u)], k & 3u)) * scales[sb0]; }
        case 1u: { return f32(i32((wbyte(wb, k >> 1u) >> (4u * (k & 1u))) & 15u) - 8) * scales[sb0]; }
        case 2u: { return f32(i32((wbyte(wb, k >> 2u) >> (2u * (k & 3u))) & 3u) - 2) * scales[sb0]; }
        case 3u: {
            return f32(i32((wbyte(wb, k >> 1u) >> (4u * (k & 1u))) & 15u) - 8) * scales[sb0 + (k >> 6u)];
        }
        case 4u: {
            let g = k >> 6u;
            let e = k & 63u;
            let gb = wb + 6u * g;
            let lo = (w[gb + (e >> 4u)] >> (2u * (e & 15u))) & 3u;
            let hi = (w[gb + 4u + (e >> 5u)] >> (e & 31u)) & 1u;
            return f32(i32(lo | (hi << 2u)) - 4) * scales[sb0 + g];
        }
        default: { return bitcast<f32>(w[wb + k]); }
    }
}

// f32 activations: the order of the CPU's `dot_f32` in the kernel set it runs, so that where
// the device's `fma` is fused (as the CPU's is) and its adds and multiplies correctly rounded,
// the bits are the CPU's.
fn dot_f32(r: u32, wb: u32, xb: u32) -> f32 {
    if (call.order == 1u) { return dot_f32_avx2(r, wb, xb); }
    if (call.order == 2u) { return dot_f32_avx512(r, wb, xb); }
    // Portable: eight partial sums over whole blocks of eight (no fused multiply-add), the
    // tail summed apart, then a fixed tree.
    var acc: array<f32, 8>;
    let whole = (mat.cols / 8u) * 8u;
    for (var k = 0u; k < whole; k = k + 8u) {
        for (var l = 0u; l < 8u; l = l + 1u) {
            acc[l] = acc[l] + rounded(weight(r, wb, k + l) * bitcast<f32>(x[xb + k + l]));
        }
    }
    var tail = 0.0;
    for (var k = whole; k < mat.cols; k = k + 1u) {
        tail = tail + rounded(weight(r, wb, k) * bitcast<f32>(x[xb + k]));
    }
    let s = ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7]));
    return s + tail;
}

// Element k's `fma` into `acc`.
fn fma_at(r: u32, wb: u32, xb: u32, k: u32, acc: f32) -> f32 {
    return fma(weight(r, wb, k), bitcast<f32>(x[xb + k]), acc);
}

// AVX2: four chains of eight fused lanes over blocks of 32, then blocks of eight into the
// first, the chains added, a horizontal sum, then the tail one product at a time, unfused.
fn dot_f32_avx2(r: u32, wb: u32, xb: u32) -> f32 {
    var c: array<f32, 32>;
    let n = mat.cols;
    var i = 0u;
    for (; i + 32u <= n; i = i + 32u) {
        for (var j = 0u; j < 32u; j = j + 1u) { c[j] = fma_at(r, wb, xb, i + j, c[j]); }
    }
    for (; i + 8u <= n; i = i + 8u) {
        for (var l = 0u; l < 8u; l = l + 1u) { c[l] = fma_at(r, wb, xb, i + l, c[l]); }
    }
    var v: array<f32, 8>;
    for (var l = 0u; l < 8u; l = l + 1u) { v[l] = (c[l] + c[8u + l]) + (c[16u + l] + c[24u + l]); }
    var s = ((v[0] + v[4]) + (v[2] + v[6])) + ((v[1] + v[5]) + (v[3] + v[7]));
    for (; i < n; i = i + 1u) {
        s = s + rounded(weight(r, wb, i) * bitcast<f32>(x[xb + i]));
    }
    return s;
}

// AVX-512: four chains of sixteen fused lanes over blocks of 64, then the rest sixteen at a
// time into the first (lanes past the end add nothing), the chains added, then halves,
// quarters, pairs and the last two.
fn dot_f32_avx512(r: u32, wb: u32, xb: u32) -> f32 {
    var c: array<f32, 64>;
    let n = mat.cols;
    var i = 0u;
    for (; i + 64u <= n; i = i + 64u) {
        for (var j = 0u; j < 64u; j = j + 1u) { c[j] = fma_at(r, wb, xb, i + j, c[j]); }
    }
    for (; i < n; i = i + 16u) {
        for (var l = 0u; l < 16u && i + l < n; l = l + 1u) { c[l] = fma_at(r, wb, xb, i + l, c[l]); }
    }
    var v: array<f32, 16>;
    for (var l = 0u; l < 16u; l = l + 1u) { v[l] = (c[l] + c[16u + l]) + (c[32u + l] + c[48u + l]); }
    for (var l = 0u; l < 8u; l = l + 1u) { v[l] = v[l] + v[l + 8u]; }
    for (var l = 0u; l < 4u; l = l + 1u) { v[l] = v[l] + v[l + 4u]; }
    return (v[0] + v[2]) + (v[1] + v[3]);
}

// The e2m1 value of code c (bit 3 the sign), as the CPU's `E2M1` table: every step exact.
fn e2m1(c: u32) -> f32 {
    let m = c & 7u;
    let e = m >> 1u;
    var v = f32(m & 1u) * 0.5;
    if (e > 0u) { v = (1.0 + v) * f32(1u << (e - 1u)); }
    if ((c & 8u) != 0u) { v = -v; }
    return v;
}

// An MXFP4 row against f32 activations in `mxfp4::dot_row`'s order: word i holds elements
// 8i .. 8i + 8 (two a byte, the even one low), element 8i + t into lane t, each weight
// `e2m1 * scale` (exact) times the activation rounded on its own, then the CPU's fixed tree.
fn dot_mxfp4(r: u32, wb: u32, xb: u32) -> f32 {
    var acc: array<f32, 8>;
    for (var i = 0u; i < mat.row_words; i = i + 1u) {
        let a = w[wb + i];
        // Four words make a group of 32.
        let s = scales[r * mat.spr + (i >> 2u)];
        for (var t = 0u; t < 8u; t = t + 1u) {
            let wt = e2m1((a >> (4u * t)) & 15u) * s;
            acc[t] = acc[t] + rounded(wt * bitcast<f32>(x[xb + 8u * i + t]));
        }
    }
    return ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7]));
}

// Exact integer dot of a per-row format against int8 activations, the stored unsigned fields
// corrected by the activation total as on the CPU (wrapping as there).
fn dot_row(wb: u32, xb: u32, total: i32) -> i32 {
    var acc: i32 = 0;
    if (mat.fmt == 0u) {
        for (var i = 0u; i < mat.row_words; i = i + 1u) {
            let a = w[wb + i];
            let b = x[xb + i];
            acc = acc + sb(a, 0u) * sb(b, 0u) + sb(a, 1u) * sb(b, 1u)
                      + sb(a, 2u) * sb(b, 2u) + sb(a, 3u) * sb(b, 3u);
        }
        return acc;
    }
    if (mat.fmt == 1u) {
        // Nibble t of word i is element 8i + t, stored as q + 8.
        for (var i = 0u; i < mat.row_words; i = i + 1u) {
            let a = w[wb + i];
            let b0 = x[xb + 2u * i];
            let b1 = x[xb + 2u * i + 1u];
            for (var t = 0u; t < 4u; t = t + 1u) {
                acc = acc + i32((a >> (4u * t)) & 15u) * sb(b0, t)
                          + i32((a >> (16u + 4u * t)) & 15u) * sb(b1, t);
            }
        }
        return acc - 8 * total;
    }
    // int2: field t of word i is element 16i + t, stored as q + 2.
    for (var i = 0u; i < mat.row_words; i = i + 1u) {
        let a = w[wb + i];
        for (var j = 0u; j < 4u; j = j + 1u) {
            let b = x[xb + 4u * i + j];
            for (var t = 0u; t < 4u; t = t + 1u) {
                acc = acc + i32((a >> (8u * j + 2u * t)) & 3u) * sb(b, t);
            }
        }
    }
    return acc - 2 * total;
}

// A grouped row: exact integer sums per 64-group, each `(sum) as f32 * scale` added into
// lane g % 16 in ascending g, the lanes combined in the CPU's fixed tree.
fn dot_grouped(r: u32, wb: u32, xb: u32, ib: u32) -> f32 {
    var acc: array<f32, 16>;
    let groups = mat.spr;
    for (var g = 0u; g < groups; g = g + 1u) {
        var u: i32 = 0;
        var off: i32 = 4;
        if (mat.fmt == 3u) {
            off = 8;
            // Word i of the group holds elements 64g + 8i .. + 8 (two nibbles a byte).
            let w0 = wb + 8u * g;
            let w1 = min(w0 + 8u, wb + mat.row_words);
            for (var i = w0; i < w1; i = i + 1u) {
                let a = w[i];
                let k = 8u * (i - wb);
                let b0 = x[xb + (k >> 2u)];
                let b1 = x[xb + (k >> 2u) + 1u];
                for (var t = 0u; t < 4u; t = t + 1u) {
                    u = u + i32((a >> (4u * t)) & 15u) * sb(b0, t)
                          + i32((a >> (16u + 4u * t)) & 15u) * sb(b1, t);
                }
            }
        } else {
            let gb = wb + 6u * g;
            for (var e = 0u; e < 64u; e = e + 1u) {
                let lo = (w[gb + (e >> 4u)] >> (2u * (e & 15u))) & 3u;
                let hi = (w[gb + 4u + (e >> 5u)] >> (e & 31u)) & 1u;
                u = u + i32(lo | (hi << 2u)) * xq(xb, 64u * g + e);
            }
        }
        let xg = bitcast<i32>(xinfo[ib + 2u + g]);
        let lane = g & 15u;
        acc[lane] = acc[lane] + rounded(f32(u - off * xg) * scales[r * groups + g]);
    }
    var s8: array<f32, 8>;
    for (var i = 0u; i < 8u; i = i + 1u) { s8[i] = acc[i] + acc[i + 8u]; }
    let s4 = array<f32, 4>(s8[0] + s8[4], s8[1] + s8[5], s8[2] + s8[6], s8[3] + s8[7]);
    return (s4[0] + s4[2]) + (s4[1] + s4[3]);
}

// Positions an invocation of the tiled products takes (`TILE_POSITIONS` in run.rs).
const TP: u32 = 4u;

// int8 or int4 per row against int8 activations at up to TP positions from s0: each weight word
// is read and unpacked once for all of them (batched and prefill products are bound by those
// reads). Integer sums wrap and commute, so each is the untiled one's bit for bit; the float
// end is the same.
fn row_tile(r: u32, s0: u32) {
    if (s0 >= call.n) { return; }
    let m = min(TP, call.n - s0);
    let wb = r * mat.row_words;
    var xb: array<u32, 4>;
    for (var j = 0u; j < m; j = j + 1u) { xb[j] = call.x_off + (s0 + j) * call.x_stride; }
    var acc = array<i32, 4>(0, 0, 0, 0);
    if (mat.fmt == 0u) {
        for (var i = 0u; i < mat.row_words; i = i + 1u) {
            let a = w[wb + i];
            let a0 = sb(a, 0u);
            let a1 = sb(a, 1u);
            let a2 = sb(a, 2u);
            let a3 = sb(a, 3u);
            for (var j = 0u; j < m; j = j + 1u) {
                let b = x[xb[j] + i];
                acc[j] = acc[j] + a0 * sb(b, 0u) + a1 * sb(b, 1u) + a2 * sb(b, 2u) + a3 * sb(b, 3u);
            }
        }
    } else {
        for (var i = 0u; i < mat.row_words; i = i + 1u) {
            let a = w[wb + i];
            var lo: array<i32, 4>;
            var hi: array<i32, 4>;
            for (var t = 0u; t < 4u; t = t + 1u) {
                lo[t] = i32((a >> (4u * t)) & 15u);
                hi[t] = i32((a >> (16u + 4u * t)) & 15u);
            }
            for (var j = 0u; j < m; j = j + 1u) {
                let b0 = x[xb[j] + 2u * i];
                let b1 = x[xb[j] + 2u * i + 1u];
                for (var t = 0u; t < 4u; t = t + 1u) {
                    acc[j] = acc[j] + lo[t] * sb(b0, t) + hi[t] * sb(b1, t);
                }
            }
        }
    }
    for (var j = 0u; j < m; j = j + 1u) {
        let ib = call.info_off + (s0 + j) * call.info_stride;
        let sx = bitcast<f32>(xinfo[ib]);
        var d = acc[j];
        if (mat.fmt == 1u) { d = d - 8 * bitcast<i32>(xinfo[ib + 1u]); }
        y[call.y_off + (s0 + j) * mat.rows + r] = exact_f32(d) * (sx * scales[r]);
    }
}

// Whether `row_tile` takes this product (`tiled` in run.rs says the same for the dispatch).
fn tiled() -> bool { return call.act == 0u && mat.fmt <= 1u && call.n > 1u; }

@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
    let r = gid.x;
    if (r >= mat.rows) { return; }
    if (tiled()) {
        row_tile(r, gid.y * TP);
        return;
    }
    let s = gid.y;
    if (s >= call.n) { return; }
    let wb = r * mat.row_words;
    let xb = call.x_off + s * call.x_stride;
    var out: f32;
    if (call.act == 1u && mat.fmt == 6u) {
        out = dot_mxfp4(r, wb, xb);
    } else if (call.act == 1u) {
        out = dot_f32(r, wb, xb);
    } else {
        let ib = call.info_off + s * call.info_stride;
        let sx = bitcast<f32>(xinfo[ib]);
        if (mat.fmt >= 3u) {
            out = dot_grouped(r, wb, xb, ib) * sx;
        } else {
            let total = bitcast<i32>(xinfo[ib + 1u]);
            out = exact_f32(dot_row(wb, xb, total)) * (sx * scales[r]);
        }
    }
    y[call.y_off + s * mat.rows + r] = out;
}
