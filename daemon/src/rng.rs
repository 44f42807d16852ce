//! The crate's two deterministic generators, reproducible from a seed on every platform:
//! [`Rng`] (xorshift64*), which samples tokens and makes the tests' weights and
//! activations, and [`XorShift64`] (the plain 13/7/17 shift), which gives fixed shuffles,
//! probe data and the test inputs that were drawn with it. Nothing here is for secrets.

/// xorshift64*: small, fast, and reproducible from a seed across platforms.
#[derive(Clone, Debug)]
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        // A zero state would stay zero forever.
        Rng(if seed == 0 {
            0x9E37_79B9_7F4A_7C15
        } else {
            seed
        })
    }

    /// Seed from the clock and the pid, for runs without `--seed`.
    pub fn from_entropy() -> Rng {
        let t = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(0);
        Rng::new(t ^ (std::process::id() as u64).rotate_left(32))
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    /// Uniform in [0, 1).
    pub fn next_f64(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }

    /// Uniform in [0, 1) on a grid of 2^-24: the top 24 bits, exact in an f32.
    pub fn unit_f32(&mut self) -> f32 {
        top24(self.next_u64())
    }

    /// `n` bytes of the stream, eight to a draw (little-endian).
    pub fn bytes(&mut self, n: usize) -> Vec<u8> {
        let mut v = Vec::with_capacity(n + 8);
        while v.len() < n {
            v.extend_from_slice(&self.next_u64().to_le_bytes());
        }
        v.truncate(n);
        v
    }
}

/// xorshift64 (shifts 13, 7, 17): the state is the output. The seed must not be zero.
#[derive(Clone, Debug)]
pub struct XorShift64(pub u64);

impl XorShift64 {
    pub fn next_u64(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        self.0 = x;
        x
    }

    /// Uniform in [0, 1) on a grid of 2^-24 (see [`Rng::unit_f32`]).
    pub fn unit_f32(&mut self) -> f32 {
        top24(self.next_u64())
    }
}

/// The top 24 bits of `x` scaled into [0, 1): exact, so callers may rescale by powers of two
/// without changing a bit.
fn top24(x: u64) -> f32 {
    (x >> 40) as f32 / (1u64 << 24) as f32
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The streams are fixed: tests and fixed shuffles drawn with them replay exactly.
    #[test]
    fn the_streams_are_the_published_algorithms() {
        let mut a = Rng::new(1);
        let mut x = 1u64;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        assert_eq!(a.next_u64(), x.wrapping_mul(0x2545_F491_4F6C_DD1D));
        let mut b = XorShift64(1);
        assert_eq!(b.next_u64(), {
            let mut y = 1u64;
            y ^= y << 13;
            y ^= y >> 7;
            y ^= y << 17;
            y
        });
        assert_eq!(
            Rng::new(0).next_u64(),
            Rng::new(0x9E37_79B9_7F4A_7C15).next_u64()
        );
        let u = XorShift64(7).unit_f32();
        assert!((0.0..1.0).contains(&u));
        assert_eq!(Rng::new(3).bytes(13).len(), 13);
    }
}
