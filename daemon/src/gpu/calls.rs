//! How the kernels of `ops.rs` and `attention.rs` run: a call takes the kernels' buffers for
//! itself ([`Kernels::call`]), writes its inputs into them, records its dispatches and reads
//! its outputs back in one submission.
//!
//! The buffers belong to the kernels and only grow, as the products' do (`run.rs`): the
//! `i`-th input or scratch buffer a call asks for is the kernels' slot `i`, the `i`-th
//! dispatch's parameters slot `i` of the uniforms, and the read back goes through one staging
//! buffer, so a steady stream of like calls (a decode's norms and attention cores) creates no
//! buffer. A slot is bound whole and is often longer than a call's data: every kernel reads
//! its lengths from its parameters, never from the binding's size. Scratch buffers are zeroed
//! at the start of their call's submission, as a new buffer was (the indexer's kept-key flags
//! rely on it), so no call sees what an earlier one left.

use std::sync::{Mutex, MutexGuard};

use super::ops::{Kernels, Word, STORAGE};
use super::sync::Scopes;
use super::GpuError;

/// The kernels' grow-only buffers.
#[derive(Default)]
pub(super) struct Pool {
    /// Inputs and scratch, by the order a call asks for them.
    slots: Vec<wgpu::Buffer>,
    /// The dispatches' parameters, by the order a call records them.
    uniforms: Vec<wgpu::Buffer>,
    staging: Option<wgpu::Buffer>,
    /// Times a buffer was made or grown.
    grows: u64,
}

/// Bytes of one dispatch's parameters: every kernel's `P` is at most eight words.
const UNIFORM_BYTES: u64 = 32;

/// Bytes a buffer grows to for `need` bytes: the next power of two, at least 4 KiB, at most
/// what the device binds (and never less than `need`, which `fits` checked).
fn grown(need: u64, max: u64) -> u64 {
    need.max(4096).next_power_of_two().min(max).max(need)
}

/// A buffer to read back after a submission: `len` words from `buf`.
pub(super) struct Readback<'a> {
    pub buf: &'a wgpu::Buffer,
    pub len: usize,
}

/// One call's hold on the kernels' buffers: one call at a time uses them, from its first
/// upload to its read back.
pub(super) struct Call<'k> {
    k: &'k Kernels,
    pool: MutexGuard<'k, Pool>,
    /// Slots handed out so far.
    next: usize,
    /// Scratch slots and their words, zeroed before the dispatches.
    clears: Vec<(wgpu::Buffer, usize)>,
}

/// What a call's recording sees: the encoder and the uniforms' slots.
pub(super) struct Rec<'c> {
    k: &'c Kernels,
    pool: &'c mut Pool,
    enc: &'c mut wgpu::CommandEncoder,
    /// Uniform slots used so far.
    next: usize,
}

