use super::*;
use crate::gguf_writer::GgufWriter;
use std::io::Write;

fn write_tmp(bytes: &[u8]) -> tempfile::NamedTempFile {
    let mut f = tempfile::NamedTempFile::new().unwrap();
    f.write_all(bytes).unwrap();
    f.flush().unwrap();
    f
}

fn sample() -> GgufWriter {
    let mut w = GgufWriter::new();
    w.meta_str("general.architecture", "llama")
        .meta("llama.block_count", MetaValue::U32(2))
        .meta("x.i8", MetaValue::I8(-3))
        .meta("x.u16", MetaValue::U16(65535))
        .meta("x.i16", MetaValue::I16(-2))
        .meta("x.i32", MetaValue::I32(-7))
        .meta("x.u64", MetaValue::U64(1 << 40))
        .meta("x.i64", MetaValue::I64(-(1 << 40)))
        .meta("x.f32", MetaValue::F32(0.5))
        .meta("x.f64", MetaValue::F64(0.25))
        .meta("x.bool", MetaValue::Bool(true))
        .meta(
            "x.nested",
            MetaValue::Array(vec![
                MetaValue::Array(vec![MetaValue::I32(1), MetaValue::I32(2)]),
                MetaValue::Array(vec![MetaValue::I32(3)]),
            ]),
        )
        .meta(
            "x.strs",
            MetaValue::Array(vec![
                MetaValue::Str(b"a".to_vec()),
                MetaValue::Str(vec![0xff, 0xfe]),
            ]),
        )
        .tensor_f32("a", &[2, 3], &[1., 2., 3., 4., 5., 6.])
        .tensor_f32("b", &[5], &[7., 8., 9., 10., 11.]);
    w
}

#[test]
fn round_trips_every_value_type_and_tensor() {
    let f = write_tmp(&sample().to_bytes());
    let g = Gguf::open(f.path()).unwrap();
    assert_eq!(g.version, 3);
    assert_eq!(g.architecture().unwrap(), "llama");
    let m = &g.metadata;
    assert_eq!(m.usize("llama.block_count").unwrap(), 2);
    assert_eq!(m.get("x.i8"), Some(&MetaValue::I8(-3)));
    assert_eq!(m.get("x.u16"), Some(&MetaValue::U16(65535)));
    assert_eq!(m.get("x.i16"), Some(&MetaValue::I16(-2)));
    assert_eq!(m.get("x.i32"), Some(&MetaValue::I32(-7)));
    assert_eq!(m.get("x.u64"), Some(&MetaValue::U64(1 << 40)));
    assert_eq!(m.get("x.i64"), Some(&MetaValue::I64(-(1 << 40))));
    assert_eq!(m.f32("x.f32").unwrap(), 0.5);
    assert_eq!(m.f32("x.f64").unwrap(), 0.25);
    assert_eq!(m.bool_opt("x.bool").unwrap(), Some(true));
    let nested = m.array_opt("x.nested").unwrap().unwrap();
    assert_eq!(
        nested[0],
        MetaValue::Array(vec![MetaValue::I32(1), MetaValue::I32(2)])
    );
    let strs = m.byte_strings_opt("x.strs").unwrap().unwrap();
    assert_eq!(strs, vec![&b"a"[..], &[0xff, 0xfe][..]]);

    let a = g.tensors.require("a").unwrap();
    assert_eq!(a.shape, &[2, 3]);
    assert_eq!(a.to_f32().unwrap(), vec![1., 2., 3., 4., 5., 6.]);
    let b = g.tensors.require("b").unwrap();
    assert_eq!(b.to_f32().unwrap(), vec![7., 8., 9., 10., 11.]);
    assert_eq!(
        b.data.as_ptr() as usize % 32,
        (g.tensors.get("a").unwrap().data.as_ptr() as usize) % 32
    );
}

#[test]
fn custom_alignment_is_honoured() {
    let mut w = sample();
    w.meta("general.alignment", MetaValue::U32(64));
    let f = write_tmp(&w.to_bytes());
    let g = Gguf::open(f.path()).unwrap();
    assert_eq!(g.tensors.require("b").unwrap().to_f32().unwrap()[4], 11.0);
}

fn open_err(bytes: &[u8]) -> String {
    let f = write_tmp(bytes);
    let msg = match Gguf::open(f.path()) {
        Ok(_) => panic!("expected an error"),
        Err(e) => e.to_string(),
    };
    assert!(
        msg.contains(&f.path().display().to_string()),
        "error does not name the file: {msg}"
    );
    msg
}

#[test]
fn wrong_magic_is_named() {
    let mut b = sample().to_bytes();
    b[0] = b'X';
    assert!(open_err(&b).contains("not a GGUF file"));
    assert!(open_err(b"GG").contains("too short"));
}

#[test]
fn every_truncation_is_an_error_not_a_panic() {
    let b = sample().to_bytes();
    for cut in 0..b.len() {
        let f = write_tmp(&b[..cut]);
        assert!(Gguf::open(f.path()).is_err(), "truncated at {cut} parsed");
    }
}

