//! CUDA graph capture as a guard: `capture` begins capturing on a stream, lets the caller
//! enqueue launches, ends the capture and instantiates the graph. Any failure, at any step,
//! comes back as one typed `CaptureError` so the caller can latch that run to eager with a
//! single message; the stream always leaves capture mode, because the guard's `Drop` ends an
//! unfinished capture and discards its partial graph. No error branch repeats that cleanup.

use std::fmt;
use std::sync::Arc;

use cudarc::driver::sys::{CUgraphInstantiate_flags, CUstreamCaptureMode};
use cudarc::driver::{CudaGraph, CudaStream, DriverError};

/// The step of a capture that failed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CaptureStep {
    /// Putting the stream into capture mode.
    Begin,
    /// Enqueueing the captured work (a launch or copy the caller recorded).
    Record,
    /// Ending the capture and instantiating the graph (an invalidated capture fails here).
    Instantiate,
    /// Uploading the instantiated graph to the device.
    Upload,
    /// Launching the instantiated graph.
    Replay,
}

impl fmt::Display for CaptureStep {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            CaptureStep::Begin => "begin capture",
            CaptureStep::Record => "record",
            CaptureStep::Instantiate => "end capture and instantiate",
            CaptureStep::Upload => "upload",
            CaptureStep::Replay => "replay",
        })
    }
}

/// Why a graph could not be captured or replayed.
#[derive(Debug)]
pub struct CaptureError {
    /// The failing step.
    pub step: CaptureStep,
    /// The underlying driver or launch error, as text.
    pub cause: String,
}

impl fmt::Display for CaptureError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "cuda graph {} failed: {}", self.step, self.cause)
    }
}

impl std::error::Error for CaptureError {}

fn driver(step: CaptureStep, e: DriverError) -> CaptureError {
    CaptureError {
        step,
        cause: format!("{e:?}"),
    }
}

/// An instantiated graph bound to the stream it was captured on.
pub struct Graph {
    inner: CudaGraph,
}

impl Graph {
    /// Enqueues one replay of the graph on its stream.
    pub fn replay(&self) -> Result<(), CaptureError> {
        self.inner
            .launch()
            .map_err(|e| driver(CaptureStep::Replay, e))
    }

    /// Uploads the graph's work to the device ahead of its first replay.
    pub fn upload(&self) -> Result<(), CaptureError> {
        self.inner
            .upload()
            .map_err(|e| driver(CaptureStep::Upload, e))
    }
}

/// A stream in capture mode; dropping it unfinished ends the capture and discards the graph.
struct Guard<'s> {
    stream: &'s Arc<CudaStream>,
    active: bool,
}

impl Guard<'_> {
    fn finish(mut self) -> Result<Graph, CaptureError> {
        self.active = false;
        match self.stream.end_capture(CUgraphInstantiate_flags(0)) {
            Ok(Some(inner)) => Ok(Graph { inner }),
            Ok(None) => Err(CaptureError {
                step: CaptureStep::Instantiate,
                cause: "the capture recorded no work".to_string(),
            }),
            Err(e) => Err(driver(CaptureStep::Instantiate, e)),
        }
    }
}

impl Drop for Guard<'_> {
    fn drop(&mut self) {
        if self.active {
            // the partial graph (if any) is destroyed with the returned CudaGraph; the capture
            // already failed, so its own error adds nothing
            drop(self.stream.end_capture(CUgraphInstantiate_flags(0)));
        }
    }
}

/// Captures the work `record` enqueues on `stream` into an instantiated graph. `record` must
/// only enqueue capturable work on `stream` (no host synchronization, no host-to-device copies
/// of pageable memory); everything a replay needs per step must be read from device memory.
pub fn capture<F>(stream: &Arc<CudaStream>, record: F) -> Result<Graph, CaptureError>
where
    F: FnOnce() -> anyhow::Result<()>,
{
    stream
        .begin_capture(CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL)
        .map_err(|e| driver(CaptureStep::Begin, e))?;
    let guard = Guard {
        stream,
        active: true,
    };
    record().map_err(|e| CaptureError {
        step: CaptureStep::Record,
        cause: format!("{e:#}"),
    })?;
    guard.finish()
}
