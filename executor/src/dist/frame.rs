//! The messages processes exchange and their bytes on a TCP connection: each frame is a
//! little-endian `u32` length, then a one-byte tag, then the fields in order (integers
//! little-endian, strings and byte lists as a `u32` length and the bytes, f32 lists as a
//! `u32` count and each value's bits). Floats travel as their bits, so a partial sum or a
//! hidden state arrives exactly as it was computed.
//!
//! World messages (`Hello` .. `Abort`) build and end the mesh; `Engine` messages belong to one
//! engine opened on the world (its epoch) and carry what the in-process wire shares: event
//! records, boundary slot payloads, collective parts, and the sampled tokens the readback
//! process hands to the others.

use std::io::{self, Read, Write};

use anyhow::{anyhow, bail, Result};

/// First field of every `Hello`, so that a stray connection is refused at once.
const MAGIC: u32 = 0x6d65_6d72;
/// Version of this protocol; processes of different builds refuse each other.
pub const VERSION: u32 = 1;
/// Largest frame accepted: far above any hidden state or logits slice, far below memory.
const MAX_FRAME: u32 = 1 << 30;

/// What a boundary slot holds.
#[derive(Debug, Clone, PartialEq)]
pub enum Payload {
    /// The residual stream.
    Hidden(Vec<f32>),
    /// A sampled token.
    Token(u32),
}

/// One message between two processes.
#[derive(Debug, Clone, PartialEq)]
pub enum Msg {
    /// A process introduces itself: to process 0 with the address it accepts peers on, and to
    /// each peer it connects to.
    Hello {
        version: u32,
        process: u32,
        processes: u32,
        listen: String,
    },
    /// Process 0's answer: every process's listening address, by process (its own empty).
    Table { listen: Vec<String> },
    /// A process opened its engine number `epoch` on plan `plan` (placement and model).
    Open { epoch: u64, plan: String },
    /// Bytes one process hands to all others (a chat line).
    Share { bytes: Vec<u8> },
    /// The sender finished its command and closes.
    Bye,
    /// The sender failed and exits.
    Abort { why: String },
    /// A message to the engine opened as `epoch`.
    Engine { epoch: u64, body: Body },
}

/// What one engine's wire tells the same engine in another process.
#[derive(Debug, Clone, PartialEq)]
pub enum Body {
    /// `event` was recorded for decode step `step`.
    Record { event: String, step: u64 },
    /// The sender wrote `payload` into `slot` of `boundary`.
    Slot {
        boundary: u32,
        slot: u32,
        payload: Payload,
    },
    /// One member's part of a collective.
    Part(Part),
    /// The readback process sampled `token` at decode step `step` (position `pos`).
    Token { step: u64, pos: u32, token: u32 },
}

/// Member `index`'s part of collective `seq` of `group` (of `members` ranks), taken by `takers`
/// ranks of the receiving process.
#[derive(Debug, Clone, PartialEq)]
pub struct Part {
    pub group: u32,
    pub seq: u64,
    pub index: u32,
    pub members: u32,
    pub takers: u32,
    pub data: Vec<f32>,
}

const HELLO: u8 = 1;
const TABLE: u8 = 2;
const OPEN: u8 = 3;
const SHARE: u8 = 4;
const BYE: u8 = 5;
const ABORT: u8 = 6;
const RECORD: u8 = 10;
const SLOT_HIDDEN: u8 = 11;
const SLOT_TOKEN: u8 = 12;
const PART: u8 = 13;
const TOKEN: u8 = 14;