#[test]
fn unknown_tensor_type_is_named() {
    let mut w = GgufWriter::new();
    w.tensor("t", GgmlType::F32, &[4], vec![0; 16]);
    let mut b = w.to_bytes();
    let name_pos = b.windows(1).position(|x| x == b"t").unwrap();
    let type_at = name_pos + 1 + 4 + 8; // name, n_dims u32, one dim u64
    b[type_at..type_at + 4].copy_from_slice(&77u32.to_le_bytes());
    let msg = open_err(&b);
    assert!(
        msg.contains("unknown ggml type id 77") && msg.contains("'t'"),
        "{msg}"
    );
}

#[test]
fn data_past_the_end_is_named() {
    let mut w = GgufWriter::new();
    w.tensor_f32("t", &[4], &[1., 2., 3., 4.]);
    let b = w.to_bytes();
    let msg = open_err(&b[..b.len() - 4]);
    assert!(msg.contains("runs past the end"), "{msg}");
}

#[test]
fn huge_counts_do_not_allocate() {
    let mut b = b"GGUF".to_vec();
    b.extend_from_slice(&3u32.to_le_bytes());
    b.extend_from_slice(&u64::MAX.to_le_bytes());
    b.extend_from_slice(&0u64.to_le_bytes());
    assert!(open_err(&b).contains("does not fit"));
}

/// A GGUF v3 header with no tensors and the given key/value count, then `body`.
fn header(n_kv: u64, body: &[u8]) -> Vec<u8> {
    let mut b = b"GGUF".to_vec();
    b.extend_from_slice(&3u32.to_le_bytes());
    b.extend_from_slice(&0u64.to_le_bytes());
    b.extend_from_slice(&n_kv.to_le_bytes());
    b.extend_from_slice(body);
    b
}

/// One metadata key `k` holding an array of `n` elements of type `ty`, its payload `payload`.
fn array_kv(ty: u32, n: u64, payload: &[u8]) -> Vec<u8> {
    let mut b = 1u64.to_le_bytes().to_vec();
    b.push(b'k');
    b.extend_from_slice(&9u32.to_le_bytes());
    b.extend_from_slice(&ty.to_le_bytes());
    b.extend_from_slice(&n.to_le_bytes());
    b.extend_from_slice(payload);
    b
}

#[test]
fn huge_kv_string_and_array_counts_are_refused_before_allocating() {
    assert!(open_err(&header(u64::MAX / 2, &[])).contains("metadata key/value count"));
    // A key whose length claims more bytes than the file has.
    let mut long_key = u64::MAX.to_le_bytes().to_vec();
    long_key.extend_from_slice(b"abcdefghijkl");
    assert!(open_err(&header(1, &long_key)).contains("metadata key count"));
    // An array of u32 claiming 2^40 elements in a file of a few bytes.
    let msg = open_err(&header(1, &array_kv(4, 1 << 40, &[0; 16])));
    assert!(msg.contains("array count") && msg.contains("'k'"), "{msg}");
}

#[test]
fn byte_arrays_cannot_ask_for_more_memory_than_the_file_justifies() {
    // 200 000 u8 elements fit the file byte for byte, but decode to 32 bytes each: 6.4 MB for a
    // 200 kB file, past the 8-per-byte budget.
    let n = 200_000;
    let msg = open_err(&header(1, &array_kv(0, n, &vec![7; n as usize])));
    assert!(msg.contains("more memory than a"), "{msg}");
    // Many arrays, each within the budget on its own, are charged together.
    let mut body = Vec::new();
    for i in 0..20u8 {
        let mut kv = array_kv(0, 20_000, &vec![1; 20_000]);
        kv[8] = b'a' + i; // distinct keys
        body.extend_from_slice(&kv);
    }
    let msg = open_err(&header(20, &body));
    assert!(msg.contains("more memory than a"), "{msg}");
    // A small byte array, as real files hold, still reads.
    let ok = header(1, &array_kv(0, 1000, &vec![3; 1000]));
    let g = Gguf::from_bytes("small.gguf", &ok).unwrap();
    assert_eq!(g.metadata.array_opt("k").unwrap().unwrap().len(), 1000);
}

#[test]
fn zero_hyperparameters_are_named() {
    let mut w = GgufWriter::new();
    w.meta("gemma.attention.head_count", MetaValue::U32(0));
    let f = write_tmp(&w.to_bytes());
    let g = Gguf::open(f.path()).unwrap();
    let e = g
        .metadata
        .positive("gemma.attention.head_count")
        .unwrap_err();
    assert!(
        e.to_string()
            .contains("'gemma.attention.head_count': must be at least 1, found 0"),
        "{e}"
    );
    assert!(g.metadata.positive_opt("absent").unwrap().is_none());
}

#[test]
fn a_tensor_offset_near_u64_max_is_named_without_overflow() {
    // Found by fuzzing: the error message added the offset to the data start and overflowed.
    let mut w = GgufWriter::new();
    w.tensor_f32("t", &[4], &[1., 2., 3., 4.]);
    let mut b = w.to_bytes();
    let name_pos = b.windows(1).position(|x| x == b"t").unwrap();
    let offset_at = name_pos + 1 + 4 + 8 + 4; // name, n_dims, one dim, type
    b[offset_at..offset_at + 8].copy_from_slice(&(u64::MAX - 31).to_le_bytes());
    let msg = open_err(&b);
    assert!(
        msg.contains(&format!("offset {}", u64::MAX)) && msg.contains("runs past the end"),
        "{msg}"
    );
}
