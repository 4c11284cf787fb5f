//! The DSA indexer on the device against the CPU backend (`cpu::kernels::dsa`), token by
//! token so that the cache and its pools carry: each token's layer-normed key bit for bit
//! against `layer_norm`, and the cells `dsa_write`, `dsa_score` and `dsa_select` pick exactly
//! against `IndexerCache::select` (pools of 2 to 8, more pools than one padded row of 64,
//! with and without the tail, a row read in place where shared memory cannot hold it), including a case where every pool scores 0 so that the choice
//! among equal scores is ggml's heap order alone. The same tokens then run as a prompt does,
//! in steps of several rows (the keys written, then the pools the step completes, each row
//! scored and selected at its own position): every row's cells and the whole cache bit for
//! bit against the token-by-token run. Then the three launches captured in a graph and
//! replayed against eager position by position, bit for bit.

use anyhow::Result;

use super::exact::report_replay;
use super::{random, Ctx};
use crate::cpu::kernels::{layer_norm, IndexerCache, Selection};
use crate::cuda::device::DeviceBuffer;
use crate::cuda::dsa::{Cells, DsaSlots, IndexerKey, IndexerShape};
use crate::cuda::ops::PAD_SLOT;
use crate::cuda::{capture, CudaDevice, CudaStream, Span};

/// The key norm's epsilon (glm5-next's `indexer.norm_eps` scale).
const NORM_EPS: f32 = 1e-6;

/// One case: the indexer's shape, the selection, the tokens run, and whether every pool
/// scores 0 (positive keys, negative queries).
struct Case {
    shape: IndexerShape,
    top_k: usize,
    select_tail: bool,
    tokens: usize,
    ties: bool,
}

pub(super) fn run(cx: &mut Ctx) -> Result<()> {
    let case = |dim, heads, kpool, capacity, top_k, select_tail, tokens, ties| Case {
        shape: IndexerShape {
            dim,
            heads,
            kpool,
            capacity,
        },
        top_k,
        select_tail,
        tokens,
        ties,
    };
    for c in [
        case(32, 2, 4, 64, 8, true, 40, false),
        case(128, 8, 4, 512, 32, true, 300, false),
        case(64, 4, 2, 128, 6, false, 50, false),
        case(96, 3, 8, 256, 64, true, 100, false),
        case(32, 2, 4, 512, 16, true, 290, true),
        // a context whose score row (60 064 pools) is past any block's shared memory as sort
        // entries: dsa_select runs the heap over the row in place (its first 64 entries over
        // these tokens); the case of ties runs the heap too, the others the parallel sort
        case(32, 2, 2, 120_000, 8, true, 40, false),
    ] {
        tokens(cx, &c)?;
    }
    graph(cx)?;
    Ok(())
}

/// Token rows of a prompt step in the chunked run.
const STEP_ROWS: usize = 7;

/// A layer's fixed indexer weights, its cache and the inputs of a step of `rows` token rows on
/// the device.
struct Layer {
    rows_n: usize,
    /// Sequence slots of the cache, slot after slot.
    sequences: usize,
    norm_w: Vec<f32>,
    norm_b: Vec<f32>,
    ape: Vec<f32>,
    d_norm: (DeviceBuffer<f32>, DeviceBuffer<f32>),
    d_ape: DeviceBuffer<f32>,
    rows: DeviceBuffer<f32>,
    pooled: DeviceBuffer<f32>,
    scores: DeviceBuffer<f32>,
    cells: DeviceBuffer<i32>,
    pos: DeviceBuffer<u32>,
    slots: DeviceBuffer<u32>,
    key: DeviceBuffer<f32>,
    gate: DeviceBuffer<f32>,
    q: DeviceBuffer<f32>,
    w: DeviceBuffer<f32>,
}

/// One token's indexer inputs.
struct Token {
    key: Vec<f32>,
    gate: Vec<f32>,
    q: Vec<f32>,
    w: Vec<f32>,
}

impl Token {
    fn new(cx: &mut Ctx, sh: IndexerShape, ties: bool) -> Token {
        let mut q = random(&mut cx.rng, sh.heads * sh.dim, 1.0);
        if ties {
            q.iter_mut().for_each(|v| *v = -v.abs() - 0.01);
        }
        Token {
            key: random(&mut cx.rng, sh.dim, 2.0),
            gate: random(&mut cx.rng, sh.dim, 2.0),
            q,
            w: random(&mut cx.rng, sh.heads, 1.0),
        }
    }
}

