//! The reader against valid and corrupted files: a valid file round-trips through the writer,
//! and every kind of corruption (truncation, bad magic, absurd counts and lengths, bad shapes,
//! ranges, alignment, duplicates) fails with an error naming the file, never a panic.

use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};

use memra_gguf::{GgmlType, GgufFile, GgufWriter, Value};

/// A fresh path under the system temp dir, unique per process and call.
fn temp_path(tag: &str) -> PathBuf {
    static N: AtomicUsize = AtomicUsize::new(0);
    let n = N.fetch_add(1, Ordering::Relaxed);
    std::env::temp_dir().join(format!("memra-gguf-{}-{tag}-{n}.gguf", std::process::id()))
}

fn f32_bytes(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|f| f.to_le_bytes()).collect()
}

/// A small valid file: a string key first (so its length sits at byte 41), keys of every
/// type, and tensors `a.weight` (f32 [4, 2]) and `b.weight` (q8_0 [32, 2]).
fn sample() -> Vec<u8> {
    let mut w = GgufWriter::new();
    w.add("k.str", Value::Str("hello".into())).unwrap();
    w.add("k.u8", Value::U8(7)).unwrap();
    w.add("k.i8", Value::I8(-7)).unwrap();
    w.add("k.u16", Value::U16(700)).unwrap();
    w.add("k.i16", Value::I16(-700)).unwrap();
    w.add("k.u32", Value::U32(70_000)).unwrap();
    w.add("k.i32", Value::I32(-70_000)).unwrap();
    w.add("k.u64", Value::U64(1 << 40)).unwrap();
    w.add("k.i64", Value::I64(-(1 << 40))).unwrap();
    w.add("k.f32", Value::F32(0.5)).unwrap();
    w.add("k.f64", Value::F64(0.25)).unwrap();
    w.add("k.bool", Value::Bool(true)).unwrap();
    let strs = ["x", "yy", ""].map(|s| Value::Str(s.into())).to_vec();
    w.add("k.strs", Value::Array(strs)).unwrap();
    let nested = Value::Array(vec![Value::Array(vec![Value::I32(1), Value::I32(2)])]);
    w.add("k.nested", nested).unwrap();
    w.add("k.empty", Value::Array(vec![])).unwrap();
    let a = f32_bytes(&[1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0]);
    w.add_tensor("a.weight", &[4, 2], GgmlType::F32, a).unwrap();
    let b: Vec<u8> = (0..68u8).collect();
    w.add_tensor("b.weight", &[32, 2], GgmlType::Q8_0, b)
        .unwrap();
    w.to_bytes().unwrap()
}

fn write(bytes: &[u8], tag: &str) -> PathBuf {
    let p = temp_path(tag);
    std::fs::write(&p, bytes).unwrap();
    p
}

/// Opens corrupted bytes and returns the error text after the "<path>: " prefix.
fn open_err(bytes: &[u8]) -> String {
    let p = write(bytes, "bad");
    let e = GgufFile::open(&p).expect_err("corrupt file opened");
    let _ = std::fs::remove_file(&p);
    let text = e.to_string();
    let prefix = format!("{}: ", p.display());
    assert!(
        text.starts_with(&prefix),
        "error does not name the file: {text}"
    );
    text[prefix.len()..].to_string()
}

fn find(hay: &[u8], needle: &[u8]) -> usize {
    hay.windows(needle.len()).position(|w| w == needle).unwrap()
}

/// Overwrites a u64 field of the tensor info of `name`.
fn patch(b: &mut [u8], name: &str, field: &str, v: u64) {
    let at = info_field(b, name, field);
    put_u64(b, at, v);
}

fn put_u64(b: &mut [u8], at: usize, v: u64) {
    b[at..at + 8].copy_from_slice(&v.to_le_bytes());
}

/// Byte position of a field in the tensor info of `name` (which must have 2 dims).
fn info_field(b: &[u8], name: &str, field: &str) -> usize {
    let at = find(b, name.as_bytes()) + name.len();
    match field {
        "n_dims" => at,
        "dim0" => at + 4,
        "dim1" => at + 12,
        "type" => at + 20,
        "offset" => at + 24,
        _ => unreachable!(),
    }
}

