//! The device's memory read bandwidth, measured: the ceiling `colibri bench` sets the GPU's share
//! of a token against, as the CPU's figures are set against `membw`'s probe.

use std::time::Instant;

use super::sync::Scopes;
use super::{Gpu, GpuError};

/// Every invocation XORs a strided run of 16-byte words (neighbouring invocations read
/// neighbouring words, so the reads coalesce) and writes its one result, which keeps the reads
/// from being optimised away.
const SHADER: &str = r#"
struct Dims { words: u32, invocations: u32, pad0: u32, pad1: u32 };
@group(0) @binding(0) var<uniform> dims: Dims;
@group(0) @binding(1) var<storage, read> src: array<vec4<u32>>;
@group(0) @binding(2) var<storage, read_write> out: array<u32>;

@compute @workgroup_size(256)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
    let i = gid.x;
    if (i >= dims.invocations) { return; }
    var acc = vec4<u32>(0u);
    for (var k = i; k < dims.words; k = k + dims.invocations) {
        acc = acc ^ src[k];
    }
    out[i] = acc.x ^ acc.y ^ acc.z ^ acc.w;
}
"#;

/// Invocations of one pass: enough to keep any device's memory system busy.
const INVOCATIONS: u32 = 256 * 1024;

impl Gpu {
    /// Read bandwidth in GB/s: the best of `rounds` timed passes over a buffer of `bytes` (capped
    /// by the device's largest buffer), after one untimed pass.
    pub fn read_bandwidth_gbs(&self, bytes: u64, rounds: usize) -> Result<f64, GpuError> {
        let dev = &self.device;
        let bytes = bytes.min(self.max_buffer) / 16 * 16;
        if bytes == 0 {
            return Err(GpuError::Device("no buffer to probe".into()));
        }
        let words = (bytes / 16) as u32;
        let scopes = Scopes::push(dev);
        let module = dev.create_shader_module(wgpu::ShaderModuleDescriptor {
            label: Some("read probe"),
            source: wgpu::ShaderSource::Wgsl(SHADER.into()),
        });
        let pipeline = dev.create_compute_pipeline(&wgpu::ComputePipelineDescriptor {
            label: Some("read probe"),
            layout: None,
            module: &module,
            entry_point: Some("main"),
            compilation_options: Default::default(),
            cache: None,
        });
        let src = dev.create_buffer(&wgpu::BufferDescriptor {
            label: Some("probe source"),
            size: bytes,
            usage: wgpu::BufferUsages::STORAGE,
            mapped_at_creation: false,
        });
        let out = dev.create_buffer(&wgpu::BufferDescriptor {
            label: Some("probe out"),
            size: INVOCATIONS as u64 * 4,
            usage: wgpu::BufferUsages::STORAGE,
            mapped_at_creation: false,
        });
        let dims: Vec<u8> = [words, INVOCATIONS, 0, 0]
            .iter()
            .flat_map(|v| v.to_le_bytes())
            .collect();
        let dims = wgpu::util::DeviceExt::create_buffer_init(
            dev,
            &wgpu::util::BufferInitDescriptor {
                label: Some("probe dims"),
                contents: &dims,
                usage: wgpu::BufferUsages::UNIFORM,
            },
        );
        if let Some(why) = scopes.pop() {
            return Err(GpuError::Device(format!(
                "a {bytes}-byte probe buffer: {why}"
            )));
        }
        let bind = dev.create_bind_group(&wgpu::BindGroupDescriptor {
            label: None,
            layout: &pipeline.get_bind_group_layout(0),
            entries: &[
                wgpu::BindGroupEntry {
                    binding: 0,
                    resource: dims.as_entire_binding(),
                },
                wgpu::BindGroupEntry {
                    binding: 1,
                    resource: src.as_entire_binding(),
                },
                wgpu::BindGroupEntry {
                    binding: 2,
                    resource: out.as_entire_binding(),
                },
            ],
        });
        let mut best = f64::INFINITY;
        for round in 0..=rounds {
            let mut enc = dev.create_command_encoder(&Default::default());
            {
                let mut pass = enc.begin_compute_pass(&Default::default());
                pass.set_pipeline(&pipeline);
                pass.set_bind_group(0, &bind, &[]);
                pass.dispatch_workgroups(INVOCATIONS / 256, 1, 1);
            }
            let t = Instant::now();
            self.queue.submit([enc.finish()]);
            dev.poll(wgpu::PollType::wait_indefinitely())
                .map_err(|e| GpuError::Lost(e.to_string()))?;
            // Round 0 warms the pipeline and the buffer's first touch.
            if round > 0 {
                best = best.min(t.elapsed().as_secs_f64());
            }
        }
        Ok(bytes as f64 / 1e9 / best.max(1e-9))
    }
}
