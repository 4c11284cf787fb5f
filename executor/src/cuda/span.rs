//! `Span`: a typed window onto device memory that a rank owns, by address. The engine keeps
//! every buffer in one owner (its rank) and hands kernels spans, so that an op may read and
//! write the same buffer (in-place norms and adds) and a copy may name another rank's slot
//! buffer, which borrows of the owning `CudaSlice`s cannot express. A span never frees; the
//! engine drops its graphs and synchronizes its streams before the owners go.

use std::marker::PhantomData;
use std::sync::Arc;

use cudarc::driver::sys::CUdeviceptr;
use cudarc::driver::{CudaSlice, CudaStream, DevicePtr, DevicePtrMut, DeviceSlice, SyncOnDrop};

/// `len` values of `T` at device address `ptr`, on the context of `stream`.
pub struct Span<T> {
    ptr: CUdeviceptr,
    len: usize,
    stream: Arc<CudaStream>,
    _t: PhantomData<T>,
}

impl<T> Clone for Span<T> {
    fn clone(&self) -> Self {
        Span {
            ptr: self.ptr,
            len: self.len,
            stream: self.stream.clone(),
            _t: PhantomData,
        }
    }
}

impl<T> Span<T> {
    /// The whole of `buf`.
    pub fn of(buf: &CudaSlice<T>) -> Span<T> {
        let stream = buf.stream().clone();
        // event tracking is off for memra contexts, so taking the address records nothing
        let ptr = buf.device_ptr(&stream).0;
        Span {
            ptr,
            len: buf.len(),
            stream,
            _t: PhantomData,
        }
    }

    /// Values `start..start + len` of this span.
    pub fn sub(&self, start: usize, len: usize) -> Span<T> {
        assert!(
            start + len <= self.len,
            "invariant: span {start}+{len} inside {}",
            self.len
        );
        Span {
            ptr: self.ptr + (start * size_of::<T>()) as u64,
            len,
            stream: self.stream.clone(),
            _t: PhantomData,
        }
    }

    /// The same bytes seen as bytes.
    pub fn cast(&self) -> Span<u8> {
        Span {
            ptr: self.ptr,
            len: self.bytes(),
            stream: self.stream.clone(),
            _t: PhantomData,
        }
    }

    /// The device address.
    pub fn addr(&self) -> CUdeviceptr {
        self.ptr
    }

    /// Bytes covered.
    pub fn bytes(&self) -> usize {
        self.len * size_of::<T>()
    }
}

impl<T> DeviceSlice<T> for Span<T> {
    fn len(&self) -> usize {
        self.len
    }
    fn stream(&self) -> &Arc<CudaStream> {
        &self.stream
    }
}

impl<T> DevicePtr<T> for Span<T> {
    fn device_ptr<'a>(&'a self, _stream: &'a CudaStream) -> (CUdeviceptr, SyncOnDrop<'a>) {
        (self.ptr, SyncOnDrop::Record(None))
    }
}

impl<T> DevicePtrMut<T> for Span<T> {
    fn device_ptr_mut<'a>(&'a mut self, _stream: &'a CudaStream) -> (CUdeviceptr, SyncOnDrop<'a>) {
        (self.ptr, SyncOnDrop::Record(None))
    }
}