#[test]
fn valid_file_round_trips() {
    let p = write(&sample(), "ok");
    let f = GgufFile::open(&p).unwrap();
    assert_eq!(f.version, 3);
    assert_eq!(f.metadata.len(), 15);
    assert_eq!(f.get_str("k.str").unwrap(), "hello");
    assert_eq!(f.get_u32("k.u8").unwrap(), 7);
    assert_eq!(f.get_u32("k.u32").unwrap(), 70_000);
    assert_eq!(f.get_u64("k.u64").unwrap(), 1 << 40);
    assert_eq!(f.get_i64("k.i64").unwrap(), -(1 << 40));
    assert_eq!(f.get_f32("k.f32").unwrap(), 0.5);
    assert_eq!(f.get_f32("k.f64").unwrap(), 0.25);
    assert!(f.get_bool("k.bool").unwrap());
    assert_eq!(f.get_str_array("k.strs").unwrap(), ["x", "yy", ""]);
    assert_eq!(f.get_array("k.empty").unwrap().len(), 0);
    assert_eq!(f.metadata["k.i16"], Value::I16(-700));
    assert_eq!(
        f.metadata["k.nested"],
        Value::Array(vec![Value::Array(vec![Value::I32(1), Value::I32(2)])])
    );
    assert_eq!(f.tensors.len(), 2);
    let a = f.tensor("a.weight").unwrap();
    assert_eq!(
        (a.dims.as_slice(), a.dtype, a.offset),
        ([4, 2].as_slice(), GgmlType::F32, 0)
    );
    assert_eq!(
        f.dequantize_tensor(a).unwrap(),
        [1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0]
    );
    assert_eq!(
        f.tensor_rows(a, 1..2).unwrap(),
        f32_bytes(&[5.0, 6.0, 7.0, 8.0])
    );
    let b = f.tensor("b.weight").unwrap();
    assert_eq!(b.offset, 32);
    assert_eq!(f.tensor_bytes(b), (0..68u8).collect::<Vec<_>>());
    assert_eq!(f.data_offset % 32, 0);
    assert_eq!(f.file_len(), f.data_offset + 32 + 68);
    assert!(f.tensor("c.weight").is_none());
    let _ = std::fs::remove_file(&p);
}

#[test]
fn typed_getters_explain_mismatches() {
    let p = write(&sample(), "get");
    let f = GgufFile::open(&p).unwrap();
    let file = p.display();
    let e = |r: anyhow::Result<_>| -> String { r.map(|_: ()| ()).unwrap_err().to_string() };
    assert_eq!(
        e(f.get_u32("llama.block_count").map(drop)),
        format!("missing key `llama.block_count` in {file}")
    );
    assert_eq!(
        e(f.get_u32("k.i8").map(drop)),
        format!("key `k.i8` in {file} is int8 -7, expected an integer that fits uint32")
    );
    assert_eq!(
        e(f.get_u32("k.u64").map(drop)),
        format!(
            "key `k.u64` in {file} is uint64 1099511627776, expected an integer that fits uint32"
        )
    );
    assert_eq!(
        e(f.get_str("k.u8").map(drop)),
        format!("key `k.u8` in {file} is uint8 7, expected a string")
    );
    assert_eq!(
        e(f.get_f32("k.str").map(drop)),
        format!("key `k.str` in {file} is string \"hello\", expected a float")
    );
    assert_eq!(
        e(f.get_str_array("k.nested").map(drop)),
        format!("key `k.nested` in {file}: element 0 is array, expected a string")
    );
    assert!(
        e(f.tensor_rows(f.tensor("a.weight").unwrap(), 1..3).map(drop))
            .contains("rows 1..3 out of range for tensor `a.weight` with 2 rows")
    );
    let _ = std::fs::remove_file(&p);
}

#[test]
fn version_2_is_accepted_and_others_are_not() {
    let mut b = sample();
    b[4] = 2;
    let p = write(&b, "v2");
    assert_eq!(GgufFile::open(&p).unwrap().version, 2);
    let _ = std::fs::remove_file(&p);
    b[4] = 1;
    assert_eq!(
        open_err(&b),
        "gguf version 1 is not supported; supported: 2, 3"
    );
    b[4] = 4;
    assert_eq!(open_err(&b), "unknown gguf version 4; supported: 2, 3");
    b[4..8].copy_from_slice(&3u32.to_be_bytes());
    assert!(open_err(&b).starts_with("big-endian gguf files are not supported"));
}

#[test]
fn bad_magic() {
    let mut b = sample();
    b[0] = b'X';
    assert_eq!(
        open_err(&b),
        "not a gguf file: magic is \"XGUF\", expected \"GGUF\""
    );
    assert!(open_err(b"").starts_with("truncated at byte 0: magic needs 4 bytes"));
}

#[test]
fn every_truncation_fails_cleanly() {
    let b = sample();
    for n in 0..b.len() {
        let e = open_err(&b[..n]);
        assert!(
            e.contains("truncated")
                || e.contains("impossible")
                || e.contains("past the end")
                || e.contains("length"),
            "prefix {n}: {e}"
        );
    }
}