/// Writes `msg` as one frame (one `write_all`, so frames of several threads never interleave
/// when the caller holds the stream's lock).
pub fn write(w: &mut impl Write, msg: &Msg) -> io::Result<()> {
    let mut e = Enc(vec![0; 4]);
    match msg {
        Msg::Hello {
            version,
            process,
            processes,
            listen,
        } => {
            e.u8(HELLO);
            e.u32(MAGIC);
            e.u32(*version);
            e.u32(*process);
            e.u32(*processes);
            e.str(listen);
        }
        Msg::Table { listen } => {
            e.u8(TABLE);
            e.u32(listen.len() as u32);
            listen.iter().for_each(|l| e.str(l));
        }
        Msg::Open { epoch, plan } => {
            e.u8(OPEN);
            e.u64(*epoch);
            e.str(plan);
        }
        Msg::Share { bytes } => {
            e.u8(SHARE);
            e.bytes(bytes);
        }
        Msg::Bye => e.u8(BYE),
        Msg::Abort { why } => {
            e.u8(ABORT);
            e.str(why);
        }
        Msg::Engine { epoch, body } => {
            let tag = match body {
                Body::Record { .. } => RECORD,
                Body::Slot {
                    payload: Payload::Hidden(_),
                    ..
                } => SLOT_HIDDEN,
                Body::Slot {
                    payload: Payload::Token(_),
                    ..
                } => SLOT_TOKEN,
                Body::Part(_) => PART,
                Body::Token { .. } => TOKEN,
            };
            e.u8(tag);
            e.u64(*epoch);
            match body {
                Body::Record { event, step } => {
                    e.str(event);
                    e.u64(*step);
                }
                Body::Slot {
                    boundary,
                    slot,
                    payload,
                } => {
                    e.u32(*boundary);
                    e.u32(*slot);
                    match payload {
                        Payload::Hidden(v) => e.f32s(v),
                        Payload::Token(t) => e.u32(*t),
                    }
                }
                Body::Part(p) => {
                    e.u32(p.group);
                    e.u64(p.seq);
                    e.u32(p.index);
                    e.u32(p.members);
                    e.u32(p.takers);
                    e.f32s(&p.data);
                }
                Body::Token { step, pos, token } => {
                    e.u64(*step);
                    e.u32(*pos);
                    e.u32(*token);
                }
            }
        }
    }
    let len = (e.0.len() - 4) as u32;
    e.0[..4].copy_from_slice(&len.to_le_bytes());
    w.write_all(&e.0)?;
    w.flush()
}

/// Reads one frame; `Ok(None)` when the connection ended cleanly before a frame began.
pub fn read(r: &mut impl Read) -> Result<Option<Msg>> {
    let mut len = [0u8; 4];
    match r.read_exact(&mut len) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => return Ok(None),
        Err(e) => return Err(e.into()),
    }
    let len = u32::from_le_bytes(len);
    if len == 0 || len > MAX_FRAME {
        bail!("a frame of {len} bytes; frames hold 1..={MAX_FRAME} bytes");
    }
    let mut buf = vec![0u8; len as usize];
    r.read_exact(&mut buf)?;
    let mut d = Dec { buf: &buf, pos: 0 };
    let msg = decode(&mut d)?;
    if d.pos != buf.len() {
        bail!("{} bytes left over after a message", buf.len() - d.pos);
    }
    Ok(Some(msg))
}

fn decode(d: &mut Dec) -> Result<Msg> {
    let tag = d.u8()?;
    Ok(match tag {
        HELLO => {
            if d.u32()? != MAGIC {
                bail!("the peer does not speak memra's protocol");
            }
            Msg::Hello {
                version: d.u32()?,
                process: d.u32()?,
                processes: d.u32()?,
                listen: d.str()?,
            }
        }
        TABLE => {
            let n = d.u32()?;
            let listen = (0..n).map(|_| d.str()).collect::<Result<_>>()?;
            Msg::Table { listen }
        }
        OPEN => Msg::Open {
            epoch: d.u64()?,
            plan: d.str()?,
        },
        SHARE => Msg::Share { bytes: d.bytes()? },
        BYE => Msg::Bye,
        ABORT => Msg::Abort { why: d.str()? },
        RECORD | SLOT_HIDDEN | SLOT_TOKEN | PART | TOKEN => {
            let epoch = d.u64()?;
            let body = match tag {
                RECORD => Body::Record {
                    event: d.str()?,
                    step: d.u64()?,
                },
                SLOT_HIDDEN | SLOT_TOKEN => Body::Slot {
                    boundary: d.u32()?,
                    slot: d.u32()?,
                    payload: if tag == SLOT_HIDDEN {
                        Payload::Hidden(d.f32s()?)
                    } else {
                        Payload::Token(d.u32()?)
                    },
                },
                PART => Body::Part(Part {
                    group: d.u32()?,
                    seq: d.u64()?,
                    index: d.u32()?,
                    members: d.u32()?,
                    takers: d.u32()?,
                    data: d.f32s()?,
                }),
                _ => Body::Token {
                    step: d.u64()?,
                    pos: d.u32()?,
                    token: d.u32()?,
                },
            };
            Msg::Engine { epoch, body }
        }
        other => bail!("unknown message tag {other}"),
    })
}

struct Enc(Vec<u8>);

impl Enc {
    fn u8(&mut self, v: u8) {
        self.0.push(v);
    }
    fn u32(&mut self, v: u32) {
        self.0.extend_from_slice(&v.to_le_bytes());
    }
    fn u64(&mut self, v: u64) {
        self.0.extend_from_slice(&v.to_le_bytes());
    }
    fn bytes(&mut self, v: &[u8]) {
        self.u32(v.len() as u32);
        self.0.extend_from_slice(v);
    }
    fn str(&mut self, v: &str) {
        self.bytes(v.as_bytes());
    }
    fn f32s(&mut self, v: &[f32]) {
        self.u32(v.len() as u32);
        self.0.reserve(v.len() * 4);
        v.iter()
            .for_each(|x| self.0.extend_from_slice(&x.to_le_bytes()));
    }
}

