//! A rank's construction (`RankDevice::new`): its layers' shards taken from the plan's weights
//! and uploaded to its device, its caches, states and buffers allocated for steps of up to
//! `max_rows` token rows.

use anyhow::{anyhow, bail};

use super::*;
use crate::cuda::weights::{upload_matrix, LayerLoad};

impl RankDevice {
    /// Uploads rank `rank`'s shards to `dev` and allocates its buffers for steps of up to
    /// `max_rows` token rows; the allocation stream is the rank's first stream; a sampling
    /// rank picks tokens as `sampler` says.
    pub fn new(
        plan: &Plan,
        rank: u32,
        dev: CudaDevice,
        mut w: RankWeights,
        sampler: SamplerConfig,
        max_rows: usize,
    ) -> Result<RankDevice> {
        let r = plan.rank(rank).expect("invariant: a rank of the plan");
        let m = &plan.model;
        let mut streams = BTreeMap::new();
        for name in &r.streams {
            streams.insert(name.clone(), dev.new_stream()?);
        }
        let s = streams
            .values()
            .next()
            .cloned()
            .ok_or_else(|| anyhow!("rank {rank} has no stream"))?;
        let hd = m.head_dim as usize;
        let vec = |w: &mut RankWeights, name: &str| -> Result<DeviceBuffer<f32>> {
            dev.upload(&s, &w.take_vector(name)?)
        };
        let mat = |w: &mut RankWeights, name: &str| -> Result<DeviceWeight> {
            device_matrix(&dev, &s, w, name)
        };
        let mut layers = Vec::new();
        for l in r.layers.start..r.layers.end {
            let n = |x: &str| format!("blk.{l}.{x}");
            let attn_norm = vec(&mut w, &n("attn_norm.weight"))?;
            let (mixer, o) = match m.layer_kind(l).mixer {
                Mixer::Kda => {
                    let (k, o) = KdaWeights::take(&mut LayerLoad {
                        plan,
                        l,
                        w: &mut w,
                        dev: &dev,
                        s: &s,
                    })?;
                    (MixerWeights::Kda(Box::new(k)), o)
                }
                Mixer::Mla | Mixer::Dsa | Mixer::DsaShared => (
                    MixerWeights::Mla(Box::new(MlaWeights::take(&mut LayerLoad {
                        plan,
                        l,
                        w: &mut w,
                        dev: &dev,
                        s: &s,
                    })?)),
                    mat(&mut w, &n("attn_output.weight"))?,
                ),
                Mixer::Gqa => (
                    MixerWeights::Gqa(Box::new(GqaWeights {
                        q: mat(&mut w, &n("attn_q.weight"))?,
                        k: mat(&mut w, &n("attn_k.weight"))?,
                        v: mat(&mut w, &n("attn_v.weight"))?,
                        biases: if m.qkv_bias {
                            Some([
                                vec(&mut w, &n("attn_q.bias"))?,
                                vec(&mut w, &n("attn_k.bias"))?,
                                vec(&mut w, &n("attn_v.bias"))?,
                            ])
                        } else {
                            None
                        },
                        qk_norm: if m.qk_norm {
                            Some([
                                vec(&mut w, &n("attn_q_norm.weight"))?,
                                vec(&mut w, &n("attn_k_norm.weight"))?,
                            ])
                        } else {
                            None
                        },
                    })),
                    mat(&mut w, &n("attn_output.weight"))?,
                ),
            };
            layers.push(LayerWeights {
                attn_norm,
                mixer,
                o,
                ffn_norm: vec(&mut w, &n("ffn_norm.weight"))?,
                ffn: FfnWeights::take(&mut LayerLoad {
                    plan,
                    l,
                    w: &mut w,
                    dev: &dev,
                    s: &s,
                })?,
                hc: match m.mhc {
                    Some(_) => Some(HcWeights::take(l, &mut w, &dev, &s)?),
                    None => None,
                },
            });
        }
        let table = if r.embed || (r.head && m.tied_embeddings) {
            Some(w.take_matrix("token_embd.weight")?)
        } else {
            None
        };
        let mut head = None;
        let mut embed = None;
        if r.head {
            let norm = vec(&mut w, "output_norm.weight")?;
            let rows = if m.tied_embeddings {
                let table = table.as_ref().expect("invariant: taken above");
                let per = (m.vocab / r.tp_degree) as usize;
                // a rank that also embeds holds the whole table; a head-only rank of a
                // tensor-parallel group holds just its vocab rows
                let start = if table.rows == per {
                    0
                } else {
                    r.tp_index as usize * per
                };
                if r.embed && per == table.rows {
                    HeadRows::Embedding
                } else {
                    let bytes = table.rows_bytes(start, start + per);
                    HeadRows::Own(DeviceWeight::upload(
                        &dev,
                        &s,
                        table.dtype,
                        bytes,
                        per,
                        table.cols,
                    )?)
                }
            } else {
                HeadRows::Own(mat(&mut w, "output.weight")?)
            };
            head = Some((norm, rows));
        }
        if r.embed {
            let t = table.expect("invariant: taken above");
            embed = Some(upload_matrix(&dev, &s, t)?);
        }
        let left = w.remaining();
        if !left.is_empty() {
            bail!(
                "rank {rank} holds shards it never uses: {}",
                left.join(", ")
            );
        }
        if plan.runtime.kv_dtype != "f16" {
            bail!(
                "runtime.kv_dtype `{}` is not supported by the cuda backend; supported: f16",
                plan.runtime.kv_dtype
            );
        }
        let ctx = plan.runtime.max_context as usize;
        let sequences = plan.runtime.max_sequences.max(1) as usize;
        let mut kv = Vec::new();
        let (mut nq, mut nk, mut n_att) = (1, 1, 1);
        for lw in &layers {
            n_att = n_att.max(lw.o.cols);
            let MixerWeights::Gqa(g) = &lw.mixer else {
                kv.push(None);
                continue;
            };
            if g.q.rows % hd != 0 || g.k.rows % hd != 0 {
                bail!("q/k shards are not whole heads of {hd} values");
            }
            (nq, nk) = (nq.max(g.q.rows), nk.max(g.k.rows));
            kv.push(Some(DeviceKv::new(
                &dev,
                &s,
                g.k.rows / hd,
                hd,
                ctx,
                sequences,
            )?));
        }
        let geo = RankGeometry::of(plan, rank);
        let mla_layers: Vec<Option<&MlaWeights>> = layers
            .iter()
            .map(|l| match &l.mixer {
                MixerWeights::Mla(m) => Some(&**m),
                _ => None,
            })
            .collect();
        // the MLA, KDA and MoE buffers of steps over several token rows: a batched plan's
        // steps take them for every row count, even where its prompt chunk is one row
        let wide_rows = if sequences > 1 {
            max_rows.max(2)
        } else {
            max_rows
        };
        let mla = MlaState::new(&dev, &s, plan, &geo, &mla_layers, wide_rows)?;
        let indexed: Vec<bool> = mla_layers
            .iter()
            .map(|m| m.is_some_and(|m| m.indexer.is_some()))
            .collect();
        // a selection is held where a layer attends over one or a boundary carries one
        let sparse = (r.layers.start..r.layers.end).any(|l| m.layer_kind(l).mixer.is_sparse())
            || plan
                .boundaries
                .iter()
                .any(|b| b.selection > 0 && (b.from_rank == rank || b.to_rank == rank));
        let dsa = DsaState::new(
            &dev,
            &s,
            plan,
            (m.embedding as usize, max_rows),
            &indexed,
            sparse,
        )?;
        for (l, m) in mla_layers.iter().enumerate() {
            if let Some(m) = m {
                if m.att_len() != layers[l].o.cols {
                    bail!(
                        "attn_output reads {} values, the MLA heads give {}",
                        layers[l].o.cols,
                        m.att_len()
                    );
                }
            }
        }
        let d = m.embedding as usize;
        let kda_layers: Vec<Option<&KdaWeights>> = layers
            .iter()
            .map(|l| match &l.mixer {
                MixerWeights::Kda(k) => Some(&**k),
                _ => None,
            })
            .collect();
        // attn_output's columns were checked against the heads with the rest of the layer
        // a speculative plan's verify spans keep the state after each row but the last
        let keeps = plan.speculative.map_or(0, |sp| sp.tokens as usize + 1);
        let kda = KdaState::new(
            &dev,
            &s,
            (d, geo.eps),
            &kda_layers,
            (wide_rows, sequences, keeps),
        )?;
        let hc = HcState::new(&dev, &s, plan, d, max_rows, geo.eps)?;
        let logits_len = match &head {
            Some((_, HeadRows::Own(h))) => h.rows,
            Some((_, HeadRows::Embedding)) => m.vocab as usize,
            None => 1,
        };
        let group = r
            .group
            .and_then(|g| plan.groups.iter().find(|x| x.group == g));
        let group_len = group.map_or(1, |g| g.ranks.len());
        let gate_rows = layers
            .iter()
            .map(|l| l.ffn.gate_rows())
            .max()
            .unwrap_or(1)
            .max(1);
        let n = max_rows;
        let buf = Buffers {
            x: dev.alloc(&s, n * d)?,
            xn: dev.alloc(&s, n * d)?,
            q: dev.alloc(&s, n * nq)?,
            k: dev.alloc(&s, n * nk)?,
            v: dev.alloc(&s, n * nk)?,
            att: dev.alloc(&s, n * n_att)?,
            partial: dev.alloc(&s, n * d)?,
            gate: dev.alloc(&s, n * gate_rows)?,
            attn_parts: dev.alloc(
                &s,
                attention_parts_len(n.min(ATTN_SPLIT_ROWS), (nq / hd).max(1), hd, ctx),
            )?,
            logits: dev.alloc(&s, n * logits_len)?,
            full_logits: if r.head && group_len > 1 && r.tp_index == 0 {
                Some(dev.alloc(&s, n * logits_len * group_len)?)
            } else {
                None
            },
            pos: dev.alloc(&s, n)?,
            slots: dev.alloc(&s, n)?,
            token: dev.alloc(&s, n)?,
            step: dev.alloc(&s, 1)?,
            rows: if n > 1 {
                let widest = layers
                    .iter()
                    .flat_map(|l| [l.o.cols, l.o.rows, gate_rows])
                    .chain([d])
                    .max()
                    .unwrap_or(d);
                Some(super::super::prefill::RowBuffers::new(
                    &dev, &s, n, widest, gate_rows, d,
                )?)
            } else {
                None
            },
        };
        let (mut tx, mut rx) = (BTreeMap::new(), BTreeMap::new());
        let (mut outgoing, mut incoming) = (Vec::new(), Vec::new());
        for b in &plan.boundaries {
            let bytes = slot_bytes(b, max_rows) * b.slots as usize;
            if b.from_rank == rank {
                tx.insert(b.boundary, dev.alloc(&s, bytes)?);
                outgoing.push(b.clone());
            }
            if b.to_rank == rank {
                rx.insert(b.boundary, dev.alloc(&s, bytes)?);
                incoming.push(b.clone());
            }
        }
        let has_moe = layers.iter().any(|l| matches!(l.ffn, FfnWeights::Moe(_)));
        let moe = match &m.moe {
            Some(summary) if has_moe => Some(MoeState::new(&dev, &s, summary, d, wide_rows)?),
            _ => None,
        };
        let moe_len = moe.as_ref().map_or(0, |e| e.rows.len());
        let exchange = match group {
            Some(g) if g.collective == PlanCollective::Oneshot => Some(Exchange::new(
                &dev,
                &s,
                (n * d).max(logits_len).max(moe_len),
                group_len,
            )?),
            _ => None,
        };
        Ok(RankDevice {
            rank,
            dev,
            streams,
            layers,
            kv,
            mla,
            dsa,
            kda,
            hc,
            embed,
            head,
            geo,
            sampler,
            buf,
            max_rows,
            sequences,
            logit_rows: Vec::new(),
            vocab_rows: logits_len,
            tx,
            rx,
            outgoing,
            incoming,
            exchange,
            collective: None,
            moe,
            pending: Pending::Hidden,
        })
    }
}