#[test]
fn absurd_counts_are_rejected_before_allocating() {
    let mut b = sample();
    put_u64(&mut b, 8, 1 << 60);
    assert!(open_err(&b).starts_with("at byte 8: tensor count 1152921504606846976 is impossible"));
    let mut b = sample();
    put_u64(&mut b, 16, u64::MAX);
    assert!(
        open_err(&b).starts_with("at byte 16: metadata count 18446744073709551615 is impossible")
    );
    let mut b = sample();
    put_u64(&mut b, 41, 1 << 62);
    assert!(open_err(&b).starts_with("at byte 41: k.str has length 4611686018427387904 but only"));
    let mut b = sample();
    put_u64(&mut b, 24, 1 << 62);
    assert!(open_err(&b).starts_with("at byte 24: metadata key has length 4611686018427387904"));
    // the array count of k.strs follows its key, value type (9) and element type (8)
    let mut b = sample();
    let at = find(&b, b"k.strs") + 6 + 8;
    put_u64(&mut b, at, 1 << 61);
    let e = open_err(&b);
    assert!(
        e.starts_with(&format!(
            "at byte {at}: key `k.strs`: array length 2305843009213693952 is impossible"
        )),
        "{e}"
    );
}

#[test]
fn bad_values_are_rejected() {
    let mut b = sample();
    let at = find(&b, b"k.bool") + 6 + 4;
    b[at] = 2;
    assert_eq!(
        open_err(&b),
        format!("at byte {at}: key `k.bool`: bool byte is 2, expected 0 or 1")
    );
    let mut b = sample();
    let at = find(&b, b"k.u8") + 4;
    b[at] = 13;
    assert!(open_err(&b).contains("key `k.u8`: unknown value type 13"));
    let mut deep = Value::I32(0);
    for _ in 0..9 {
        deep = Value::Array(vec![deep]);
    }
    let mut w = GgufWriter::new();
    w.add("deep", deep).unwrap();
    assert!(open_err(&w.to_bytes().unwrap()).contains("key `deep`: arrays nested deeper than 8"));
    let mut w = GgufWriter::new();
    w.add("general.alignment", Value::U32(48)).unwrap();
    assert_eq!(
        open_err(&w.to_bytes().unwrap()),
        "general.alignment must be a power of two that fits uint32, found uint32 48"
    );
}

#[test]
fn bad_tensor_infos_are_rejected() {
    let cases: [(&str, &str, u64, &str); 8] = [
        (
            "b.weight",
            "dim0",
            (1 << 63) - 32,
            "dims [9223372036854775776, 2] overflow the byte size",
        ),
        (
            "b.weight",
            "dim1",
            u64::MAX,
            "dims [32, 18446744073709551615] overflow the element count",
        ),
        (
            "b.weight",
            "dim0",
            16,
            "row length 16 is not a multiple of the q8_0 block size 32",
        ),
        ("b.weight", "dim1", 0, "dimension 1 is 0 in [32, 0]"),
        (
            "b.weight",
            "offset",
            8,
            "offset 8 is not a multiple of the alignment 32",
        ),
        (
            "b.weight",
            "offset",
            1 << 40,
            "68 bytes at data offset 1099511627776 run past the end of the file",
        ),
        (
            "b.weight",
            "offset",
            u64::MAX - 31,
            "run past the end of the file",
        ),
        (
            "a.weight",
            "dim1",
            3,
            "tensors `a.weight` and `b.weight` overlap",
        ),
    ];
    for (name, field, v, want) in cases {
        let mut b = sample();
        patch(&mut b, name, field, v);
        let e = open_err(&b);
        assert!(e.contains(want), "{name}.{field} = {v}: {e}");
    }
    let mut b = sample();
    let at = info_field(&b, "b.weight", "type");
    b[at] = 4;
    assert_eq!(open_err(&b), "tensor `b.weight`: unknown ggml type id 4");
    let mut b = sample();
    let at = info_field(&b, "b.weight", "n_dims");
    b[at] = 5;
    assert_eq!(
        open_err(&b),
        "tensor `b.weight`: 5 dims, at most 4 are allowed"
    );
    let mut b = sample();
    let at = find(&b, b"b.weight");
    b[at] = b'a';
    assert!(open_err(&b).contains("duplicate tensor name `a.weight`"));
}

#[test]
fn several_tensor_errors_are_all_reported() {
    let mut b = sample();
    patch(&mut b, "a.weight", "offset", 8);
    patch(&mut b, "b.weight", "dim0", 16);
    let e = open_err(&b);
    assert_eq!(
        e,
        "tensor `a.weight`: offset 8 is not a multiple of the alignment 32\n\
         tensor `b.weight`: row length 16 is not a multiple of the q8_0 block size 32"
    );
}