struct Dec<'a> {
    buf: &'a [u8],
    pos: usize,
}

impl Dec<'_> {
    fn take(&mut self, n: usize) -> Result<&[u8]> {
        let end = self
            .pos
            .checked_add(n)
            .filter(|&e| e <= self.buf.len())
            .ok_or_else(|| anyhow!("a message ends early"))?;
        let out = &self.buf[self.pos..end];
        self.pos = end;
        Ok(out)
    }
    fn u8(&mut self) -> Result<u8> {
        Ok(self.take(1)?[0])
    }
    fn u32(&mut self) -> Result<u32> {
        let b = self.take(4)?;
        Ok(u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    }
    fn u64(&mut self) -> Result<u64> {
        let b = self.take(8)?;
        Ok(u64::from_le_bytes(
            b.try_into().expect("invariant: 8 bytes"),
        ))
    }
    fn bytes(&mut self) -> Result<Vec<u8>> {
        let n = self.u32()? as usize;
        Ok(self.take(n)?.to_vec())
    }
    fn str(&mut self) -> Result<String> {
        String::from_utf8(self.bytes()?).map_err(|_| anyhow!("a string is not utf-8"))
    }
    fn f32s(&mut self) -> Result<Vec<f32>> {
        let n = self.u32()? as usize;
        let bytes = self.take(
            n.checked_mul(4)
                .ok_or_else(|| anyhow!("a list is too long"))?,
        )?;
        Ok(bytes
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect())
    }
}

/// A `Hello` of this build.
pub fn hello(process: u32, processes: u32, listen: String) -> Msg {
    Msg::Hello {
        version: VERSION,
        process,
        processes,
        listen,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_message_survives_the_round_trip_bit_for_bit() {
        let nan = f32::from_bits(0x7fc0_1234);
        let msgs = [
            hello(2, 4, "127.0.0.1:4000".into()),
            Msg::Table {
                listen: vec![String::new(), "10.0.0.2:5000".into()],
            },
            Msg::Open {
                epoch: 3,
                plan: "placement 5c5d".into(),
            },
            Msg::Share {
                bytes: b"hello".to_vec(),
            },
            Msg::Bye,
            Msg::Abort {
                why: "rank 3 broke".into(),
            },
            Msg::Engine {
                epoch: 1,
                body: Body::Record {
                    event: "b0.ready".into(),
                    step: 7,
                },
            },
            Msg::Engine {
                epoch: 1,
                body: Body::Slot {
                    boundary: 2,
                    slot: 1,
                    payload: Payload::Hidden(vec![1.5, -0.0, 1e-40]),
                },
            },
            Msg::Engine {
                epoch: 1,
                body: Body::Slot {
                    boundary: 3,
                    slot: 0,
                    payload: Payload::Token(511),
                },
            },
            Msg::Engine {
                epoch: 2,
                body: Body::Part(Part {
                    group: 1,
                    seq: 9,
                    index: 1,
                    members: 2,
                    takers: 1,
                    data: vec![nan, f32::INFINITY],
                }),
            },
            Msg::Engine {
                epoch: 2,
                body: Body::Token {
                    step: 4,
                    pos: 4,
                    token: 17,
                },
            },
        ];
        let mut bytes = Vec::new();
        for m in &msgs {
            write(&mut bytes, m).unwrap();
        }
        let mut r = bytes.as_slice();
        for m in &msgs {
            let got = read(&mut r).unwrap().unwrap();
            match (&got, m) {
                (
                    Msg::Engine {
                        body: Body::Part(Part { data: a, .. }),
                        ..
                    },
                    Msg::Engine {
                        body: Body::Part(Part { data: b, .. }),
                        ..
                    },
                ) => {
                    let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                    assert_eq!(bits(a), bits(b));
                }
                _ => assert_eq!(&got, m),
            }
        }
        assert!(read(&mut r).unwrap().is_none());
    }

    #[test]
    fn garbage_is_refused_with_a_reason() {
        let mut r: &[u8] = &[0, 0, 0, 0];
        assert!(read(&mut r).unwrap_err().to_string().contains("0 bytes"));
        let mut r: &[u8] = &[1, 0, 0, 0, 99];
        let e = read(&mut r).unwrap_err().to_string();
        assert!(e.contains("unknown message tag 99"), "{e}");
        let mut r: &[u8] = &[2, 0, 0, 0, BYE, 0];
        assert!(read(&mut r).unwrap_err().to_string().contains("left over"));
    }
}
