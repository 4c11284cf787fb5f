//! One CUDA device: its (primary) context, the kernels loaded into it, streams, buffers, events
//! and peer access. Opening a device checks that the driver can be loaded, compiles the kernels
//! for its architecture (once per architecture) and loads them (once per device), so every rank
//! on a device shares one module. cudarc's per-buffer event tracking is switched off: the plan
//! orders every cross-stream access with explicit events, and tracking events would break
//! graph capture.

use std::collections::{BTreeMap, HashMap};
use std::ffi::c_void;
use std::marker::PhantomData;
use std::sync::{Arc, Mutex, OnceLock};

use anyhow::{bail, Context, Result};
use cudarc::driver::sys::{
    self, CUdevice_attribute, CUevent_flags, CUfunction_attribute, CUresult,
};
use cudarc::driver::{
    self, CudaContext, CudaEvent, CudaFunction, CudaSlice, CudaStream, DevicePtr, DevicePtrMut,
    DeviceRepr, LaunchConfig, ValidAsZeroBits,
};

use super::compile;

/// A device buffer of `T` (a cudarc slice; views come from `.slice(..)` and `.slice_mut(..)`).
pub type DeviceBuffer<T> = CudaSlice<T>;

/// An opened device with the memra kernels loaded. Cheap to clone; clones share everything.
#[derive(Clone)]
pub struct CudaDevice {
    ctx: Arc<CudaContext>,
    functions: Arc<HashMap<&'static str, CudaFunction>>,
    arch: String,
    name: String,
    /// Kernels launch with programmatic stream serialization (compute capability 9.0 and up):
    /// a kernel's grid may start while the previous kernel on the stream drains, and waits
    /// (griddepcontrol.wait, kernels/common.cuh) before it touches memory that kernel wrote.
    dependent_launch: bool,
    /// Streaming multiprocessors (read once: launch sizes ask for it every launch).
    sm_count: usize,
    /// The dynamic shared-memory limit each kernel was raised to (`allow_dynamic_shared`),
    /// so a launch path raises it once, not per launch.
    raised: Arc<Mutex<HashMap<&'static str, usize>>>,
}

/// Dynamic shared memory a launch may take without raising its kernel's limit
/// (`CudaDevice::allow_dynamic_shared` raises it).
pub(crate) const PLAIN_DYNAMIC_SHARED: usize = 48 << 10;

/// Kernel parameters in signature order, each borrowed until the launch returns.
pub(crate) struct KernelArgs<'a> {
    ptrs: Vec<*mut c_void>,
    borrow: PhantomData<&'a ()>,
}

impl<'a> KernelArgs<'a> {
    /// Appends the next parameter.
    pub fn arg<T: DeviceRepr>(&mut self, value: &'a T) -> &mut Self {
        self.ptrs.push(value as *const T as *mut c_void);
        self
    }
}

/// Fails with a clear message when the CUDA driver library cannot be loaded.
pub fn check_driver() -> Result<()> {
    // SAFETY: only probes whether the shared library can be opened
    if unsafe { driver::sys::is_culib_present() } {
        return Ok(());
    }
    bail!(
        "cuda backend: no cuda driver found (libcuda.so): searched {}; install the nvidia driver or run with --backend cpu",
        compile::candidates("cuda")
    )
}

/// Number of CUDA devices visible to this process.
pub fn device_count() -> Result<usize> {
    check_driver()?;
    let n = CudaContext::device_count().context("cuda backend: counting devices")?;
    Ok(n.max(0) as usize)
}

impl CudaDevice {
    /// Opens device `ordinal`, compiling and loading the kernels on first use; later calls for
    /// the same ordinal return the same device.
    pub fn open(ordinal: usize) -> Result<CudaDevice> {
        static OPEN: OnceLock<Mutex<BTreeMap<usize, CudaDevice>>> = OnceLock::new();
        let mut open = OPEN
            .get_or_init(Default::default)
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        if let Some(dev) = open.get(&ordinal) {
            return Ok(dev.clone());
        }
        let dev = Self::open_uncached(ordinal)?;
        open.insert(ordinal, dev.clone());
        Ok(dev)
    }

