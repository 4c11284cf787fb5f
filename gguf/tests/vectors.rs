//! Dequantization and quantization against reference vectors produced by the `gguf` Python
//! package (bit-exact with ggml's C reference) via `scripts/gen_dequant_vectors.py`; results
//! must match to the bit, compared as raw f32 bits.

use std::path::PathBuf;

use memra_gguf::{dequantize, quantize, GgmlType};

/// One vector file: its type, values and quantized bytes.
struct Vectors {
    dtype: GgmlType,
    values: Vec<f32>,
    bytes: Vec<u8>,
}

fn load(dir: &str, name: &str, magic: &[u8; 4]) -> Vectors {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("testdata")
        .join(dir)
        .join(format!("{name}.bin"));
    let raw = std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    assert_eq!(&raw[..4], magic, "{}", path.display());
    let word = |i: usize| u32::from_le_bytes(raw[4 + 4 * i..8 + 4 * i].try_into().unwrap());
    let dtype = GgmlType::from_id(word(0)).unwrap();
    assert_eq!(dtype.name(), name);
    let (n, m) = (word(1) as usize, word(2) as usize);
    let body = &raw[16..];
    assert_eq!(body.len(), n * 4 + m, "{}", path.display());
    let (floats, bytes) = if magic == b"MDQV" {
        (&body[m..], &body[..m])
    } else {
        (&body[..n * 4], &body[n * 4..])
    };
    let values = floats
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
        .collect();
    Vectors {
        dtype,
        values,
        bytes: bytes.to_vec(),
    }
}

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|f| f.to_bits()).collect()
}

#[test]
fn dequantize_matches_reference_bit_for_bit() {
    for name in ["f32", "f16", "bf16", "q8_0", "q4_0", "q4_1", "q4_k", "q6_k"] {
        let v = load("dequant", name, b"MDQV");
        assert!(v.values.len() >= 256, "{name}: too few reference values");
        let mut out = vec![f32::NAN; v.values.len()];
        dequantize(v.dtype, &v.bytes, &mut out).unwrap();
        let (want, got) = (bits(&v.values), bits(&out));
        let bad = want.iter().zip(&got).position(|(a, b)| a != b);
        if let Some(i) = bad {
            panic!(
                "{name}: value {i}: expected {} ({:#010x}), got {} ({:#010x})",
                v.values[i], want[i], out[i], got[i]
            );
        }
    }
}

#[test]
fn dequantize_block_ranges_match_whole_tensor() {
    // dequantizing any whole-block sub-range gives the same bits as the whole
    for name in ["q4_k", "q6_k", "q8_0"] {
        let v = load("dequant", name, b"MDQV");
        let (bs, bb) = (v.dtype.block_size(), v.dtype.block_bytes());
        let mut out = vec![0f32; 3 * bs];
        dequantize(v.dtype, &v.bytes[bb..4 * bb], &mut out).unwrap();
        assert_eq!(bits(&out), bits(&v.values[bs..4 * bs]), "{name}");
    }
}

#[test]
fn quantize_matches_reference_bit_for_bit() {
    for name in ["f16", "bf16", "q8_0", "q4_0", "q4_1"] {
        let v = load("quant", name, b"MQTV");
        let mut out = vec![0xAAu8; v.bytes.len()];
        quantize(v.dtype, &v.values, &mut out).unwrap();
        let bb = v.dtype.block_bytes();
        let bad = out
            .chunks(bb)
            .zip(v.bytes.chunks(bb))
            .position(|(a, b)| a != b);
        if let Some(i) = bad {
            panic!(
                "{name}: block {i}: expected {:02x?}, got {:02x?}",
                &v.bytes[i * bb..(i + 1) * bb],
                &out[i * bb..(i + 1) * bb]
            );
        }
    }
}
