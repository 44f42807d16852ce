//! One routed expert as the store hands it out: its three matrices and, for gpt-oss and
//! DeepSeek-V4, the biases and clamped SwiGLU read with them. Dropping one gives its packed
//! bytes back for the next loads ([`recycle`](super::recycle)).

use super::recycle;
use crate::quant::QMatrix;

pub struct Expert {
    pub gate: QMatrix,
    pub up: QMatrix,
    pub down: QMatrix,
    /// gpt-oss: the expert's biases and clamped SwiGLU; `None`: plain SwiGLU, no biases.
    pub oss: Option<Box<OssExpert>>,
}

/// What a gpt-oss expert adds to its matrices: read with them, so an expert from disk brings
/// its biases.
pub struct OssExpert {
    pub gate_bias: Vec<f32>,
    pub up_bias: Vec<f32>,
    pub down_bias: Vec<f32>,
    pub alpha: f32,
    pub limit: f32,
    /// DeepSeek-V4's SwiGLU (`silu(gate.clamp(max = limit)) * up.clamp(-limit, limit)`, no
    /// `alpha`, no `+ 1`) with zero biases: the store's one hook for a clamped activation.
    pub dsv4: bool,
}

impl OssExpert {
    /// DeepSeek-V4's expert activation (see [`OssExpert::dsv4`]'s field): adding the zero
    /// biases leaves every value as it was.
    pub fn dsv4(inter: usize, hidden: usize, limit: f32) -> OssExpert {
        OssExpert {
            gate_bias: vec![0.0; inter],
            up_bias: vec![0.0; inter],
            down_bias: vec![0.0; hidden],
            alpha: 0.0,
            limit,
            dsv4: true,
        }
    }

    /// `g` (gate rows) becomes the clamped SwiGLU of `g + gate_bias` and `u + up_bias`, as
    /// transformers' GptOssExperts: `gate.clamp(max = limit)`, `up.clamp(-limit, limit)`,
    /// `(up + 1) * gate * sigmoid(alpha * gate)`. `g` and `u` hold whole rows of `inter`.
    pub fn glu(&self, g: &mut [f32], u: &[f32]) {
        let inter = self.gate_bias.len();
        for (gr, ur) in g.chunks_exact_mut(inter).zip(u.chunks_exact(inter)) {
            for i in 0..inter {
                let gate = (gr[i] + self.gate_bias[i]).min(self.limit);
                let up = (ur[i] + self.up_bias[i]).clamp(-self.limit, self.limit);
                if self.dsv4 {
                    gr[i] = gate / (1.0 + (-gate).exp()) * up;
                    continue;
                }
                let glu = gate * (1.0 / (1.0 + (-(gate * self.alpha)).exp()));
                gr[i] = (up + 1.0) * glu;
            }
        }
    }

    /// [`OssExpert::glu`] into `out`, the inputs left as they are.
    pub fn glu_into(&self, out: &mut [f32], g: &[f32], u: &[f32]) {
        out.copy_from_slice(&g[..out.len()]);
        self.glu(out, u);
    }

    /// Adds the down projection's bias to each output row of `y` (rows of `hidden`).
    pub fn add_down_bias(&self, y: &mut [f32]) {
        for row in y.chunks_exact_mut(self.down_bias.len()) {
            row.iter_mut()
                .zip(&self.down_bias)
                .for_each(|(v, b)| *v += b);
        }
    }
}

/// A dropped expert's packed bytes go to the next loads ([`recycle`]).
impl Drop for Expert {
    fn drop(&mut self) {
        for m in [&mut self.gate, &mut self.up, &mut self.down] {
            if let Some(b) = m.take_packed() {
                recycle::give(b);
            }
        }
    }
}

impl Expert {
    pub fn resident_bytes(&self) -> usize {
        self.gate.resident_bytes() + self.up.resident_bytes() + self.down.resident_bytes()
    }
}