    fn open_uncached(ordinal: usize) -> Result<CudaDevice> {
        let count = device_count()?;
        if ordinal >= count {
            bail!("cuda backend: device {ordinal} does not exist; this machine has {count} cuda devices");
        }
        let ctx = CudaContext::new(ordinal)
            .with_context(|| format!("cuda backend: creating a context on device {ordinal}"))?;
        // SAFETY: called before any buffer or stream of this context exists
        unsafe { ctx.disable_event_tracking() };
        let (major, minor) = ctx
            .compute_capability()
            .context("cuda backend: reading the compute capability")?;
        let arch = format!("sm_{major}{minor}");
        let name = ctx.name().unwrap_or_else(|_| "unknown device".to_string());
        let ptx = compile::compiled(&arch)?;
        let mut functions = HashMap::new();
        for (file, ptx) in compile::FILES.iter().zip(ptx.iter()) {
            let module = ctx.load_module(ptx.clone()).with_context(|| {
                format!(
                    "cuda backend: loading kernels/{} on device {ordinal} ({arch})",
                    file.name
                )
            })?;
            for &entry in file.entries {
                let f = module.load_function(entry).with_context(|| {
                    format!(
                        "cuda backend: kernel {entry} is missing from kernels/{}",
                        file.name
                    )
                })?;
                functions.insert(entry, f);
            }
        }
        let sm_count =
            ctx.attribute(CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)
                .context("cuda backend: reading the multiprocessor count")? as usize;
        Ok(CudaDevice {
            ctx,
            functions: Arc::new(functions),
            arch,
            name,
            dependent_launch: major >= 9,
            sm_count,
            raised: Arc::default(),
        })
    }

    /// Whether kernels launch as programmatic dependents of the previous kernel on the stream.
    pub fn dependent_launch(&self) -> bool {
        self.dependent_launch
    }

    /// Launches kernel `name` on `stream` with the parameters `push` lists, in the kernel
    /// signature's order; with `dependent_launch`, as a programmatic dependent of the kernel
    /// before it on the stream (every memra kernel waits for its predecessor before it reads
    /// or writes activations, so this only overlaps one grid's launch with the last one's end).
    ///
    /// # Safety
    /// The pushed values must match the kernel's parameters in order and type, and every device
    /// address among them must stay valid until the stream has run the kernel.
    pub(crate) unsafe fn launch_kernel<'a>(
        &self,
        stream: &CudaStream,
        name: &str,
        cfg: LaunchConfig,
        push: impl FnOnce(&mut KernelArgs<'a>),
    ) -> Result<()> {
        let mut args = KernelArgs {
            ptrs: Vec::new(),
            borrow: PhantomData,
        };
        push(&mut args);
        self.ctx.bind_to_thread()?;
        let mut attr = sys::CUlaunchAttribute {
            id: sys::CUlaunchAttributeID::CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION,
            pad: Default::default(),
            value: sys::CUlaunchAttributeValue { pad: [0; 64] },
        };
        attr.value.programmaticStreamSerializationAllowed = 1;
        let config = sys::CUlaunchConfig {
            gridDimX: cfg.grid_dim.0,
            gridDimY: cfg.grid_dim.1,
            gridDimZ: cfg.grid_dim.2,
            blockDimX: cfg.block_dim.0,
            blockDimY: cfg.block_dim.1,
            blockDimZ: cfg.block_dim.2,
            sharedMemBytes: cfg.shared_mem_bytes,
            hStream: stream.cu_stream(),
            attrs: &mut attr,
            numAttrs: u32::from(self.dependent_launch),
        };
        // SAFETY: the caller vouches for the parameters; `attr` and the pushed values outlive
        // the call, which copies them
        unsafe {
            sys::cuLaunchKernelEx(
                &config,
                self.function(name).cu_function(),
                args.ptrs.as_mut_ptr(),
                std::ptr::null_mut(),
            )
        }
        .result()
        .with_context(|| {
            format!(
                "cuda backend: launching {name} on device {}",
                self.ordinal()
            )
        })
    }

    /// The device ordinal.
    pub fn ordinal(&self) -> usize {
        self.ctx.ordinal()
    }

    /// The device's marketing name, e.g. "NVIDIA H200".
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The architecture the kernels were compiled for, e.g. "sm_90".
    pub fn arch(&self) -> &str {
        &self.arch
    }

    /// The underlying cudarc context.
    pub fn context(&self) -> &Arc<CudaContext> {
        &self.ctx
    }

    /// Number of streaming multiprocessors.
    pub fn sm_count(&self) -> usize {
        self.sm_count
    }