impl Layer {
    fn new(
        cx: &mut Ctx,
        sh: IndexerShape,
        ties: bool,
        (rows_n, sequences): (usize, usize),
    ) -> Result<Layer> {
        let (dev, s) = (cx.dev, cx.s);
        let mut norm_w = random(&mut cx.rng, sh.dim, 1.0);
        let mut norm_b = random(&mut cx.rng, sh.dim, 1.0);
        if ties {
            // keys near 10: every pooled key positive
            norm_w.iter_mut().for_each(|v| *v *= 0.1);
            norm_b.iter_mut().for_each(|v| *v += 10.0);
        }
        let ape = random(&mut cx.rng, sh.kpool * sh.dim, 1.0);
        Ok(Layer {
            rows_n,
            sequences,
            d_norm: (dev.upload(s, &norm_w)?, dev.upload(s, &norm_b)?),
            d_ape: dev.upload(s, &ape)?,
            norm_w,
            norm_b,
            ape,
            rows: dev.alloc(s, sequences * sh.rows_len())?,
            pooled: dev.alloc(s, sequences * sh.pooled_len())?,
            scores: dev.alloc(s, rows_n * sh.scores_len())?,
            cells: dev.alloc(s, rows_n * cells_stride(sh))?,
            pos: dev.alloc(s, rows_n)?,
            slots: dev.alloc(s, rows_n)?,
            key: dev.alloc(s, rows_n * sh.dim)?,
            gate: dev.alloc(s, rows_n * sh.dim)?,
            q: dev.alloc(s, rows_n * sh.heads * sh.dim)?,
            w: dev.alloc(s, rows_n * sh.heads)?,
        })
    }

    /// A layer with `one`'s weights, a fresh cache of `sequences` slots and the inputs of
    /// steps of `rows_n` rows.
    fn like(
        cx: &mut Ctx,
        c: &Case,
        one: &Layer,
        (rows_n, sequences): (usize, usize),
    ) -> Result<Layer> {
        let (dev, s) = (cx.dev, cx.s);
        let mut l = Layer::new(cx, c.shape, c.ties, (rows_n, sequences))?;
        dev.write(s, &one.norm_w, &mut l.d_norm.0)?;
        dev.write(s, &one.norm_b, &mut l.d_norm.1)?;
        dev.write(s, &one.ape, &mut l.d_ape)?;
        Ok(l)
    }

    /// The tokens `ts` as one step from position `first` (at most `rows_n` of them).
    fn feed(
        &mut self,
        dev: &CudaDevice,
        s: &std::sync::Arc<CudaStream>,
        first: usize,
        ts: &[Token],
    ) -> Result<()> {
        let pos: Vec<u32> = (first..first + ts.len()).map(|p| p as u32).collect();
        let ts: Vec<&Token> = ts.iter().collect();
        self.feed_rows(dev, s, (&pos, &vec![0; ts.len()]), &ts)
    }

    /// The tokens `ts` as one step's rows, row `r` at `pos[r]` in slot `slots[r]`.
    fn feed_rows(
        &mut self,
        dev: &CudaDevice,
        s: &std::sync::Arc<CudaStream>,
        (pos, slots): (&[u32], &[u32]),
        ts: &[&Token],
    ) -> Result<()> {
        assert!(ts.len() <= self.rows_n && pos.len() == ts.len() && slots.len() == ts.len());
        let cat =
            |f: fn(&Token) -> &Vec<f32>| ts.iter().flat_map(|&t| f(t)).copied().collect::<Vec<_>>();
        dev.write(s, pos, &mut self.pos)?;
        dev.write(s, slots, &mut self.slots)?;
        dev.write(s, &cat(|t| &t.key), &mut self.key)?;
        dev.write(s, &cat(|t| &t.gate), &mut self.gate)?;
        dev.write(s, &cat(|t| &t.q), &mut self.q)?;
        dev.write(s, &cat(|t| &t.w), &mut self.w)
    }