#[test]
fn alignment_key_is_honoured() {
    let mut w = GgufWriter::with_alignment(256).unwrap();
    w.add_tensor("a", &[3], GgmlType::F32, f32_bytes(&[1.0, 2.0, 3.0]))
        .unwrap();
    w.add_tensor("b", &[2], GgmlType::F16, vec![0, 60, 0, 188])
        .unwrap();
    let p = write(&w.to_bytes().unwrap(), "align");
    let f = GgufFile::open(&p).unwrap();
    assert_eq!(f.data_offset % 256, 0);
    let b = f.tensor("b").unwrap();
    assert_eq!(b.offset, 256);
    assert_eq!(f.dequantize_tensor(b).unwrap(), [1.0, -1.0]);
    let _ = std::fs::remove_file(&p);
    assert!(GgufWriter::with_alignment(48).is_err());
}

#[test]
fn unsupported_types_open_but_do_not_dequantize() {
    let mut w = GgufWriter::new();
    w.add_tensor("q", &[256], GgmlType::Q5_K, vec![0; 176])
        .unwrap();
    let p = write(&w.to_bytes().unwrap(), "q5k");
    let f = GgufFile::open(&p).unwrap();
    let e = f.dequantize_tensor(&f.tensors[0]).unwrap_err().to_string();
    assert_eq!(e, format!("{}: tensor `q`: q5_k is not supported; supported: f32, f16, bf16, q8_0, q4_0, q4_1, q4_k, q6_k", p.display()));
    let _ = std::fs::remove_file(&p);
}

#[test]
fn writer_rejects_what_the_reader_would() {
    let mut w = GgufWriter::new();
    assert!(w
        .add_tensor("a", &[16], GgmlType::Q8_0, vec![0; 17])
        .unwrap_err()
        .to_string()
        .contains("row length 16"));
    w.add_tensor("a", &[4], GgmlType::F32, vec![0; 16]).unwrap();
    assert_eq!(
        w.add_tensor("a", &[4], GgmlType::F32, vec![0; 16])
            .unwrap_err()
            .to_string(),
        "duplicate tensor name `a`"
    );
    assert!(w
        .add_tensor("c", &[4], GgmlType::F32, vec![0; 15])
        .unwrap_err()
        .to_string()
        .contains("takes 16 bytes, got 15"));
    w.add("k", Value::U8(1)).unwrap();
    assert!(w.add("k", Value::U8(1)).is_err());
    assert!(w
        .add("mixed", Value::Array(vec![Value::U8(1), Value::I8(1)]))
        .is_err());
    w.declare_tensor("streamed", &[2], GgmlType::F32).unwrap();
    assert_eq!(
        w.to_bytes().unwrap_err().to_string(),
        "tensor `streamed` was declared but has no data"
    );
    let mut s = w.start(Vec::new()).unwrap();
    s.write(&[0; 16]).unwrap();
    assert!(s
        .write(&[0; 9])
        .unwrap_err()
        .to_string()
        .contains("tensor `streamed`: 9 bytes written but it takes 8"));
}

#[test]
fn messages_quoting_a_files_keys_names_and_strings_escape_control_characters() {
    let (key, name) = ("evil\x1b[31m.flag", "red\x1b[0m.weight");
    let mut w = GgufWriter::new();
    w.add(key, Value::Bool(true)).unwrap();
    w.add("k.str", Value::Str("clear\x1b[2J\u{202e}".into()))
        .unwrap();
    w.add_tensor(name, &[2, 1], GgmlType::F32, f32_bytes(&[1.0, 2.0]))
        .unwrap();
    let mut b = w.to_bytes().unwrap();
    let p = write(&b, "escape");
    let file = GgufFile::open(&p).unwrap();
    let wrong_type = file.get_u32("k.str").unwrap_err().to_string();
    assert_eq!(
        wrong_type,
        format!(
            "key `k.str` in {} is string \"clear\\x1b[2J\\u{{202e}}\", expected an integer that fits uint32",
            p.display()
        )
    );
    let missing = file.get_u32("no\x07such").unwrap_err().to_string();
    assert!(
        missing.starts_with("missing key `no\\x07such` in "),
        "{missing}"
    );
    let _ = std::fs::remove_file(&p);
    // the bool's byte follows its key and the u32 type id
    let at = find(&b, key.as_bytes()) + key.len() + 4;
    b[at] = 2;
    assert_eq!(
        open_err(&b),
        format!("at byte {at}: key `evil\\x1b[31m.flag`: bool byte is 2, expected 0 or 1")
    );
    b[at] = 1;
    let ty = info_field(&b, name, "type");
    b[ty..ty + 4].copy_from_slice(&99u32.to_le_bytes());
    assert_eq!(
        open_err(&b),
        "tensor `red\\x1b[0m.weight`: unknown ggml type id 99"
    );
}
