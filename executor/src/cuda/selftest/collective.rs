//! The all-reduce alone: latency of one two-member all-reduce per vector size and transport
//! (the one-shot push kernel of kernels/collective.cu, and NCCL's all-gather with the tree
//! combine when the members own their devices and NCCL loads), each member on its own stream
//! of the device the caller names (two devices over NVLink, or both on one device). Each member's stream replays
//! a captured graph of `BATCH` back-to-back all-reduces; the time per all-reduce is the
//! median over `TRIALS` replays of the slower member's elapsed time over `BATCH`. Before
//! timing, one all-reduce of random partials is checked bit for bit against the host's sum.

use std::sync::Arc;

use anyhow::{bail, Result};
use memra_gguf::rng::Rng;

use super::super::collective::{rows_blocks, Collective, Exchange, Oneshot, Placement, Reduce};
use super::super::graph::capture;
use super::super::nccl;
use super::super::span::Span;
use super::super::{CudaDevice, CudaStream, DeviceBuffer};
use crate::reduce::Tree;

const BATCH: usize = 100;
const TRIALS: usize = 11;
/// Vector lengths timed: llama-8B's and llama-70B's hidden widths, a larger one, and a
/// 512-row prefill step of llama-8B's hidden rows.
const SIZES: [usize; 4] = [4096, 8192, 65536, 512 * 4096];

/// One member: its device, stream, collective and vectors.
struct Member {
    dev: CudaDevice,
    s: Arc<CudaStream>,
    coll: Collective,
    part: DeviceBuffer<f32>,
    x: DeviceBuffer<f32>,
}

/// Times the all-reduce between members on `devices` (two ordinals, possibly equal) and
/// prints one line per size; returns whether the bit check passed.
pub fn run(devices: &[usize], seed: u64) -> Result<bool> {
    if devices.len() != 2 {
        bail!("the collective benchmark takes two device ordinals (e.g. 0,1 or 0,0)");
    }
    let devs: Vec<CudaDevice> = devices
        .iter()
        .map(|&d| CudaDevice::open(d))
        .collect::<Result<_>>()?;
    if devices[0] != devices[1] {
        for (a, b) in [(0, 1), (1, 0)] {
            if !devs[a].can_access_peer(&devs[b])? {
                bail!(
                    "devices {} and {} have no peer-to-peer access",
                    devices[a],
                    devices[b]
                );
            }
            devs[a].enable_peer_access(&devs[b])?;
        }
    }
    let max = *SIZES.iter().max().expect("invariant: sizes listed");
    let tree = Tree::parse("(r0 r1)", &[0, 1])?;
    let streams: Vec<Arc<CudaStream>> =
        devs.iter().map(|d| d.new_stream()).collect::<Result<_>>()?;
    let mut rng = Rng::new(seed);
    let parts: Vec<Vec<f32>> = (0..2)
        .map(|_| (0..max).map(|_| rng.uniform() * 2.0 - 1.0).collect())
        .collect();
    let own_devices = devices[0] != devices[1];
    let mut transports = vec![(
        "oneshot",
        oneshot(&devs, &streams, &tree, max, own_devices)?,
    )];
    if own_devices && nccl::check_library().is_ok() {
        let joined = nccl::connect(&devs, &streams, &tree, max)?;
        transports.push(("nccl", joined.into_iter().map(Collective::Nccl).collect()));
    }
    let mut ok = true;
    for (name, colls) in transports {
        let members = colls
            .into_iter()
            .zip(&devs)
            .zip(&streams)
            .zip(&parts)
            .map(|(((coll, dev), s), part)| {
                Ok(Member {
                    part: dev.upload(s, part)?,
                    x: dev.alloc(s, max)?,
                    dev: dev.clone(),
                    s: s.clone(),
                    coll,
                })
            })
            .collect::<Result<Vec<_>>>()?;
        let exact = check(&members, max)?;
        ok &= exact;
        println!(
            "all-reduce {name}, 2 members on devices {} and {}: bit check {}",
            devices[0],
            devices[1],
            if exact { "ok" } else { "FAILED" }
        );
        for n in SIZES {
            let us = latency(&members, n)?;
            println!(
                "  {:>6} f32 ({:>4} KiB): {us:7.2} us per all-reduce",
                n,
                n * 4 / 1024
            );
        }
    }
    Ok(ok)
}

