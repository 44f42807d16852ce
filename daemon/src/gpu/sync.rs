//! What every use of the device shares: the simulated loss (`COLI_GPU_FAIL_AFTER`), the error
//! scopes around a batch or an upload, and waiting for a read back. The products (`run.rs`),
//! attention's kernels (`calls.rs`) and the uploads (`matvec.rs`) all go through these, so a
//! failure reads the same wherever it happens.

use std::sync::atomic::Ordering;

use super::{Gpu, GpuError};

/// The validation and out-of-memory scopes pushed around one batch or upload. wgpu's `std`
/// feature keeps scopes per thread, so concurrent users of the device do not pop each other's.
pub(super) struct Scopes {
    validation: wgpu::ErrorScopeGuard,
    memory: wgpu::ErrorScopeGuard,
}

impl Scopes {
    pub(super) fn push(dev: &wgpu::Device) -> Scopes {
        let validation = dev.push_error_scope(wgpu::ErrorFilter::Validation);
        let memory = dev.push_error_scope(wgpu::ErrorFilter::OutOfMemory);
        Scopes { validation, memory }
    }

    /// Pops both, innermost first (so neither leaks to the next batch): what went wrong, the
    /// out-of-memory error before the validation one.
    pub(super) fn pop(self) -> Option<String> {
        let oom = pollster::block_on(self.memory.pop());
        let invalid = pollster::block_on(self.validation.pop());
        match (oom, invalid) {
            (Some(e), _) => Some(format!("out of memory: {e}")),
            (None, Some(e)) => Some(format!("validation: {e}")),
            (None, None) => None,
        }
    }
}

impl Gpu {
    /// `COLI_GPU_FAIL_AFTER=N`: the (N+1)th batch, whoever runs it, fails as a lost device
    /// would (for the tests of the fallback).
    pub(super) fn fail_point(&self) -> Result<(), GpuError> {
        let done = self.batches.fetch_add(1, Ordering::Relaxed);
        match self.fail_after {
            Some(n) if done >= n => Err(GpuError::Lost(format!(
                "device lost (simulated after {n} batches, COLI_GPU_FAIL_AFTER)"
            ))),
            _ => Ok(()),
        }
    }

    /// Maps `slice` of a staging buffer for reading and waits until it is: a device that does
    /// not answer is lost.
    pub(super) fn map_read(&self, slice: &wgpu::BufferSlice<'_>) -> Result<(), GpuError> {
        let (tx, rx) = std::sync::mpsc::channel();
        slice.map_async(wgpu::MapMode::Read, move |r| {
            let _ = tx.send(r);
        });
        self.device
            .poll(wgpu::PollType::wait_indefinitely())
            .map_err(|e| GpuError::Lost(e.to_string()))?;
        match rx.recv() {
            Ok(Ok(())) => Ok(()),
            Ok(Err(e)) => Err(GpuError::Lost(format!("read back: {e}"))),
            Err(_) => Err(GpuError::Lost("read back never completed".into())),
        }
    }
}