    /// The most shared memory one block may opt in to, in bytes.
    pub fn max_shared_per_block(&self) -> Result<usize> {
        let n = self
            .ctx
            .attribute(CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN)
            .context("cuda backend: reading the shared memory limit")?;
        Ok(n as usize)
    }

    /// Lets kernel `name` (with `static_bytes` of static shared memory) take `bytes` of dynamic
    /// shared memory at launch: the kernel's limit is raised once, to the device's, not to this
    /// launch's need, since a lower limit set by a later launch would make an earlier, larger
    /// one fail. Launches within the default 48 KiB need no call.
    pub fn allow_dynamic_shared(
        &self,
        name: &str,
        static_bytes: usize,
        bytes: usize,
    ) -> Result<()> {
        let (&key, f) = self
            .functions
            .get_key_value(name)
            .unwrap_or_else(|| panic!("invariant: kernel {name} is listed in compile::FILES"));
        let mut raised = self.raised.lock().unwrap_or_else(|e| e.into_inner());
        let limit = match raised.get(key) {
            Some(&limit) => limit,
            None => {
                let limit = self.max_shared_per_block()? - static_bytes;
                f.set_attribute(
                    CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                    i32::try_from(limit).expect("invariant: a device's shared memory fits in i32"),
                )
                .with_context(|| {
                    format!("cuda backend: allowing {name} {limit} bytes of shared memory")
                })?;
                raised.insert(key, limit);
                limit
            }
        };
        if bytes > limit {
            bail!("cuda backend: {name} needs {bytes} bytes of shared memory; this device allows {limit}");
        }
        Ok(())
    }

    /// Free and total device memory in bytes.
    pub fn memory(&self) -> Result<(usize, usize)> {
        self.ctx
            .mem_get_info()
            .context("cuda backend: reading free memory")
    }

    /// A loaded kernel by entry-point name.
    pub(crate) fn function(&self, name: &str) -> &CudaFunction {
        self.functions
            .get(name)
            .unwrap_or_else(|| panic!("invariant: kernel {name} is listed in compile::FILES"))
    }

    /// Registers, local (spill) bytes per thread and static shared bytes of a kernel.
    pub fn kernel_resources(&self, name: &str) -> Result<(i32, i32, i32)> {
        let f = self.function(name);
        let err = || format!("cuda backend: reading the attributes of {name}");
        Ok((
            f.num_regs().with_context(err)?,
            f.local_size_bytes().with_context(err)?,
            f.shared_size_bytes().with_context(err)?,
        ))
    }

    /// A new non-blocking stream (one per rank and purpose).
    pub fn new_stream(&self) -> Result<Arc<CudaStream>> {
        self.ctx
            .new_stream()
            .context("cuda backend: creating a stream")
    }

    /// A zero-filled buffer of `len` values, allocated in `stream`'s order.
    pub fn alloc<T: DeviceRepr + ValidAsZeroBits>(
        &self,
        stream: &Arc<CudaStream>,
        len: usize,
    ) -> Result<DeviceBuffer<T>> {
        stream.alloc_zeros(len).with_context(|| {
            format!(
                "cuda backend: allocating {} bytes on device {}",
                len * size_of::<T>(),
                self.ordinal()
            )
        })
    }

    /// A buffer holding a copy of `data`.
    pub fn upload<T: DeviceRepr>(
        &self,
        stream: &Arc<CudaStream>,
        data: &[T],
    ) -> Result<DeviceBuffer<T>> {
        stream.clone_htod(data).with_context(|| {
            format!(
                "cuda backend: uploading {} bytes to device {}",
                size_of_val(data),
                self.ordinal()
            )
        })
    }

    /// Copies `data` into `dst` (which must be at least as long).
    pub fn write<T: DeviceRepr>(
        &self,
        stream: &Arc<CudaStream>,
        data: &[T],
        dst: &mut impl DevicePtrMut<T>,
    ) -> Result<()> {
        stream
            .memcpy_htod(data, dst)
            .context("cuda backend: host to device copy")
    }

    /// Waits for `stream` and returns a host copy of `src`.
    pub fn download<T: DeviceRepr>(
        &self,
        stream: &Arc<CudaStream>,
        src: &impl DevicePtr<T>,
    ) -> Result<Vec<T>> {
        let v = stream
            .clone_dtoh(src)
            .context("cuda backend: device to host copy")?;
        stream
            .synchronize()
            .context("cuda backend: synchronizing after a device to host copy")?;
        Ok(v)
    }