impl Kernels {
    /// Takes the kernels' buffers for one call.
    pub(super) fn call(&self) -> Call<'_> {
        Call {
            k: self,
            pool: self.pool.lock().unwrap_or_else(|p| p.into_inner()),
            next: 0,
            clears: Vec::new(),
        }
    }

    /// Times the kernels' buffers were made or grown (a steady stream of like calls makes them
    /// once).
    pub fn buffer_grows(&self) -> u64 {
        self.pool.lock().unwrap_or_else(|p| p.into_inner()).grows
    }

    /// A new storage buffer holding `data`, the caller's to keep (kv_b's rows): not a slot.
    pub(super) fn upload_owned<T: Word>(&self, data: &[T]) -> Result<wgpu::Buffer, GpuError> {
        let buf = self.alloc(data.len())?;
        if !data.is_empty() {
            self.gpu.queue.write_buffer(&buf, 0, &bytes(data));
        }
        Ok(buf)
    }

    /// A new zeroed storage buffer of `words` words, the caller's to keep (a KV mirror's
    /// rows): not a slot.
    pub(super) fn alloc(&self, words: usize) -> Result<wgpu::Buffer, GpuError> {
        self.fits(words)?;
        self.made(|| {
            self.gpu.device.create_buffer(&wgpu::BufferDescriptor {
                label: None,
                size: (words.max(1) * 4) as u64,
                usage: STORAGE,
                mapped_at_creation: false,
            })
        })
    }

    /// Whether a buffer of `words` words fits the device's largest binding: checked before
    /// asking, so work too big for the device says so ([`GpuError::TooBig`]) rather than
    /// failing it.
    pub(super) fn fits(&self, words: usize) -> Result<(), GpuError> {
        let bytes = words as u64 * 4;
        if bytes > self.gpu.max_buffer {
            return Err(GpuError::TooBig {
                bytes,
                max: self.gpu.max_buffer,
            });
        }
        Ok(())
    }

    /// `make`'s buffer, or the device's refusal (out of memory) as an error, not a panic of
    /// wgpu's default handler.
    fn made(&self, make: impl FnOnce() -> wgpu::Buffer) -> Result<wgpu::Buffer, GpuError> {
        let scopes = Scopes::push(&self.gpu.device);
        let buf = make();
        match scopes.pop() {
            Some(why) => Err(GpuError::Device(format!("a buffer: {why}"))),
            None => Ok(buf),
        }
    }

    /// Slot `i` of `slots`, made or grown to hold at least `bytes`.
    fn slot(
        &self,
        pool: &mut Pool,
        which: fn(&mut Pool) -> &mut Vec<wgpu::Buffer>,
        i: usize,
        bytes: u64,
        usage: wgpu::BufferUsages,
    ) -> Result<wgpu::Buffer, GpuError> {
        let have = which(pool).get(i).map(wgpu::Buffer::size);
        if have.is_none_or(|h| h < bytes) {
            let size = grown(bytes, self.gpu.max_buffer);
            let buf = self.made(|| {
                self.gpu.device.create_buffer(&wgpu::BufferDescriptor {
                    label: Some("kernels"),
                    size,
                    usage,
                    mapped_at_creation: false,
                })
            })?;
            pool.grows += 1;
            let slots = which(pool);
            if i < slots.len() {
                slots[i] = buf;
            } else {
                slots.push(buf);
            }
        }
        Ok(which(pool)[i].clone())
    }
}

/// `data`'s words, little-endian.
fn bytes<T: Word>(data: &[T]) -> Vec<u8> {
    data.iter().flat_map(|v| v.word().to_le_bytes()).collect()
}

impl Call<'_> {
    /// The call's next slot, holding `data` (f32 or u32 words).
    pub(super) fn upload<T: Word>(&mut self, data: &[T]) -> Result<wgpu::Buffer, GpuError> {
        let buf = self.take(data.len())?;
        if !data.is_empty() {
            self.k.gpu.queue.write_buffer(&buf, 0, &bytes(data));
        }
        Ok(buf)
    }

    /// The call's next slot, `words` zeroed words (at the start of the submission).
    pub(super) fn scratch(&mut self, words: usize) -> Result<wgpu::Buffer, GpuError> {
        let buf = self.take(words)?;
        self.clears.push((buf.clone(), words));
        Ok(buf)
    }

    fn take(&mut self, words: usize) -> Result<wgpu::Buffer, GpuError> {
        self.k.fits(words)?;
        let i = self.next;
        self.next += 1;
        // A zero-sized binding is invalid: an empty one still gets a word.
        let bytes = (words.max(1) * 4) as u64;
        self.k
            .slot(&mut self.pool, |p| &mut p.slots, i, bytes, STORAGE)
    }

    /// Records the call with `record`, submits it and reads back what `reads` names, as f32
    /// words (u32 results come back as their bits). One batch on the shared device's counter,
    /// so `COLI_GPU_FAIL_AFTER` counts it as it counts the expert tier's.
    pub(super) fn submit(
        mut self,
        record: impl FnOnce(&mut Rec<'_>) -> Result<(), GpuError>,
        reads: &[Readback<'_>],
    ) -> Result<Vec<Vec<f32>>, GpuError> {
        let k = self.k;
        if k.gpu.failed() {
            return Err(GpuError::Lost("the device failed earlier".into()));
        }
        k.gpu.fail_point()?;
        let total: usize = reads.iter().map(|r| r.len).sum();
        let need = (total.max(1) * 4) as u64;
        let staging = match &self.pool.staging {
            Some(s) if s.size() >= need => s.clone(),
            _ => {
                use wgpu::BufferUsages as U;
                let size = grown(need, k.gpu.max_buffer);
                let s = k.made(|| {
                    k.gpu.device.create_buffer(&wgpu::BufferDescriptor {
                        label: Some("read back"),
                        size,
                        usage: U::MAP_READ | U::COPY_DST,
                        mapped_at_creation: false,
                    })
                })?;
                self.pool.grows += 1;
                self.pool.staging = Some(s.clone());
                s
            }
        };
        let dev = &k.gpu.device;
        let scopes = Scopes::push(dev);
        let mut enc = dev.create_command_encoder(&Default::default());
        for (buf, words) in &self.clears {
            enc.clear_buffer(buf, 0, Some((words.max(&1) * 4) as u64));
        }
        let recorded = record(&mut Rec {
            k,
            pool: &mut self.pool,
            enc: &mut enc,
            next: 0,
        });
        if recorded.is_ok() {
            let mut at = 0;
            for r in reads {
                if r.len > 0 {
                    enc.copy_buffer_to_buffer(r.buf, 0, &staging, at, (r.len * 4) as u64);
                }
                at += (r.len * 4) as u64;
            }
        }
        k.gpu.queue.submit([enc.finish()]);
        // The scopes are popped whatever happened, so none leaks to the next batch.
        let caught = scopes.pop();
        recorded?;
        if let Some(why) = caught {
            return Err(GpuError::Lost(why));
        }
        let slice = staging.slice(..need);
        k.gpu.map_read(&slice)?;
        let out = {
            let data = slice
                .get_mapped_range()
                .map_err(|e| GpuError::Lost(format!("read back: {e}")))?;
            let mut words = data
                .chunks_exact(4)
                .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]));
            reads
                .iter()
                .map(|r| words.by_ref().take(r.len).collect())
                .collect()
        };
        staging.unmap();
        Ok(out)
    }
}