    /// The launches of a step of `n` token rows, as a DSA layer makes them (a batched step's,
    /// each row in its slot, where `slotted`).
    fn enqueue(
        &self,
        dev: &CudaDevice,
        s: &CudaStream,
        c: &Case,
        n: usize,
        slotted: bool,
    ) -> Result<()> {
        let sh = c.shape;
        let key = IndexerKey {
            key: Span::of(&self.key).sub(0, n * sh.dim),
            norm: (Span::of(&self.d_norm.0), Span::of(&self.d_norm.1), NORM_EPS),
            gate: Span::of(&self.gate).sub(0, n * sh.dim),
            ape: Span::of(&self.d_ape),
        };
        let (rows, pooled, pos) = (
            Span::of(&self.rows),
            Span::of(&self.pooled),
            Span::of(&self.pos).sub(0, n),
        );
        let slot_span = Span::of(&self.slots).sub(0, n);
        let slots = DsaSlots {
            slots: &slot_span,
            sequences: self.sequences,
        };
        let at = (&pos, slotted.then_some(&slots));
        dev.dsa_write(s, &key, (&rows, &pooled), at, sh)?;
        let scale = w_scale(sh);
        let scores = Span::of(&self.scores);
        dev.dsa_score(
            s,
            &Span::of(&self.q).sub(0, n * sh.heads * sh.dim),
            &Span::of(&self.w).sub(0, n * sh.heads),
            scale,
            &pooled,
            at,
            sh,
            &scores,
        )?;
        let cells = Cells {
            span: Span::of(&self.cells),
            stride: cells_stride(sh),
        };
        dev.dsa_select(s, &scores, &pos, sh, (c.top_k, c.select_tail), &cells)
    }
}

/// Values of a row of cells: the count, then up to every position.
fn cells_stride(sh: IndexerShape) -> usize {
    sh.capacity + 1
}

/// The CPU's scale of the head weights.
fn w_scale(sh: IndexerShape) -> f32 {
    1.0 / ((sh.dim * sh.heads) as f32).sqrt()
}

/// The device's cells: the count, then the positions.
fn cells_of(v: &[i32]) -> Vec<usize> {
    let n = usize::try_from(v[0]).unwrap_or(0).min(v.len() - 1);
    v[1..=n].iter().map(|&p| p as usize).collect()
}

fn tokens(cx: &mut Ctx, c: &Case) -> Result<()> {
    let (dev, s) = (cx.dev, cx.s);
    let sh = c.shape;
    let mut l = Layer::new(cx, sh, c.ties, (1, 1))?;
    let mut cache = IndexerCache::new(sh.dim, sh.kpool, sh.capacity);
    let how = Selection {
        top_k: c.top_k,
        select_tail: c.select_tail,
    };
    let (mut key_bits, mut wrong, mut first_wrong) = (0, 0, String::new());
    let mut want_cells = Vec::new();
    let toks: Vec<Token> = (0..c.tokens).map(|_| Token::new(cx, sh, c.ties)).collect();
    let mut cells_by_pos = Vec::new();
    for (pos, t) in toks.iter().enumerate() {
        let mut key = vec![0f32; sh.dim];
        layer_norm(&t.key, &l.norm_w, &l.norm_b, NORM_EPS, &mut key);
        cache.write(pos, &key, &t.gate, &l.ape);
        let w: Vec<f32> = t.w.iter().map(|&v| v * w_scale(sh)).collect();
        cache.select(&t.q, &w, pos, &how, &mut want_cells);
        l.feed(dev, s, pos, std::slice::from_ref(t))?;
        l.enqueue(dev, s, c, 1, false)?;
        let rows = dev.download(s, &l.rows)?;
        let at = 2 * sh.dim * pos;
        key_bits += super::bit_mismatches(&rows[at..at + sh.dim], &key);
        let got = cells_of(&dev.download(s, &l.cells)?);
        cells_by_pos.push(got.clone());
        if got != want_cells {
            wrong += 1;
            if first_wrong.is_empty() {
                first_wrong = format!("; first at position {pos}: {got:?} vs cpu {want_cells:?}");
            }
        }
    }
    let name = format!(
        "{}h x {}, pools of {}, top {}{}{}, {} tokens",
        sh.heads,
        sh.dim,
        sh.kpool,
        c.top_k,
        if c.select_tail { " + tail" } else { "" },
        if c.ties { ", every pool scoring 0" } else { "" },
        c.tokens
    );
    cx.report.exact("dsa key norm", name.clone(), key_bits);
    cx.report
        .exact("dsa cells", format!("{name}{first_wrong}"), wrong);
    steps(cx, c, &l, &toks, &cells_by_pos, &name)
}