    /// Device-to-device copy of `src` into `dst` in `stream`'s order (a peer copy when `src`
    /// lives on another device).
    pub fn copy<T>(
        &self,
        stream: &Arc<CudaStream>,
        src: &impl DevicePtr<T>,
        dst: &mut impl DevicePtrMut<T>,
    ) -> Result<()> {
        stream
            .memcpy_dtod(src, dst)
            .context("cuda backend: device to device copy")
    }

    /// Device-to-device copy bandwidth in GB/s, counting bytes read plus written: the median
    /// of 7 timed batches of 4 copies of 1 GiB. Decode speed is compared with it.
    pub fn copy_bandwidth(&self, s: &Arc<CudaStream>) -> Result<f64> {
        const N: usize = 1 << 28;
        let src = self.alloc::<f32>(s, N)?;
        let mut dst = self.alloc::<f32>(s, N)?;
        let (start, end) = (self.new_event(true)?, self.new_event(true)?);
        self.copy(s, &src, &mut dst)?;
        let mut trials = Vec::new();
        for _ in 0..7 {
            start.record(s)?;
            for _ in 0..4 {
                self.copy(s, &src, &mut dst)?;
            }
            end.record(s)?;
            end.synchronize()?;
            trials.push(f64::from(start.elapsed_ms(&end)?) / 1e3 / 4.0);
        }
        trials.sort_by(f64::total_cmp);
        Ok(2.0 * (N * 4) as f64 / trials[3] / 1e9)
    }

    /// A new event; `timing` events can measure elapsed time, the others are cheaper for
    /// ordering only.
    pub fn new_event(&self, timing: bool) -> Result<CudaEvent> {
        let flags = if timing {
            CUevent_flags::CU_EVENT_DEFAULT
        } else {
            CUevent_flags::CU_EVENT_DISABLE_TIMING
        };
        self.ctx
            .new_event(Some(flags))
            .context("cuda backend: creating an event")
    }

    /// Whether this device can read and write `peer`'s memory directly.
    pub fn can_access_peer(&self, peer: &CudaDevice) -> Result<bool> {
        let mut can = 0;
        // SAFETY: both handles come from live contexts; `can` outlives the call
        let r = unsafe {
            driver::sys::cuDeviceCanAccessPeer(&mut can, self.ctx.cu_device(), peer.ctx.cu_device())
        };
        r.result().with_context(|| {
            format!(
                "cuda backend: asking whether device {} can access device {}",
                self.ordinal(),
                peer.ordinal()
            )
        })?;
        Ok(can != 0)
    }

    /// Lets this device's kernels and copies reach `peer`'s memory; enabling twice is fine.
    pub fn enable_peer_access(&self, peer: &CudaDevice) -> Result<()> {
        if !self.can_access_peer(peer)? {
            bail!(
                "cuda backend: device {} cannot access device {} (no p2p between them)",
                self.ordinal(),
                peer.ordinal()
            );
        }
        self.ctx
            .bind_to_thread()
            .context("cuda backend: binding a context")?;
        // SAFETY: this context is current on the thread; the peer context is alive
        let r = unsafe { driver::sys::cuCtxEnablePeerAccess(peer.ctx.cu_ctx(), 0) };
        let what = || {
            format!(
                "cuda backend: enabling peer access from device {} to device {}",
                self.ordinal(),
                peer.ordinal()
            )
        };
        match r {
            CUresult::CUDA_SUCCESS | CUresult::CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED => {}
            e => return Err(driver::DriverError(e)).with_context(what),
        }
        if !peer.ctx.has_async_alloc() {
            return Ok(());
        }
        // buffers come from the peer's stream-ordered memory pool (cuMemAllocAsync), which
        // context peer access does not open: the pool must grant this device access itself
        let mut pool = std::ptr::null_mut();
        // SAFETY: `pool` outlives the call; the peer's device handle is live
        unsafe { sys::cuDeviceGetMemPool(&mut pool, peer.ctx.cu_device()) }
            .result()
            .with_context(what)?;
        let access = sys::CUmemAccessDesc {
            location: sys::CUmemLocation {
                type_: sys::CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE,
                id: self.ordinal() as i32,
            },
            flags: sys::CUmemAccess_flags::CU_MEM_ACCESS_FLAGS_PROT_READWRITE,
        };
        // SAFETY: `pool` is the peer device's live pool; `access` is one valid descriptor
        unsafe { sys::cuMemPoolSetAccess(pool, &access, 1) }
            .result()
            .with_context(what)
    }
}