fn oneshot(
    devs: &[CudaDevice],
    streams: &[Arc<CudaStream>],
    tree: &Tree,
    max: usize,
    own_devices: bool,
) -> Result<Vec<Collective>> {
    let exchanges = devs
        .iter()
        .zip(streams)
        .map(|(dev, s)| Exchange::new(dev, s, max, 2))
        .collect::<Result<Vec<_>>>()?;
    let all: Vec<u64> = exchanges.iter().map(Exchange::address).collect();
    exchanges
        .into_iter()
        .enumerate()
        .map(|(me, exchange)| {
            let placement = if own_devices {
                Placement::OwnDevices
            } else {
                Placement::Shared {
                    rows_blocks: rows_blocks(devs[me].sm_count(), 2),
                }
            };
            let c = Oneshot::connect(&devs[me], &streams[me], exchange, &all, me, tree, placement)?;
            Ok(Collective::Oneshot(c))
        })
        .collect()
}

fn launch(m: &Member, n: usize) -> Result<()> {
    let part = Span::of(&m.part).sub(0, n);
    let x = Span::of(&m.x).sub(0, n);
    m.coll.run(Reduce::Sum, &part, &x)
}

/// One all-reduce from x = 0: every member must hold part0 + part1, bit for bit.
fn check(members: &[Member], n: usize) -> Result<bool> {
    for m in members {
        m.dev
            .write(&m.s, &vec![0f32; n], &mut Span::of(&m.x).sub(0, n))?;
    }
    for m in members {
        launch(m, n)?;
    }
    let parts: Vec<Vec<f32>> = members
        .iter()
        .map(|m| m.dev.download(&m.s, &m.part))
        .collect::<Result<_>>()?;
    let want: Vec<f32> = (0..n).map(|i| 0.0 + (parts[0][i] + parts[1][i])).collect();
    for m in members {
        let got = m.dev.download(&m.s, &m.x)?;
        if got
            .iter()
            .zip(&want)
            .any(|(a, b)| a.to_bits() != b.to_bits())
        {
            return Ok(false);
        }
    }
    Ok(true)
}

fn latency(members: &[Member], n: usize) -> Result<f64> {
    let graphs = members
        .iter()
        .map(|m| {
            capture(&m.s, || (0..BATCH).try_for_each(|_| launch(m, n)))
                .map_err(|e| anyhow::anyhow!("{e}"))
        })
        .collect::<Result<Vec<_>>>()?;
    let events: Vec<_> = members
        .iter()
        .map(|m| Ok((m.dev.new_event(true)?, m.dev.new_event(true)?)))
        .collect::<Result<_>>()?;
    let mut trials = Vec::new();
    for trial in 0..=TRIALS {
        for ((m, g), (start, _)) in members.iter().zip(&graphs).zip(&events) {
            start.record(&m.s)?;
            g.replay().map_err(|e| anyhow::anyhow!("{e}"))?;
        }
        let mut slowest = 0f64;
        for (m, (start, end)) in members.iter().zip(&events) {
            end.record(&m.s)?;
            end.synchronize()?;
            slowest = slowest.max(f64::from(start.elapsed_ms(end)?));
        }
        // the first replay warms up (graph upload, first touches)
        if trial > 0 {
            trials.push(slowest * 1e3 / BATCH as f64);
        }
    }
    trials.sort_by(f64::total_cmp);
    Ok(trials[TRIALS / 2])
}