/// The tokens `toks` again in steps of `STEP_ROWS` rows on a fresh cache with `one`'s weights:
/// each row's cells against the token-by-token run's `cells_by_pos`, and the cache after the
/// last step against `one`'s, bit for bit.
fn steps(
    cx: &mut Ctx,
    c: &Case,
    one: &Layer,
    toks: &[Token],
    cells_by_pos: &[Vec<usize>],
    name: &str,
) -> Result<()> {
    let (dev, s) = (cx.dev, cx.s);
    let sh = c.shape;
    let mut l = Layer::like(cx, c, one, (STEP_ROWS, 1))?;
    let stride = cells_stride(sh);
    let mut wrong = 0;
    for (k, step) in toks.chunks(STEP_ROWS).enumerate() {
        let first = k * STEP_ROWS;
        l.feed(dev, s, first, step)?;
        l.enqueue(dev, s, c, step.len(), false)?;
        let cells = dev.download(s, &l.cells)?;
        for r in 0..step.len() {
            let got = cells_of(&cells[r * stride..(r + 1) * stride]);
            wrong += usize::from(got != cells_by_pos[first + r]);
        }
    }
    let cache = |l: &Layer| -> Result<Vec<f32>> {
        let mut v = dev.download(s, &l.rows)?;
        v.extend(dev.download(s, &l.pooled)?);
        Ok(v)
    };
    let (want, got) = (cache(one)?, cache(&l)?);
    let what = format!("{name}, steps of {STEP_ROWS} rows");
    cx.report.exact(
        "dsa rows",
        format!("{what}: cache"),
        super::bit_mismatches(&got, &want),
    );
    cx.report
        .exact("dsa rows", format!("{what}: cells a row"), wrong);
    slotted_steps(cx, c, one, toks, cells_by_pos, name)
}

/// How `slotted_steps` lays a run's tokens out in batched steps over two sequence slots.
#[derive(Clone, Copy, Debug)]
enum Layout {
    /// Steps of `STEP_ROWS` rows in slot 1, each behind a pad row; slot 0 holds another
    /// sequence's cache.
    Chunks,
    /// A step a token, the token in slot 1 and again in slot 0 (two live sequences).
    Pairs,
    /// A step a token, one row in slot 1 (the launch that pools as it writes); slot 0 holds
    /// another sequence's cache.
    Single,
}