impl Rec<'_> {
    /// Records one dispatch of kernel `name` over `groups` workgroups with `params` (u32 words,
    /// f32 ones as their bits) at binding 0 and `bufs` at bindings 1...
    pub(super) fn dispatch(
        &mut self,
        name: &str,
        params: &[u32],
        bufs: &[&wgpu::Buffer],
        groups: [usize; 3],
    ) -> Result<(), GpuError> {
        let k = self.k;
        let pipe = k.pipe(name)?;
        let max = k.gpu.max_workgroups as usize;
        if groups.iter().any(|&g| g > max) {
            return Err(GpuError::Device(format!(
                "{name}: {groups:?} workgroups exceed the device's {max} per dimension"
            )));
        }
        if groups.contains(&0) {
            return Ok(());
        }
        let mut words = params.to_vec();
        words.resize(words.len().next_multiple_of(4).max(4), 0);
        let size = (words.len() * 4) as u64;
        if size > UNIFORM_BYTES {
            return Err(GpuError::Device(format!(
                "{name}: {} parameter words, at most {}",
                params.len(),
                UNIFORM_BYTES / 4
            )));
        }
        use wgpu::BufferUsages as U;
        let i = self.next;
        self.next += 1;
        let uniform = k.slot(
            self.pool,
            |p| &mut p.uniforms,
            i,
            UNIFORM_BYTES,
            U::UNIFORM | U::COPY_DST,
        )?;
        k.gpu.queue.write_buffer(&uniform, 0, &bytes(&words));
        let layout = pipe.get_bind_group_layout(0);
        let param = wgpu::BindingResource::Buffer(wgpu::BufferBinding {
            buffer: &uniform,
            offset: 0,
            size: wgpu::BufferSize::new(size),
        });
        let entries: Vec<wgpu::BindGroupEntry> = std::iter::once(param)
            .chain(bufs.iter().map(|b| b.as_entire_binding()))
            .enumerate()
            .map(|(i, resource)| wgpu::BindGroupEntry {
                binding: i as u32,
                resource,
            })
            .collect();
        let bind = k.gpu.device.create_bind_group(&wgpu::BindGroupDescriptor {
            label: None,
            layout: &layout,
            entries: &entries,
        });
        let mut pass = self.enc.begin_compute_pass(&Default::default());
        pass.set_pipeline(pipe);
        pass.set_bind_group(0, &bind, &[]);
        pass.dispatch_workgroups(groups[0] as u32, groups[1] as u32, groups[2] as u32);
        Ok(())
    }
}

/// The kernels' buffers, locked per call.
pub(super) type PoolLock = Mutex<Pool>;

#[cfg(test)]
#[path = "calls_tests.rs"]
mod tests;