/// The tokens `toks` again as batched steps over sequence slots laid out by each `Layout`,
/// with `one`'s weights: each real row's cells against the token-by-token run's
/// `cells_by_pos`, and each slot's cache after the last step against `one`'s (or, for a slot
/// of another sequence, as it was), bit for bit.
fn slotted_steps(
    cx: &mut Ctx,
    c: &Case,
    one: &Layer,
    toks: &[Token],
    cells_by_pos: &[Vec<usize>],
    name: &str,
) -> Result<()> {
    let (dev, s) = (cx.dev, cx.s);
    let sh = c.shape;
    let stride = cells_stride(sh);
    let want_one = (dev.download(s, &one.rows)?, dev.download(s, &one.pooled)?);
    let pad = Token::new(cx, sh, c.ties);
    for layout in [Layout::Chunks, Layout::Pairs, Layout::Single] {
        let mut l = Layer::like(cx, c, one, (STEP_ROWS + 1, 2))?;
        // slot 0: another sequence's cache, or (two live sequences) a fresh one
        let other = match layout {
            Layout::Pairs => want_one.clone(),
            _ => (
                random(&mut cx.rng, sh.rows_len(), 1.0),
                random(&mut cx.rng, sh.pooled_len(), 1.0),
            ),
        };
        let fresh = match layout {
            Layout::Pairs => (vec![0f32; sh.rows_len()], vec![0f32; sh.pooled_len()]),
            _ => other.clone(),
        };
        let zero = (vec![0f32; sh.rows_len()], vec![0f32; sh.pooled_len()]);
        dev.write(s, &[&fresh.0[..], &zero.0[..]].concat(), &mut l.rows)?;
        dev.write(s, &[&fresh.1[..], &zero.1[..]].concat(), &mut l.pooled)?;
        // each step's rows: (token index or a pad row, position, slot)
        let steps: Vec<Vec<(Option<usize>, u32, u32)>> = match layout {
            Layout::Chunks => (0..toks.len())
                .collect::<Vec<_>>()
                .chunks(STEP_ROWS)
                .map(|step| {
                    std::iter::once((None, 0, PAD_SLOT))
                        .chain(step.iter().map(|&t| (Some(t), t as u32, 1)))
                        .collect()
                })
                .collect(),
            Layout::Pairs => (0..toks.len())
                .map(|t| vec![(Some(t), t as u32, 1), (Some(t), t as u32, 0)])
                .collect(),
            Layout::Single => (0..toks.len())
                .map(|t| vec![(Some(t), t as u32, 1)])
                .collect(),
        };
        let mut wrong = 0;
        for step in &steps {
            let rows: Vec<&Token> = step
                .iter()
                .map(|&(t, _, _)| t.map_or(&pad, |t| &toks[t]))
                .collect();
            let pos: Vec<u32> = step.iter().map(|&(_, p, _)| p).collect();
            let slots: Vec<u32> = step.iter().map(|&(_, _, slot)| slot).collect();
            l.feed_rows(dev, s, (&pos, &slots), &rows)?;
            l.enqueue(dev, s, c, rows.len(), true)?;
            let cells = dev.download(s, &l.cells)?;
            for (r, &(t, _, _)) in step.iter().enumerate() {
                if let Some(t) = t {
                    let got = cells_of(&cells[r * stride..(r + 1) * stride]);
                    wrong += usize::from(got != cells_by_pos[t]);
                }
            }
        }
        let mut want = other.0.clone();
        want.extend(&want_one.0);
        want.extend(&other.1);
        want.extend(&want_one.1);
        let mut got = dev.download(s, &l.rows)?;
        got.extend(dev.download(s, &l.pooled)?);
        let what = format!("{name}, batched steps over 2 slots ({layout:?})");
        cx.report.exact(
            "dsa slots",
            format!("{what}: caches"),
            super::bit_mismatches(&got, &want),
        );
        cx.report
            .exact("dsa slots", format!("{what}: cells a row"), wrong);
    }
    Ok(())
}

fn graph(cx: &mut Ctx) -> Result<()> {
    let (dev, s) = (cx.dev, cx.s);
    let c = Case {
        shape: IndexerShape {
            dim: 64,
            heads: 4,
            kpool: 4,
            capacity: 128,
        },
        top_k: 16,
        select_tail: true,
        tokens: 40,
        ties: false,
    };
    let toks: Vec<Token> = (0..c.tokens)
        .map(|_| Token::new(cx, c.shape, false))
        .collect();
    let mut eager_run = Layer::new(cx, c.shape, false, (1, 1))?;
    let mut replay_run = Layer::new(cx, c.shape, false, (1, 1))?;
    dev.write(s, &eager_run.norm_w, &mut replay_run.d_norm.0)?;
    dev.write(s, &eager_run.norm_b, &mut replay_run.d_norm.1)?;
    dev.write(s, &eager_run.ape, &mut replay_run.d_ape)?;
    let mut eager = Vec::new();
    for (pos, t) in toks.iter().enumerate() {
        eager_run.feed(dev, s, pos, std::slice::from_ref(t))?;
        eager_run.enqueue(dev, s, &c, 1, false)?;
        eager.extend(dev.download(s, &eager_run.cells)?.iter().map(|&v| v as f32));
    }
    s.synchronize()?;
    let captured = capture(s, || replay_run.enqueue(dev, s, &c, 1, false));
    report_replay(
        cx,
        "dsa graph",
        format!("replay == eager, cells of {} positions", c.tokens),
        captured,
        &eager,
        |g| {
            let mut replayed = Vec::new();
            for (pos, t) in toks.iter().enumerate() {
                replay_run.feed(dev, s, pos, std::slice::from_ref(t))?;
                g.replay()?;
                replayed.extend(
                    dev.download(s, &replay_run.cells)?
                        .iter()
                        .map(|&v| v as f32),
                );
            }
            Ok(replayed)
        },
    )
}
